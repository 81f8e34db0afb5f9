"""A download keeps to a floor rate, and a stranger whose download failed waits before the next.

A peer that promises a large payload and sends nothing (or a few bytes a second) held a
stranger's download, and the budget it takes, for the whole fetch timeout; two such identities
announcing a round a second held the budget for good (issue: four silent identities starve a node).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from swarmnode.swarm.hivemind.downloads import STRANGER_BACKOFF_MAX_S, STRANGER_BACKOFF_S, Backoff
from swarmnode.swarm.hivemind.fetch import FetchError, _read_payload
from swarmnode.swarm.hivemind.payloads import FLOOR_GRACE_S


async def _fed(
    chunks: list[tuple[float, bytes]], eof: bool, read_length: int, floor: float, grace_s: float = FLOOR_GRACE_S,
) -> bytes:
    """_read_payload on a reader fed `chunks` (delay in seconds, bytes)."""
    reader = asyncio.StreamReader()

    async def feed() -> None:
        for delay, data in chunks:
            await asyncio.sleep(delay)
            reader.feed_data(data)
        if eof:
            reader.feed_eof()

    feeder = asyncio.ensure_future(feed())
    try:
        return await _read_payload(reader, "peer", read_length, floor, grace_s=grace_s)
    finally:
        feeder.cancel()


def test_a_payload_at_the_floor_rate_arrives_whole():
    data = bytes(range(256)) * 64
    got = asyncio.run(_fed([(0.01, data[:5000]), (0.01, data[5000:])], eof=False, read_length=len(data), floor=1e6))
    assert got == data


def test_a_download_below_the_floor_rate_is_cut_after_the_grace():
    # 100 bytes in the grace (0.2 s), then a byte every 0.15 s: the floor (1 KB/s) wants 100 bytes in 0.1 s
    drip = [(0.05, b"x" * 100)] + [(0.15, b"x")] * 20
    started = time.monotonic()
    with pytest.raises(FetchError) as err:
        asyncio.run(_fed(drip, eof=False, read_length=10_000, floor=1000, grace_s=0.2))
    assert err.value.slow and not err.value.misbehaved and "below" in str(err.value)
    assert time.monotonic() - started < 1.0, "cut soon after the grace it was given"
    with pytest.raises(FetchError) as silent:  # promised and sent nothing
        asyncio.run(_fed([], eof=False, read_length=10_000, floor=1000, grace_s=0.2))
    assert silent.value.slow


def test_a_peer_that_closes_mid_payload_is_a_cut():
    with pytest.raises(FetchError) as err:
        asyncio.run(_fed([(0.0, b"abc")], eof=True, read_length=10, floor=1e6))
    assert err.value.cut and "3 of the 10" in str(err.value)
    assert FLOOR_GRACE_S <= 10, "a stranger's silent download ends in seconds, not the fetch timeout"


def test_a_stranger_waits_out_a_growing_back_off_until_it_delivers():
    backoff = Backoff()
    backoff.failed("s", now=0.0)
    assert backoff.waiting("s", STRANGER_BACKOFF_S - 0.1) and not backoff.waiting("s", STRANGER_BACKOFF_S + 0.1)
    backoff.failed("s", now=100.0)
    assert backoff.waiting("s", 100.0 + 2 * STRANGER_BACKOFF_S - 0.1), "doubled at the second failure in a row"
    for _ in range(20):
        backoff.failed("s", now=100.0)
    assert not backoff.waiting("s", 100.0 + STRANGER_BACKOFF_MAX_S + 0.1), "capped"
    backoff.delivered("s")
    assert not backoff.waiting("s", 100.0)
    assert not backoff.waiting("other", 0.0)
    for k in range(1000):  # many identities, long gone: forgotten
        backoff.failed(f"id{k}", now=0.0)
    backoff.failed("late", now=10 * STRANGER_BACKOFF_MAX_S)
    assert len(backoff._until) == 1
