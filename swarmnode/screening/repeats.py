"""Whether a peer samples its groups, as it claims, or picks them: its repeats against its own log-probs.

A sender reports, for every completion, the log-prob its sampler gave it (after temperature,
top-k and top-p: what it sampled from). A completion of probability q turns up in a group of G
independent samples about G q times. Text that was written or picked rather than sampled
repeats more often than that: a crowd with no model that sends the public task's right answer
four times and a near miss four times claims, truthfully, that the public base model gives each
a few per cent, and then shows each four times in eight. No single group proves much (on tiny,
half of such groups have odds above 0.1), but the crowd sends them every round.

So each group a peer delivers gives its odds, the binomial upper tail of its most frequent
repeat under its sender's own claims (`repeat_odds`), and the node keeps, per peer, the evidence
against "it samples": a CUSUM of the e-values 1 / (2 sqrt(odds)) (each has mean at most 1 for
an honest sampler, so the sum of their logs drifts down by about 0.5 a group; a group that
repeats nothing adds log 1/2). While a peer's evidence is beyond 1 / `trust.repeat_odds`, its
groups are left out and teach it no standing; a false alarm comes on average after more than
1 / `trust.repeat_odds` of an honest sampler's groups (Lorden's bound for a CUSUM). It is not
a strike: the test is one of chance, however small, and evidence falls again with groups that
repeat as sampling does.

Every delivered group counts, not only those screened: the test needs nothing but the sender's
tokens and claims, and a crowd of many identities is found in each one's first batch, not after
a dozen of its groups were trained on. A sender that pads its written groups with sampled ones
can hold its evidence down; the node takes a peer's groups of a round in its own random order
(loop.intake), so what it trains on of such a sender is as padded as what it sent.

Lying about the log-probs to pass costs the liar its weight: a completion claimed likely has an
importance weight min(pi_theta / pi_gen, C) that shrinks as the claim grows. REPEAT_SLACK_NATS
allows for log-probs rounded on a GPU.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import binom

from swarmnode.protocol.wire import Completion

REPEAT_SLACK_NATS = 1.0  # a repeated completion is tested as if e^1 times likelier than its sender claims
MAX_TRACKED = 4096  # peers with evidence kept; beyond it the weakest is forgotten (identities are free)


def repeat_odds(group: Sequence[Completion]) -> float:
    """The chance, under the sender's own log-probs, of repeats as frequent as this group's
    (its completions in the sender's tokens, with its claims): the smallest binomial upper
    tail over its repeated completions, times how many it tested (at most 1). 1 for a group
    that repeats nothing."""
    claims: dict[bytes, list[float]] = defaultdict(list)
    for completion in group:
        claims[np.asarray(completion.tokens).tobytes()].append(float(np.sum(completion.logprobs, dtype=np.float64)))
    size = len(group)
    tails = []
    for claimed in claims.values():
        if len(claimed) < 2:
            continue
        logq = min(0.0, max(claimed) + REPEAT_SLACK_NATS)  # the copies' most generous claim
        tails.append(float(binom.sf(len(claimed) - 1, size, math.exp(logq))))
    return min(1.0, min(tails) * len(tails)) if tails else 1.0


def log_e_value(odds: float) -> float:
    """log of the e-value 1 / (2 sqrt(odds)): its mean is at most 1 when `odds` is a valid
    p-value, as the binomial tail of an honest sampler's group is."""
    return -math.log(2.0) - 0.5 * math.log(max(odds, 1e-300))


class RepeatEvidence:
    """Per peer, the evidence (a CUSUM of log e-values) that it picks its completions."""

    def __init__(self, odds: float) -> None:
        self.bound = math.log(1.0 / odds) if odds > 0 else math.inf
        self.evidence: dict[str, float] = {}  # peer -> log evidence, > 0 (0: not kept)

    def observe(self, peer: str, group: Sequence[Completion]) -> None:
        """One group `peer` delivered."""
        if math.isinf(self.bound):
            return
        value = max(0.0, self.evidence.get(peer, 0.0) + log_e_value(repeat_odds(group)))
        if value > 0:
            self.evidence[peer] = value
            if len(self.evidence) > MAX_TRACKED:
                del self.evidence[min(self.evidence, key=self.evidence.__getitem__)]
        else:
            self.evidence.pop(peer, None)

    def picking(self, peer: str) -> bool:
        """Whether the peer's groups are left out now: its evidence is beyond the bound."""
        return self.evidence.get(peer, 0.0) >= self.bound

    def checkpoint_state(self) -> dict[str, Any]:
        return {"repeat_evidence": dict(self.evidence)}

    def restore(self, state: dict[str, Any]) -> None:
        kept = state.get("repeat_evidence") or {}
        self.evidence = {str(peer): float(value) for peer, value in kept.items() if float(value) > 0}
