"""The tokenizers this node can read peers' tokens with, and the document a tokenizer crosses
the wire as.

A batch names its sender's tokenizer by the digest of its tokenizer document
(`tokenizer_document`: the fast tokenizer's JSON and its end-of-sequence id, nothing that runs
code), so the name is content-addressed: whoever serves the document, its bytes either hash to
the name or are refused. A node knows its own document, the built-in presets' (built here in a
second, when a batch first names one it does not know) and the documents it fetched from the
peers that named them (swarmnode.swarm.tokenizer_wants says which, and when). A loaded
document whose vocabulary and EOS are ours (the same tokenizer, serialised by another version
of the tokenizers library) is read as ours; any other is another family: its tokens are
decoded with it and trained on in ours, by span (swarmnode.learn.alignment). A batch in a
digest this node does not know yet is left unread, which is no fault of its sender.
"""

from __future__ import annotations

import logging
import zlib
from collections import OrderedDict
from dataclasses import dataclass

import msgpack
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from swarmnode.bounded import note_newest
from swarmnode.learn.alignment import Tokenization
from swarmnode.model.policy import tokenizer_fingerprint
from swarmnode.model.tiny import TINY_PRESETS, build_tokenizer
from swarmnode.protocol.records import MAX_TOKENIZER_DOCUMENT_BYTES, tokenizer_document_digest

log = logging.getLogger(__name__)

MAX_JSON_BYTES = 64 << 20  # its JSON once decompressed (Qwen2.5's is 7 MiB, Gemma 3's 33): a small document
# cannot unpack into unbounded memory
MAX_VOCABULARY = 1 << 20  # tokens in a peer's tokenizer (the largest real ones have about 260,000)
MAX_FAMILIES = 16  # families learned from peers kept at once; the least recently read makes way for a new one
MAX_UNREADABLE = 1024  # digests remembered as no tokenizer (past that, a junk digest may be fetched again)


class UnknownFamily(Exception):
    """A batch in a tokenizer this node cannot read (yet)."""

    def __init__(self, digest: str, hub: str = "") -> None:
        super().__init__(f"a tokenizer this node cannot read ({digest[:16]})")
        self.digest = digest
        self.hub = hub  # the hub id the batch says it came from: a hint (swarmnode.model.hub_tokenizers)


class BadTokenizer(ValueError):
    """A tokenizer document that is not one this node can load."""


@dataclass(frozen=True)
class Family:
    """One tokenizer, as reading a peer's tokens needs it. `digest` names its document on the
    wire; `fingerprint` its vocabulary (what token ids mean), shown by `status`."""

    digest: str
    fingerprint: str
    vocab_size: int
    tokenization: Tokenization


