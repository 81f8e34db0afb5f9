"""A memory kept per name, bounded: names are free, so anything a node notes for every peer,
record or tokenizer a crowd can make must forget the oldest note once it holds enough."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def note_newest(notes: OrderedDict[K, V], key: K, value: V, most: int) -> None:
    """Set `key` to `value` as the newest note, and drop the oldest while more than `most` are kept."""
    notes[key] = value
    notes.move_to_end(key)
    while len(notes) > most:
        notes.popitem(last=False)
