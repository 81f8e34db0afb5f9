"""PeerLedger: what this node has verified about each peer, and the verdicts that follow.

Identities are free and heartbeats are claims, so a peer weighs only by what it delivered: a
batch this node fetched, decoded and checked itself. The ledger keeps, per peer, its bad data
(from the exchange's transport checks and the node's content checks, adding up to one ban
after `max_rejects`), its verified batches, how many rounds in a row it failed to deliver
while waited for, and how useful its samples were. Lag is never bad data. From that:

- who is waited for (`expected`): peers that delivered before and have not missed
  `max_missed` rounds in a row; a peer that never delivered costs no waiting at all (how
  long a round waits is the node's own: swarmnode.loop.waiting);
- whom the exchange asks directly for new batches (`known`): peers that delivered before,
  however late, unless they cut a download since or were banned;
- in which order peers share a batch (`standing`): how useful their screened samples were,
  once there are enough of them to tell (USELESS_AFTER).
- whether the near newcomers, all of them as one, teach (`newcomers_idle`): a crowd can renew
  its identities before any of them is judged, so the newcomers' turns shrink once USELESS_AFTER
  more of their samples taught nothing than taught;
- whom to forget (`forget_silent`): a name that never taught and has done nothing here for
  SILENT_ROUNDS of our rounds, and past MAX_SILENT_TAUGHT such names that did teach, those that
  taught last. Names are free, so a crowd that keeps making new ones would otherwise grow the
  ledger (and every walk of it) without end; a forgotten name gets nothing a fresh one would
  not, banned or useless as it was.

The round loop writes it; the exchange reads it and reports transport faults to it from the
swarm's thread, through the declared view swarmnode.swarm.base.PeerStanding. Every method
takes the one lock, so a read never sees a record half written nor a dict that grows under it.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from swarmnode.screening.usefulness import STANDING_WEIGHT
from swarmnode.settings.config import SwarmSettings

log = logging.getLogger(__name__)

# screened samples, none of them useful, before a peer counts as useless (four groups of 8): one
# group often teaches nothing while the model knows little, and a peer judged on it waits for
# probation, a turn a crowd of useless identities contests (docs/security.md)
USELESS_AFTER = 32
# our rounds a name may do nothing here (deliver, be screened, missed, cut, rejected) before it
# is forgotten: well past HOLD_ROUNDS (swarmnode.loop.pool), the longest an unheard newcomer
# waits to be fetched again, so a peer that delivers at least that often is never forgotten
# between its batches (one slower that never taught us comes back as a newcomer would)
SILENT_ROUNDS = 64
MAX_SILENT_TAUGHT = 1024  # silent names that taught us kept for their seniority; past it, the youngest go
# our rounds from this ledger's first in which a peer's first batch counts as there from the
# start (`came_since_idle`) even while the newcomers teach: names that are never screened as near
# newcomers (unreadable, far) do not move the count, so without a bound a crowd could keep adding
# to the peers heard first
FIRST_ROUNDS = 16


@dataclass
class PeerRecord:
    """What one peer has shown this node."""

    delivered: int = 0  # verified batches
    missed: int = 0  # rounds in a row waited for in vain
    cut: bool = False  # closed a download mid-payload since its last verified batch
    screened: int = 0  # samples screened
    standing: float = 0.0  # recent share of its screened samples that were useful (kept, advantage != 0)
    taught_since: int | None = None  # our round in which its samples were first useful
    picking: bool = False  # found picking its completions: useless at once, not on trial, until it teaches
    unread: bool = False  # its last batch was in a tokenizer we cannot read: useless at once, until one is read
    seen: int = 0  # our round in which it last did anything here (forget_silent)
    came_late: bool = False  # its first verified batch came after the newcomers first idled (`came_since_idle`)


class PeerLedger:
    def __init__(self, settings: SwarmSettings | None = None) -> None:
        self.settings = settings or SwarmSettings()
        self.max_rejects = self.settings.max_rejects
        self.max_missed = self.settings.max_missed
        self.counts: Counter[str] = Counter()
        self.peers: dict[str, PeerRecord] = {}
        self._newcomers_lapse = 0  # near newcomers' samples that taught nothing less those that taught, 0..USELESS_AFTER
        self._idled = False  # the newcomers were idle at some point in this run (`came_since_idle`)
        self._rejected = 0  # bad batches from anyone, forgotten names' too: `total`
        self._round = 0  # our round, as the round loop last said (`advance`): what `seen` records
        self._first_round: int | None = None  # the round of the first `advance` (FIRST_ROUNDS)
        self._restored: set[str] = set()  # names restored from a checkpoint, seen at the next `advance`
        self._lock = threading.RLock()  # earned() is called with it held

    # -- bad data ------------------------------------------------------------------------------

    def reject(self, peer_id: str, reason: str) -> None:
        with self._lock:
            self.counts[peer_id] += 1
            self._rejected += 1
            count = self.counts[peer_id]
            self._record(peer_id)
        if count == 1:
            log.warning("rejected data from %s: %s", peer_id, reason)
        if count == self.max_rejects:
            log.warning("ignoring %s from now on: %d bad batches", peer_id, count)

    def is_banned(self, peer_id: str) -> bool:
        with self._lock:
            return self.counts.get(peer_id, 0) >= self.max_rejects

    @property
    def total(self) -> int:
        """Bad batches rejected in this run, from every name, forgotten ones included."""
        with self._lock:
            return self._rejected

    # -- forgetting ----------------------------------------------------------------------------

    def advance(self, round_: int) -> None:
        """Our round `round_` began: what each peer does from now on is seen in it."""
        with self._lock:
            self._round = round_
            self._first_round = round_ if self._first_round is None else self._first_round
            for peer in self._restored & self.peers.keys():  # a resumed run's peers are not silent yet
                self.peers[peer].seen = round_
            self._restored.clear()

    def _record(self, peer_id: str) -> PeerRecord:
        """The peer's record, made if new, seen in our current round."""
        record = self.peers.setdefault(peer_id, PeerRecord())
        record.seen = self._round
        return record

    def forget_silent(self, keep: Collection[str] = ()) -> list[str]:
        """Forget, and return, the names silent here for SILENT_ROUNDS of our rounds (none of
        them in `keep`: a peer whose groups the pool still holds) that never taught us, and past
        MAX_SILENT_TAUGHT silent names that did, those that first taught us last: an old peer's
        seniority outlives a crowd's. Their strikes go with them, as a fresh name has none."""
        with self._lock:
            silent = [peer for peer, record in self.peers.items()
                      if self._round - record.seen >= SILENT_ROUNDS and peer not in keep]
            taught = sorted((p for p in silent if self.peers[p].taught_since is not None),
                            key=lambda p: self.peers[p].taught_since or 0)
            forgotten = [p for p in silent if self.peers[p].taught_since is None] + taught[MAX_SILENT_TAUGHT:]
            for peer in forgotten:
                del self.peers[peer]
                self.counts.pop(peer, None)
            return forgotten

    # -- deliveries --------------------------------------------------------------------------

    def delivered(self, peer_id: str) -> None:
        """A batch from the peer passed every check."""
        with self._lock:
            record = self._record(peer_id)
            if not record.delivered:
                early = self._first_round is None or self._round - self._first_round < FIRST_ROUNDS
                record.came_late = self._idled or not early
            record.delivered += 1
            record.missed = 0
            record.cut = False

    def missed(self, peer_id: str) -> None:
        """The peer was waited for this round and delivered nothing valid."""
        with self._lock:
            record = self._record(peer_id)
            record.missed += 1
            if record.missed == self.max_missed:
                log.info("not waiting for %s until it delivers again (%d rounds missed)", peer_id, record.missed)

    def cut(self, peer_id: str) -> None:
        """The peer closed a download mid-payload: no strike (a crash looks the same), but it
        is no longer waited for, nor fetched ahead of strangers, until it delivers again."""
        with self._lock:
            record = self._record(peer_id)
            record.missed = max(record.missed, self.max_missed)
            record.cut = True

    def screened(self, peer_id: str, offered: int, useful: int, round_: int, picking: bool = False,
                 near: bool = True) -> None:
        """In our round `round_`, `useful` of the peer's `offered` samples were useful by
        screening's rule (swarmnode.screening.usefulness): its standing moves toward that share
        (STANDING_WEIGHT per batch), and the first useful one starts its seniority. A peer
        found `picking` its completions rather than sampling them (swarmnode.screening.repeats)
        stands at 0 and loses its seniority: its groups only fill what others leave, and should
        it teach again it starts as a newcomer would, behind the peers that taught us meanwhile.
        A newcomer's (or one on trial) samples count for the newcomers as one (`newcomers_idle`)
        when it is `near`: a far peer's groups take no newcomer turn (swarmnode.loop.share)."""
        if offered <= 0:
            return
        with self._lock:
            if near and not picking and self.standing(peer_id) is None and not self.is_banned(peer_id):
                lapse = self._newcomers_lapse + (offered - useful) - useful
                self._newcomers_lapse = min(max(lapse, 0), USELESS_AFTER)
                self._idled = self._idled or self._newcomers_lapse >= USELESS_AFTER
            self._judge(peer_id, offered, useful, round_, picking)

    def _judge(self, peer_id: str, offered: int, useful: int, round_: int, picking: bool) -> None:
        """The peer's own record of `screened`."""
        with self._lock:
            record = self._record(peer_id)
            if picking:
                record.standing, record.taught_since, record.picking = 0.0, None, True
                record.screened += offered
                return
            record.unread = False
            share = useful / offered
            record.standing = share if not record.screened else record.standing + STANDING_WEIGHT * (share - record.standing)
            record.screened += offered
            if useful and record.taught_since is None:
                record.taught_since = round_

    def unreadable(self, peer_id: str, round_: int) -> None:
        """In our round `round_`, a verified batch of the peer's was in a tokenizer this node
        cannot read (yet): it counts as one sample that taught nothing, and a peer that never
        taught stands as useless at once (its groups last), not on trial, until a batch of its
        is read: from then on its samples are judged as anyone's."""
        with self._lock:
            self._judge(peer_id, 1, 0, round_, picking=False)  # our want, not the newcomers' lapse
            self.peers[peer_id].unread = True

    def checkpoint_state(self) -> dict[str, Any]:
        """What a resumed node keeps (swarmnode.loop.checkpoints): the order its peers earned."""
        return {"seniority": self.seniority()}

    def restore(self, state: dict[str, Any]) -> None:
        self.restore_seniority(state.get("seniority") or {})

    def restore_seniority(self, seniority: dict[str, int]) -> None:
        """Seniority kept in a checkpoint (`seniority()`): a restart does not make a crowd the
        equal of a peer that taught us first."""
        with self._lock:
            for peer, since in seniority.items():
                if isinstance(peer, str) and isinstance(since, int):
                    self.peers.setdefault(peer, PeerRecord()).taught_since = since
                    self._restored.add(peer)

    def seniority(self) -> dict[str, int]:
        """Per peer whose samples were ever useful, our round in which they first were: the
        older, the larger its place in the peers' share (swarmnode.loop.pool.fair_queue)."""
        with self._lock:
            return {peer: r.taught_since for peer, r in self.peers.items() if r.taught_since is not None}

    def standing(self, peer_id: str) -> float | None:
        """How useful the peer's samples have been lately: the order in which peers share a
        batch (swarmnode.loop.pool.fair_queue). None for a newcomer: never screened, or none of
        its samples useful yet but fewer than USELESS_AFTER of them screened (unless it was
        found picking or unreadable)."""
        with self._lock:
            record = self.peers.get(peer_id)
            if record is None or not record.screened:
                return None
            if self.is_banned(peer_id):
                return 0.0
            return None if self.on_trial(peer_id) else record.standing

    def on_trial(self, peer_id: str) -> bool:
        """Screened, standing at 0 (none of its samples useful since it was first screened or
        since its seniority was restored), but fewer than USELESS_AFTER of them and not found
        picking nor its last batch unreadable: a newcomer still, whom a probation turn may
        screen."""
        with self._lock:
            record = self.peers.get(peer_id)
            return (
                record is not None and 0 < record.screened < USELESS_AFTER and record.standing <= 0
                and not record.picking and not record.unread and not self.is_banned(peer_id)
            )

    def newcomers_idle(self) -> bool:
        """USELESS_AFTER more of the near newcomers' samples screened (theirs while they stood
        None, whoever they were) taught nothing than taught, counting from 0 and to no more
        than USELESS_AFTER: newcomers get fewer turns (pool.IDLE_NEWCOMER_TURNS) until their
        samples teach again. Judged as one because names are free: a crowd renewing its names
        is never screened enough, name by name, to be judged; to keep the newcomers' turns it
        must teach with about half of its samples. Not kept over a restart, as standings are not."""
        with self._lock:
            return self._newcomers_lapse >= USELESS_AFTER

    def came_since_idle(self, peer_id: str) -> bool:
        """Its first verified batch came after the newcomers first idled (`newcomers_idle`) in
        this run, or after this node's first FIRST_ROUNDS rounds: a name a crowd made once it
        flooded, or an honest peer that joined since. The peers that came before (an honest
        peer there from the start) take the newcomers' turns first (pool.fair_queue): a set
        fixed then, that only shrinks, so no name made later joins it, however the newcomers'
        count moves since."""
        with self._lock:
            record = self.peers.get(peer_id)
            return record is not None and record.came_late

    def has_delivered(self, peer_id: str) -> bool:
        """Delivered a valid batch to this node at some point (whatever happened since)."""
        with self._lock:
            record = self.peers.get(peer_id)
            return record is not None and record.delivered > 0

    def has_cut(self, peer_id: str) -> bool:
        """Closed a download mid-payload since its last verified batch (or ever, if none)."""
        with self._lock:
            record = self.peers.get(peer_id)
            return record is not None and record.cut

    def ever_delivered(self) -> bool:
        """Some peer delivered a valid batch to this node at some point."""
        with self._lock:
            return any(record.delivered for record in self.peers.values())

    def earned(self, peer_id: str) -> bool:
        """Delivered a valid batch before, has not missed `max_missed` rounds since, not banned."""
        with self._lock:
            record = self.peers.get(peer_id)
            return (
                record is not None and record.delivered > 0 and record.missed < self.max_missed
                and not self.is_banned(peer_id)
            )

    def known(self, peer_id: str) -> bool:
        """Delivered a valid batch before, has not cut a download since, not banned: a peer
        asked directly for its newest batch. Unlike `earned`, rounds waited for it in vain do
        not count: a slower peer is late, and late is no reason to stop asking."""
        with self._lock:
            record = self.peers.get(peer_id)
            return record is not None and record.delivered > 0 and not record.cut and not self.is_banned(peer_id)

    def known_peers(self) -> list[str]:
        """Every known peer, in the order they first showed up here."""
        with self._lock:
            return [peer for peer in self.peers if self.known(peer)]

    def expected(self, live: set[str] | None = None) -> set[str]:
        """The peers a gather waits for: earned ones, among `live` when given."""
        with self._lock:
            peers = [p for p in self.peers if self.earned(p)]
        return {p for p in peers if live is None or p in live}