def tokenizer_document(tokenizer: PreTrainedTokenizerBase) -> bytes:
    """The tokenizer as it crosses the wire: its fast tokenizer's JSON (zlib, a third the size)
    and its end-of-sequence id, packed with msgpack. BadTokenizer for a tokenizer without a
    fast (JSON) form, which peers of other families could not load."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise BadTokenizer(f"{type(tokenizer).__name__} has no fast tokenizer to send to peers")
    return msgpack.packb({"json": zlib.compress(backend.to_str().encode(), 6), "eos": tokenizer.eos_token_id})


def tokenizer_from_document(document: bytes) -> PreTrainedTokenizerFast:
    """Load a peer's tokenizer document, within MAX_TOKENIZER_DOCUMENT_BYTES and MAX_JSON_BYTES; only
    JSON is parsed (no remote code, no pickle). BadTokenizer when it is not a tokenizer."""
    if len(document) > MAX_TOKENIZER_DOCUMENT_BYTES:
        raise BadTokenizer(f"a tokenizer document of {len(document)} bytes (at most {MAX_TOKENIZER_DOCUMENT_BYTES})")
    try:
        fields = msgpack.unpackb(document, raw=False, max_bin_len=MAX_TOKENIZER_DOCUMENT_BYTES, max_map_len=2,
                                 max_str_len=8, max_array_len=0, max_ext_len=0)
        if not isinstance(fields, dict) or set(fields) != {"json", "eos"} or not isinstance(fields["json"], bytes):
            raise BadTokenizer("a tokenizer document is a map of 'json' (bytes) and 'eos'")
        eos = fields["eos"]
        if eos is not None and not (isinstance(eos, int) and not isinstance(eos, bool) and 0 <= eos < MAX_VOCABULARY):
            raise BadTokenizer(f"end-of-sequence id {eos!r} is not a token id")
        unpacker = zlib.decompressobj()
        text = unpacker.decompress(fields["json"], MAX_JSON_BYTES)
        if unpacker.unconsumed_tail or not unpacker.eof:
            raise BadTokenizer(f"a tokenizer's JSON beyond {MAX_JSON_BYTES} bytes, or cut short")
        backend = Tokenizer.from_str(text.decode())
        if backend.get_vocab_size(with_added_tokens=True) > MAX_VOCABULARY:
            raise BadTokenizer(f"a vocabulary beyond {MAX_VOCABULARY} tokens")
        if eos is not None and backend.id_to_token(eos) is None:
            raise BadTokenizer(f"end-of-sequence id {eos} is not in the vocabulary")
        return PreTrainedTokenizerFast(
            tokenizer_object=backend, eos_token=None if eos is None else backend.id_to_token(eos)
        )
    except BadTokenizer:
        raise
    except Exception as err:  # msgpack, zlib, the tokenizers parser, UTF-8: each says what in its own way
        raise BadTokenizer(f"not a tokenizer: {type(err).__name__}: {str(err)[:200]}") from None


def family_of(tokenizer: PreTrainedTokenizerBase, digest: str = "") -> Family:
    """The family of a Hugging Face tokenizer: decode keeps special tokens' text and nothing is
    cleaned up, so a decoded prefix stays a prefix of the whole (alignment.token_ends).
    `digest` names its document (computed here when not given)."""

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    name = digest or tokenizer_document_digest(tokenizer_document(tokenizer))
    return Family(name, tokenizer_fingerprint(tokenizer), len(tokenizer), Tokenization(decode, encode, tokenizer.eos_token_id))


class Families:
    """Families by the digest a batch names: ours from the start, the presets' when a batch
    first names one we do not know, and those learned from documents peers served. Our own
    family's vocabulary is our model's (`own_vocab_size`: its embedding rows, which may be more
    than the tokenizer's tokens, as Qwen2.5's are); `own_hub` the hub id it came from, which our
    batches name beside the digest ("" for none)."""

    def __init__(self, own: PreTrainedTokenizerBase, own_vocab_size: int | None = None, presets: bool = True,
                 own_hub: str = "") -> None:
        try:
            self.own_document: bytes | None = tokenizer_document(own)
            digest = tokenizer_document_digest(self.own_document)
        except BadTokenizer as err:  # no fast form: peers of other families cannot read ours, we still read theirs
            log.warning("%s: peers of other tokenizer families will not read this node's batches", err)
            self.own_document = None
            digest = tokenizer_document_digest(tokenizer_fingerprint(own).encode())
        self.own_hub = own_hub if self.own_document is not None else ""
        mine = family_of(own, digest)
        self.own = Family(mine.digest, mine.fingerprint, own_vocab_size or mine.vocab_size, mine.tokenization)
        self._known: dict[str, Family] = {self.own.digest: self.own}  # ours and the presets'
        self._learned: OrderedDict[str, Family] = OrderedDict()  # from peers' documents, least recently read first
        self._presets_built = not presets
        self.unreadable: set[str] = set()  # digests whose document was no tokenizer
        self.learned = 0  # documents learned from peers so far

    def get(self, digest: str) -> Family | None:
        """The family a batch names, or None when this node cannot read it (yet)."""
        if digest in self._learned:
            self._learned.move_to_end(digest)
            return self._learned[digest]
        if digest not in self._known and not self._presets_built:
            self._presets_built = True
            for spec in TINY_PRESETS.values():
                family = family_of(build_tokenizer(spec))
                self._known.setdefault(family.digest, family)
        return self._known.get(digest)

    def is_own(self, family: Family) -> bool:
        """Token ids that mean what ours do: read as ours, no translation."""
        return family.fingerprint == self.own.fingerprint

    def learn(self, digest: str, document: bytes) -> Family | None:
        """The family of a document a peer served for `digest` (the caller checked its hash);
        None, and the digest not asked for again, when it is no tokenizer
        (`unreadable`, at most MAX_UNREADABLE remembered). A document of our own vocabulary and
        EOS reads as our own family. At most MAX_FAMILIES are kept: the least recently read
        makes way, so a crowd's families never lock a real one out (it may be fetched again)."""
        known = self.get(digest)
        if known is not None:
            return known
        try:
            family = family_of(tokenizer_from_document(document), digest)
        except BadTokenizer:
            if len(self.unreadable) < MAX_UNREADABLE:
                self.unreadable.add(digest)
            return None
        self.learned += 1
        if self.is_own(family):
            family = Family(digest, self.own.fingerprint, self.own.vocab_size, self.own.tokenization)
        note_newest(self._learned, digest, family, MAX_FAMILIES)
        return family
