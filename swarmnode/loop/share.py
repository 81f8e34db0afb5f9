"""How much of its own batch a node generates: more in place of far peers' groups.

With `node.own_share` below 1 a node generates that share of its batch and peers' groups fill
the rest. That pays while peers' samples teach the node what its own would have; a far peer's
taught a member nothing step for step, while the member's own batch was halved to make room for
them (docs/figures.md, "What a peer's samples are worth"). With `node.adapt_share_nats` set, the
node measures each peer's *gap*: how many nats a token less likely that peer's samples are under
this node's model than its own samples are (a running mean a peer). A peer whose gap reaches
the setting is far: its groups take no room in the step, and the node generates in their place
the part of the peers' share that far peers' groups made up among the groups offered in the last
round, from `own_share` up to the whole batch (alone). With `node.far_room` near it generates
nothing more: near peers' groups fill what they can of that room and the rest stays empty, a
smaller step whose price is only its training.

One group of each far peer a round is still measured under our model (not trained on), so a
peer that comes near is taken again: once its gap falls below half the setting. One group is a
noisy measure, and with a single threshold a far peer's gap dipped under it in a tenth to a fifth
of rounds, each costing a round with half a batch of far samples (the band damps that).

The measure is the node's own: nothing a peer claims enters it, and it only moves the share
between `own_share` and 1, so the worst a crowd of far identities can do with it is make this
node generate its whole batch, as alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from swarmnode.settings.config import Config

SMOOTHING = 0.2  # weight of the newest round in a peer's running gap: a few rounds, not one batch
RETURN_FRACTION = 0.5  # a far peer is near again once its gap falls below this part of the setting
MAX_PEERS_MEASURED = 1024  # gaps kept, least recently measured forgotten first: identities are free


class AdaptiveShare:
    """The share of the batch this node generates, from each peer's running likelihood gap."""

    def __init__(self, config: Config) -> None:
        self.floor = config.node.own_share
        self.far_gap = config.node.adapt_share_nats  # 0: off
        self.generate_far_room = config.node.far_room == "own"  # else near peers' groups only, or nothing
        self.gaps: dict[str, float] = {}  # peer -> nats a token, smoothed over rounds
        self.far: set[str] = set()  # peers whose gap reached the setting and has not fallen back
        self.far_part = 0.0  # of the peers' groups offered in the last round, the part from far peers
        self.measured_last: list[str] = []  # peers measured in the last round, for its record

    @property
    def enabled(self) -> bool:
        return self.far_gap > 0 and self.floor < 1.0

    @property
    def gap(self) -> float | None:
        """The largest running gap among the peers measured in the last round (the farthest peer
        seen now, not the farthest ever), for the round's record; None when none was measured."""
        gaps = [self.gaps[peer] for peer in self.measured_last if peer in self.gaps]
        return max(gaps) if gaps else None

    def is_far(self, peer_id: str) -> bool:
        """Whether the peer's groups take no room: its running gap reached the setting and has
        not fallen below the band since. A peer not measured yet is near (its first groups are
        screened like anyone's)."""
        return self.enabled and peer_id in self.far

    def far_peers(self) -> set[str]:
        """The peers whose groups take no room now (none when the rule is off)."""
        return set(self.far) if self.enabled else set()

    def current(self) -> float:
        """own_share, raised by the part of the peers' share that far peers' groups filled
        (`node.far_room` own; with near, own_share: that part is left to near peers' groups)."""
        if not self.enabled or not self.generate_far_room:
            return self.floor
        return self.floor + (1.0 - self.floor) * self.far_part

    def offered(self, senders: Iterable[str]) -> None:
        """The sender of each peer group that would fill the peers' share at `own_share`, in the
        order the share takes them: the next round generates in place of the far ones' part.
        Only that room counts, so a peer that offers more groups, or a useless one whose groups
        come last, does not move the share by offering. No offer leaves the share where it was."""
        senders = list(senders)
        if self.enabled and senders:
            self.far_part = sum(self.is_far(peer) for peer in senders) / len(senders)

    def observe(self, own_logprobs: Sequence[np.ndarray], peers: Mapping[str, Sequence[np.ndarray]]) -> None:
        """One round's evidence: per-token log-probs under our model, untruncated, of our own
        samples and of each peer's samples measured this round. A round without our own
        samples, or a peer without finite ones, changes nothing for it."""
        own = _token_mean(own_logprobs)
        self.measured_last = []
        if own is None:
            return
        for peer, logprobs in peers.items():
            theirs = _token_mean(logprobs)
            if theirs is None:
                continue
            found, before = own - theirs, self.gaps.get(peer)
            gap = found if before is None else (1 - SMOOTHING) * before + SMOOTHING * found
            self.gaps.pop(peer, None)  # to the end: most recently measured
            self.gaps[peer] = gap
            self.measured_last.append(peer)
            self._classify(peer, gap)
        self._forget_beyond_bound()

    def _forget_beyond_bound(self) -> None:
        """The least recently measured peers beyond MAX_PEERS_MEASURED: measured afresh if they offer again."""
        while len(self.gaps) > MAX_PEERS_MEASURED:
            forgotten = next(iter(self.gaps))
            del self.gaps[forgotten]
            self.far.discard(forgotten)

    def _classify(self, peer: str, gap: float) -> None:
        if gap >= self.far_gap:
            self.far.add(peer)
        elif gap < RETURN_FRACTION * self.far_gap:
            self.far.discard(peer)

    def checkpoint_state(self) -> dict[str, Any]:
        """What a resumed node keeps (swarmnode.loop.checkpoints): each peer's running gap and
        the far part of the last offer. Which peers are far follows from the gaps, except inside
        the band, so the far ones are kept by name."""
        return {"likelihood_gaps": dict(self.gaps), "far_peers": sorted(self.far), "far_part": self.far_part}

    def restore(self, state: dict[str, Any]) -> None:
        """A checkpoint's gaps; one written before gaps were kept a peer (a single pooled
        `likelihood_gap`) is measured afresh; one written before the band is classed by its gaps."""
        gaps = state.get("likelihood_gaps")
        gaps = gaps if isinstance(gaps, dict) else {}
        self.gaps = {str(p): float(g) for p, g in gaps.items() if _is_number(g) and np.isfinite(g)}
        far = state.get("far_peers")
        listed = {p for p in far if isinstance(p, str)} if isinstance(far, list) else set()
        self.far = set()
        for peer, gap in self.gaps.items():
            if peer in listed:  # inside the band it stays far
                if gap >= RETURN_FRACTION * self.far_gap:
                    self.far.add(peer)
            else:
                self._classify(peer, gap)
        self._forget_beyond_bound()
        part = state.get("far_part", 0.0)
        self.far_part = float(part) if _is_number(part) and 0.0 <= part <= 1.0 else 0.0


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _token_mean(logprobs: Sequence[np.ndarray]) -> float | None:
    tokens = sum(len(x) for x in logprobs)
    if not tokens:
        return None
    mean = float(sum(float(np.sum(x)) for x in logprobs) / tokens)
    return mean if np.isfinite(mean) else None
