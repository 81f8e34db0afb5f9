"""The tokenizers this node can read peers' tokens with: its own, and the built-in presets'.

A batch names its sender's tokenizer by fingerprint (policy.tokenizer_fingerprint). A batch in
our own tokenizer is read as it always was; one in another that this node knows is decoded
with that tokenizer and trained on in ours, by span (swarmnode.learn.alignment). Known today:
ours and the tiny presets' (built here in a second, when a batch first names one). A tokenizer
fetched from the hub or from its sender is not built yet; a batch in an unknown tokenizer is
left unread, which is no fault of its sender.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from swarmnode.learn.alignment import Tokenization
from swarmnode.model.policy import tokenizer_fingerprint
from swarmnode.model.tiny import TINY_PRESETS, build_tokenizer


class UnknownFamily(Exception):
    """A batch in a tokenizer this node cannot read."""

    def __init__(self, fingerprint: str) -> None:
        super().__init__(f"a tokenizer this node cannot read ({fingerprint})")
        self.fingerprint = fingerprint


@dataclass(frozen=True)
class Family:
    """One tokenizer, as reading a peer's tokens needs it."""

    fingerprint: str
    vocab_size: int
    tokenization: Tokenization


def family_of(tokenizer: PreTrainedTokenizerBase) -> Family:
    """The family of a Hugging Face tokenizer: decode keeps special tokens' text and nothing is
    cleaned up, so a decoded prefix stays a prefix of the whole (alignment.token_ends)."""

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    return Family(tokenizer_fingerprint(tokenizer), len(tokenizer), Tokenization(decode, encode, tokenizer.eos_token_id))


class Families:
    """Families by fingerprint: ours from the start, the presets' when a batch first names one
    we do not know. Our own family's vocabulary is our model's (`own_vocab_size`: its
    embedding rows, which may be more than the tokenizer's tokens, as Qwen2.5's are)."""

    def __init__(self, own: PreTrainedTokenizerBase, own_vocab_size: int | None = None) -> None:
        mine = family_of(own)
        self.own = Family(mine.fingerprint, own_vocab_size or mine.vocab_size, mine.tokenization)
        self._known: dict[str, Family] = {self.own.fingerprint: self.own}
        self._presets_built = False

    def get(self, fingerprint: str) -> Family | None:
        """The family a batch names, or None when this node cannot read it."""
        if fingerprint not in self._known and not self._presets_built:
            self._presets_built = True
            for spec in TINY_PRESETS.values():
                family = family_of(build_tokenizer(spec))
                self._known.setdefault(family.fingerprint, family)
        return self._known.get(fingerprint)
