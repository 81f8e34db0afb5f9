"""The live line a volunteer watches: what it says, and how long is left."""

from __future__ import annotations

import io

from rich.console import Console

from swarmnode.metrics import LiveView, format_duration
from swarmnode.records import RoundRecord


def _record(round_: int, round_s: float) -> RoundRecord:
    return RoundRecord(
        round=round_, peer_id="Qm", reward_mean=0.5, peer_reward_mean=None, own_samples=64, peer_samples=32,
        peers=1, gated=0, below_bar=0, peer_weight_scale=None, filtered=0, filtered_frac=0.0, weight_mean=1.0,
        weight_max=2.0, truncated_frac=0.0, divergence_mean=0.0, loss=0.0, grad_norm=0.0, wire_bytes=0,
        wire_tokens=0, rejected=0, peer_age_s=None, peer_lag=None, tokens_per_s=0.0, timings={"round_s": round_s},
    )


def test_the_live_line_ends_with_the_time_left_from_the_wall_time_between_rounds():
    out, now = io.StringIO(), [100.0]
    view = LiveView(Console(file=out, width=120), clock=lambda: now[0])
    view.round(_record(0, round_s=4.0), total_rounds=11)  # the first round: its own time, 10 left
    now[0] += 10.0  # evaluations and checkpoints count: the wall time between rounds, not round_s
    view.round(_record(1, round_s=4.0), total_rounds=11)
    first, second = out.getvalue().splitlines()
    assert first.startswith("round 1/11 ") and first.endswith("eta 40s")
    assert second.endswith(f"eta {format_duration(9 * (4.0 + 0.2 * (10.0 - 4.0)))}")
    assert len(second) <= 80, second
    now[0] += 10.0
    view.round(_record(10, round_s=4.0), total_rounds=11)
    assert out.getvalue().splitlines()[-1].endswith("eta 0s"), "the last round: nothing left"


def test_durations_read_at_a_glance():
    assert [format_duration(s) for s in (0.4, 45, 192, 3600 * 2 + 300)] == ["0s", "45s", "3m12s", "2h05m"]
