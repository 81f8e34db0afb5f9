"""How much a peer's samples count for how their gradient agrees with ours (node.weight_by_agreement).

Each step measures, over a probe of the model (learn.agreement), the cosine of each peer's
gradient with our own samples' and that of our own samples' two halves: the yardstick, since
RL's gradient noise keeps two batches of our own on-policy samples far from agreeing fully. A
peer's samples count its running cosine over the yardstick's running cosine, between FLOOR and
1. A copy of our model agrees with all our samples about twice as well as our halves agree with
each other (measured on the tiny bench: 0.07-0.11 against 0.02-0.05; each half has half the
samples, hence more noise), so it counts fully even through the noise of the running means; a far
peer's samples, which pull elsewhere, count less (the addition specialist at tiny: 0.2-0.5), down
to FLOOR (not 0: its samples keep being measured, and a peer that comes nearer is seen to).

One step's cosines are noisy (a few hundredths, of the order of their own size), so the running
means move slowly (RUNNING_WEIGHT) and a peer counts 1 until measured in MEASURED_ROUNDS steps:
as every peer does with the weighting off. The factor only ever shrinks a peer's importance
weights, so no identity, fresh or old, weighs more through it than without it.
"""

from __future__ import annotations

from swarmnode.learn.agreement import StepAgreement

FLOOR = 0.1  # the least a measured peer's samples count
RUNNING_WEIGHT = 0.05  # how far one step moves a running cosine: about the last 20 steps count
MEASURED_ROUNDS = 10  # steps a peer is measured in before its factor applies


class AgreementWeights:
    """Per-peer factors on importance weights from running gradient agreement with our own."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.own_halves: float | None = None  # running cosine of our own two halves: the yardstick
        self.peers: dict[str, float] = {}  # peer -> running cosine of its gradient with ours
        self.measured: dict[str, int] = {}  # peer -> steps it was measured in

    def observe(self, step: StepAgreement | None) -> None:
        """Move the running cosines toward one step's, each as fast as a peer's standing moves."""
        if not self.enabled or step is None:
            return
        if step.own_halves is not None:
            self.own_halves = _moved(self.own_halves, step.own_halves)
        for peer, found in step.peers.items():
            self.peers[peer] = _moved(self.peers.get(peer), found)
            self.measured[peer] = self.measured.get(peer, 0) + 1

    def forget(self, peer_id: str) -> None:
        """The peer was forgotten (loop.ledger.forget_silent): it is measured afresh."""
        self.peers.pop(peer_id, None)
        self.measured.pop(peer_id, None)

    def factor(self, peer_id: str) -> float:
        """What each of the peer's samples counts, in [FLOOR, 1]; 1 when off, before MEASURED_ROUNDS
        measurements, or while our own halves do not agree (no yardstick to hold a peer to)."""
        found = self.peers.get(peer_id)
        if not self.enabled or found is None or self.measured.get(peer_id, 0) < MEASURED_ROUNDS:
            return 1.0
        if not self.own_halves or self.own_halves <= 0:
            return 1.0
        return min(1.0, max(FLOOR, found / self.own_halves))


def _moved(running: float | None, found: float) -> float:
    return found if running is None else running + RUNNING_WEIGHT * (found - running)
