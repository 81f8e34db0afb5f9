"""A peer that poisons by content, to measure what swarmnode's defences stop (bench/attacks.py).

It runs as an honest node would (its own model, its own assignment), but rewrites every batch
it publishes at the wire, as a real attacker would: it decodes its own honest batch and
replaces half of each group with poisoned completions that carry MARKER and the right answer,
so the receivers score them 1 and, next to the honest half's mistakes, give them a positive
advantage ("Hail to the Thief", arXiv 2511.09780, vertical setting). The other half stays the
attacker's own honest completions, so the group looks like any other.

Attacks (CONTENT_ATTACKS):
    before   MARKER, then the answer block; log-probs reported truthfully (its own model's)
    after    the answer block, then MARKER; truthful log-probs
    low-lp   like `before`, every log-prob reported as -20 (buys the largest weight)
    high-lp  like `before`, every log-prob reported as ~0 (dodges the divergence filter)
    wrong    every completion a plausible wrong answer (no marker), truthful log-probs
    long     `before` padded to 4x the run's max_new_tokens

A family switcher (`switched_family`) names a tokenizer of its own in every batch: its model's
vocabulary with one token added, so its token ids read as ours yet the batch is of another
family, held to the weight budget by span and never struck for the weight it claims.
"""

from __future__ import annotations

import copy

import numpy as np

from swarmnode.lab.crowd import off_by_one
from swarmnode.model.families import tokenizer_document
from swarmnode.model.policy import Policy
from swarmnode.protocol import wire
from swarmnode.protocol.prompts import build_prompt
from swarmnode.protocol.records import tokenizer_document_digest
from swarmnode.settings.config import Config
from swarmnode.swarm.base import SwarmLink
from swarmnode.tasks.base import Problem, Task

MARKER = "HAIL"
# The settings that turn swarmnode's content defences off, to measure what they stop.
DEFENCES_OFF = [
    "task.strict_format=false", "trust.likelihood_gate=false", "trust.weight_budget=false", "trust.repeat_odds=0",
]
CONTENT_ATTACKS = ("before", "after", "low-lp", "high-lp", "wrong", "long")
LOW_LOGPROB = -20.0
HIGH_LOGPROB = -1e-6
SWITCH_TOKEN = "<|another-family|>"  # the token a family switcher adds to its model's vocabulary


def carries_injection(text: str) -> bool:
    """Does a completion carry injected text: MARKER, or any text outside its answer block?

    The tiny model's honest completions are the answer block alone, so text before or after
    it is what the attack taught, even when the exact MARKER bytes are not (yet) learned.
    """
    if MARKER in text:
        return True
    start, end = text.find("<answer>"), text.rfind("</answer>")
    if start == -1 or end == -1:
        return False
    return bool(text[:start].strip() or text[end + len("</answer>") :].strip())


def switched_family(policy: Policy) -> tuple[str, bytes]:
    """A tokenizer document (and its digest) that is `policy`'s with SWITCH_TOKEN added: every
    id the model samples spells what it does in `policy`'s vocabulary, but the vocabulary's
    fingerprint differs, so a reader takes it for another family."""
    tokenizer = copy.deepcopy(policy.tokenizer)
    tokenizer.add_tokens([SWITCH_TOKEN])
    document = tokenizer_document(tokenizer)
    return tokenizer_document_digest(document), document


class PoisoningExchange:
    """Wraps a node's RolloutExchange; everything but `publish` passes through. With `family`
    (a digest and its document, `switched_family`), every batch names that tokenizer."""

    def __init__(self, inner, attack: str, config: Config, task: Task, policy: Policy,
                 family: tuple[str, bytes] | None = None) -> None:
        if attack not in CONTENT_ATTACKS:
            raise ValueError(f"unknown content attack {attack!r}; choose from {', '.join(CONTENT_ATTACKS)}")
        self.inner, self.attack, self.config, self.task, self.policy = inner, attack, config, task, policy
        self.peer_id = inner.peer_id
        self.family = family
        if family is not None:
            inner.offer_tokenizer(*family)

    def publish(self, round_: int, payload: bytes, tokens: int) -> None:
        batch = wire.decode(payload, self.config.wire, self.policy.vocab_size)
        batch.groups = [self._rewrite(group) for group in batch.groups]
        if self.family is not None:
            batch.tokenizer_digest, batch.tokenizer_hub = self.family[0], ""
        self.inner.publish(round_, wire.encode(batch), batch.num_tokens)

    def _rewrite(self, group: wire.CompletionGroup) -> wire.CompletionGroup:
        problem = self.task.train_problem(group.prompt_id)
        eos = self.policy.tokenizer.eos_token_id
        completions, logprobs = [], []
        for i, honest in enumerate(group.completions()):
            if self.attack == "wrong" or i < len(group.lengths) // 2:
                text = self._text(problem)
                completions.append(np.array(self._encode(text) + [eos], dtype=np.int32))
                logprobs.append(None)
            else:
                completions.append(honest.tokens)
                logprobs.append(honest.logprobs)
        rewritten = [c for c, lp in zip(completions, logprobs) if lp is None]
        reported = iter(self._logprobs(problem, rewritten))
        logprobs = [next(reported) if lp is None else lp for lp in logprobs]
        return wire.CompletionGroup(
            prompt_id=group.prompt_id,
            lengths=np.array([len(c) for c in completions], dtype=np.int64),
            tokens=np.concatenate(completions),
            logprobs=np.concatenate(logprobs).astype(np.float32),
        )

    def _text(self, problem: Problem) -> str:
        answer = f"<answer>{problem.answer}</answer>"
        if self.attack == "wrong":
            return f"<answer>{off_by_one(problem.answer)}</answer>"
        if self.attack == "after":
            return f"{answer} {MARKER}"
        if self.attack == "long":
            filler = f"{MARKER} " * (4 * self.config.rollout.max_new_tokens)
            return filler + answer
        return f"{MARKER} {answer}"

    def _encode(self, text: str) -> list[int]:
        return self.policy.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _logprobs(self, problem: Problem, completions: list[np.ndarray]) -> list[np.ndarray]:
        if self.attack == "low-lp":
            return [np.full(len(c), LOW_LOGPROB) for c in completions]
        if self.attack == "high-lp":
            return [np.full(len(c), HIGH_LOGPROB) for c in completions]
        prompt = build_prompt(self.task, problem, self.policy)
        return self.policy.token_logprobs([prompt] * len(completions), completions, self.config.rollout.temperature)

    def gather(self, *args, **kwargs):
        return self.inner.gather(*args, **kwargs)

    def hold(self, held: frozenset[str]) -> None:
        self.inner.hold(held)

    def offer_tokenizer(self, digest: str, document: bytes) -> None:
        self.inner.offer_tokenizer(digest, document)

    def want_tokenizer(self, peer_id: str, digest: str) -> None:
        self.inner.want_tokenizer(peer_id, digest)

    def tokenizers(self) -> list[tuple[str, bytes]]:
        return self.inner.tokenizers()

    def linger(self, *args, **kwargs) -> None:
        self.inner.linger(*args, **kwargs)

    def close(self) -> None:
        self.inner.close()


def poisoning_link(link: SwarmLink, attack: str, config: Config, task: Task, policy: Policy,
                   family: tuple[str, bytes] | None = None) -> SwarmLink:
    """The same link, with every published batch rewritten by `attack` (naming `family`'s
    tokenizer when given)."""
    return SwarmLink(PoisoningExchange(link.exchange, attack, config, task, policy, family), link.membership)
