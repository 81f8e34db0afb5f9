"""How a node says peers reach it, from its addresses alone (the NAT lab, tests/test_nat.py,
needs root; these need nothing)."""

from __future__ import annotations

import pytest

from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.hivemind.reach import classify, forced_reachability

PUBLIC = "/ip4/203.0.114.7/tcp/31337"  # documentation ranges are not global: a real public address
HOME = "/ip4/192.168.1.20/tcp/31337"
LOOPBACK = "/ip4/127.0.0.1/tcp/31337"
CIRCUIT = "/ip4/198.51.99.2/tcp/31337/p2p/QmRelay/p2p-circuit"


@pytest.mark.parametrize(
    "visible,announced,reach",
    [
        ([HOME, PUBLIC], [], "direct"),  # the daemon saw a public address of ours
        ([HOME], [PUBLIC], "direct"),  # a forwarded port, announced
        ([HOME, CIRCUIT], [], "relayed"),  # only a relay's circuit is public
        ([HOME], [], "private"),  # behind NAT, no relay slot yet
        ([], [], "private"),
        ([LOOPBACK], [], "local"),
    ],
)
def test_reach_is_classified_from_the_addresses_peers_could_dial(visible, announced, reach):
    assert classify(visible, announced) == reach


def test_the_daemon_is_told_up_front_whether_to_relay_for_others_or_use_a_relay():
    def settings(*host, announce=(), auto_relay=True):
        return SwarmSettings(host_maddrs=list(host), announce_maddrs=list(announce), auto_relay=auto_relay)

    assert forced_reachability(settings(HOME, announce=[PUBLIC])) == "public"
    assert forced_reachability(settings(HOME)) == "private"
    assert forced_reachability(settings(HOME, auto_relay=False)) is None, "no relay wanted: AutoNAT decides"
    assert forced_reachability(settings(LOOPBACK)) is None, "one machine: nothing to relay"
