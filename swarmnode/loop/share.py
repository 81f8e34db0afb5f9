"""How much of its own batch a node generates: more when peers' samples are far from its model.

With `node.own_share` below 1 a node generates that share of its batch and peers' groups fill
the rest. That pays while peers' samples are close to what this node would have sampled; far
off-policy ones taught a member less than its own (docs/figures.md, "Does it pay?"). With
`node.adapt_share_nats` set, the share rises from `own_share` to 1 as peers' samples become
less likely under this node's model than its own samples are.

The measure is the node's own: the mean log-likelihood a token of its own samples has under its
model (at generation) minus that of the peers' samples it screened (under its model, computed
here). Nothing a peer claims enters it, and it only moves the share between `own_share` and 1,
so the worst a peer can do with it is make this node generate its whole batch, as alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from swarmnode.settings.config import Config

SMOOTHING = 0.2  # weight of the newest round in the running gap: a few rounds, not one batch


class AdaptiveShare:
    """The share of the batch this node generates, from the running likelihood gap."""

    def __init__(self, config: Config) -> None:
        self.floor = config.node.own_share
        self.full_gap = config.node.adapt_share_nats  # 0: off
        self.gap: float | None = None  # nats a token, smoothed over rounds

    @property
    def enabled(self) -> bool:
        return self.full_gap > 0 and self.floor < 1.0

    def current(self) -> float:
        """own_share while peers' samples are as likely as our own, 1 once they are full_gap
        nats a token less likely, linear between."""
        if not self.enabled or self.gap is None:
            return self.floor
        rise = min(1.0, max(0.0, self.gap / self.full_gap))
        return self.floor + (1.0 - self.floor) * rise

    def observe(self, own_logprobs: Sequence[np.ndarray], peer_logprobs: Sequence[np.ndarray]) -> None:
        """One round's evidence: per-token log-probs under our model of our own samples (as
        generated) and of the peers' samples screened. A round without either changes nothing."""
        own, peers = _token_mean(own_logprobs), _token_mean(peer_logprobs)
        if own is None or peers is None:
            return
        gap = own - peers
        self.gap = gap if self.gap is None else (1 - SMOOTHING) * self.gap + SMOOTHING * gap

    def checkpoint_state(self) -> dict[str, Any]:
        """What a resumed node keeps (swarmnode.loop.checkpoints): the running gap."""
        return {"likelihood_gap": self.gap}

    def restore(self, state: dict[str, Any]) -> None:
        self.resume(state.get("likelihood_gap"))

    def resume(self, gap: float | None) -> None:
        """The running gap of a checkpoint (None: none measured yet)."""
        self.gap = None if gap is None or not np.isfinite(gap) else float(gap)


def _token_mean(logprobs: Sequence[np.ndarray]) -> float | None:
    tokens = sum(len(x) for x in logprobs)
    if not tokens:
        return None
    mean = float(sum(float(np.sum(x)) for x in logprobs) / tokens)
    return mean if np.isfinite(mean) else None
