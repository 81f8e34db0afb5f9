"""The round clock: which round this node works on, moved ahead only on evidence.

Peers ignore batches older than their staleness window, so a node that fell behind (a restart,
a late join) must catch up to the swarm's round. Heartbeat rounds are claims and identities are
free, so a claim only tells the clock where to look: it fetches the claimant's batch of the
round before the one it claims (a probe, in the background, never holding up a round) and
checks it like any batch it trains on. The clock jumps only to the lower median of the rounds
that live peers proved with valid batches, by at most `node.max_catch_up` rounds at once.

So identities that deliver nothing cannot move it, one liar that does deliver is outvoted by
any honest peer, and a claim that its claimant cannot back with a batch, twice, is counted
against it in the ledger; so is a peer that delivers round d while claiming a round far past d.
"""

from __future__ import annotations

import concurrent.futures
import logging
import statistics
from collections import Counter
from collections.abc import Callable

from swarmnode.config import Config
from swarmnode.records import Heartbeat
from swarmnode.swarm.base import Membership, ProbeResult, Received, RolloutExchange
from swarmnode.swarm.ledger import PeerLedger

log = logging.getLogger(__name__)

PROBE_COOLDOWN_ROUNDS = 5  # a peer's claims are probed at most this often
PROBES_AT_ONCE = 4
UNBACKED_TO_REJECT = 2  # probes in a row without a valid batch before a claim counts as a lie
CLAIM_SLACK_ROUNDS = 2  # a claim may run this far past a delivery (heartbeats and rounds race)

Verify = Callable[[Received], object]  # raises on a batch this node would not train on


class RoundClock:
    def __init__(
        self,
        config: Config,
        membership: Membership,
        exchange: RolloutExchange,
        ledger: PeerLedger,
        verify: Verify,
        note: Callable[[str], None] = log.info,
    ) -> None:
        self.staleness = config.node.staleness
        self.max_catch_up = config.node.max_catch_up
        self.probe_timeout_s = min(config.swarm.fetch_timeout_s, 10.0)
        self.membership = membership
        self.exchange = exchange
        self.ledger = ledger
        self.verify = verify
        self.note = note
        self._probe: concurrent.futures.Future | None = None
        self._probed: dict[str, int] = {}  # peer -> round at which its claim was last probed
        self._unbacked: Counter[str] = Counter()
        self.jumps = 0

    def next_round(self, round_: int) -> int:
        """The round to work on next, given that `round_` is next in line."""
        live = self._live()
        self._collect_probe()
        self._maybe_probe(round_, live)
        target = self._proven_target(live)
        if target is None or target - round_ <= self.staleness:
            return round_
        jump_to = min(target, round_ + self.max_catch_up)
        self.jumps += 1
        self.note(f"peers proved round {target - 1} with valid batches: catching up from round {round_} to {jump_to}")
        return jump_to

    def check_claims(self, delivered: dict[str, int]) -> None:
        """Count peers whose claimed round runs far past the round they just delivered."""
        live = self._live()
        for peer, round_ in delivered.items():
            claim = live.get(peer)
            if claim is not None and claim.round > round_ + self.staleness + CLAIM_SLACK_ROUNDS:
                self.ledger.reject(peer, f"claims round {claim.round} while delivering round {round_}")

    # -- evidence ----------------------------------------------------------------------------

    def _live(self) -> dict[str, Heartbeat]:
        return {p: hb for p, hb in self.membership.live_peers().items() if not self.ledger.is_banned(p)}

    def _proven_target(self, live: dict[str, Heartbeat]) -> int | None:
        """One past the lower median of the rounds live peers proved; None without proofs."""
        proven = [r for p in live if (r := self.ledger.proven_round(p)) is not None]
        return statistics.median_low(proven) + 1 if proven else None

    def _maybe_probe(self, round_: int, live: dict[str, Heartbeat]) -> None:
        if self._probe is not None:
            return
        ahead = [
            (hb.round, peer) for peer, hb in live.items()
            if hb.round - round_ > self.staleness
            and round_ - self._probed.get(peer, -PROBE_COOLDOWN_ROUNDS) >= PROBE_COOLDOWN_ROUNDS
        ]
        ahead.sort(key=lambda claim: (not self.ledger.earned(claim[1]), -claim[0]))
        wanted = {peer: claimed - 1 for claimed, peer in ahead[:PROBES_AT_ONCE]}
        if wanted:
            for peer in wanted:
                self._probed[peer] = round_
            self._probe = self.exchange.probe(wanted, self.probe_timeout_s)

    def _collect_probe(self) -> None:
        if self._probe is None or not self._probe.done():
            return
        future, self._probe = self._probe, None
        try:
            results: list[ProbeResult] = future.result()
        except Exception as err:  # a failed probe proves nothing either way
            log.debug("probe failed: %s", err)
            return
        for peer, round_, payload in results:
            self._judge(peer, round_, payload)

    def _judge(self, peer: str, round_: int, payload: bytes | None) -> None:
        reason = "no batch"
        if payload is not None:
            try:
                self.verify(Received(peer, round_, payload))
            except ValueError as err:  # WireError and other checks
                reason = str(err)
            else:
                self.ledger.delivered(peer, round_)
                self._unbacked.pop(peer, None)
                return
        self._unbacked[peer] += 1
        if self._unbacked[peer] >= UNBACKED_TO_REJECT:
            self._unbacked.pop(peer)
            self.ledger.reject(peer, f"claims to be past round {round_} but shows no valid batch of it ({reason})")
