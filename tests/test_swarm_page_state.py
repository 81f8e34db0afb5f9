"""The swarm page's state and server without a swarm: the bounded history, a node's curves
from its metrics file, the read-only HTTP server and the --serve address."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from swarmnode.ops.node_curves import NodeCurves, curves, tail_lines
from swarmnode.ops.status_page import (
    SECURITY_HEADERS,
    AddressError,
    PageAddress,
    SwarmPage,
    parse_address,
    read_forever,
    serve,
)
from swarmnode.ops.swarm_history import SwarmHistory
from swarmnode.protocol.records import Heartbeat, PeerRow


def row(peer: str, time: float, round_: int = 0, answered: bool = True, **claims) -> PeerRow:
    beat = Heartbeat(peer=peer, run="r", time=time, round=round_, **claims)
    return PeerRow(beat, 1.0, "training", True, 5.0 if answered else None, "local" if answered else None)


def test_a_crowd_of_silent_identities_is_bounded_and_cannot_push_out_a_live_peer():
    history = SwarmHistory(max_peers=50, points_per_peer=4, total_points=3)
    history.observe([row("live", 1.0)], now=1.0)
    for read in range(20):
        junk = [row(f"junk{read}-{i}", 2.0 + read, answered=False) for i in range(1000)]
        history.observe([*junk, row("live", 2.0 + read)], now=2.0 + read)
    assert len(history) == 50
    assert "live" in {r.heartbeat.peer for r in history.rows()}
    assert "live" in history.drawn(3), "the peers that answered are drawn first"
    assert len(history.totals) == 3


def test_a_peer_adds_a_point_only_for_a_newer_heartbeat_and_keeps_its_last_points():
    history = SwarmHistory(points_per_peer=3)
    for now in range(10):
        history.observe([row("a", 100.0 + now // 2, round_=now // 2, reward=0.1 * (now // 2))], now=float(now))
    series = history.to_json()["series"]["a"]
    assert series["round"] == [2, 3, 4] and len(series["t"]) == 3


def test_totals_count_rounds_a_minute_of_peers_that_answered_and_answers_apart_from_claims():
    history = SwarmHistory()
    history.observe([row("a", 1.0, 10, consumed=5), row("b", 1.0, 20, answered=False)], now=0.0)
    history.observe([row("a", 2.0, 16, consumed=9), row("b", 2.0, 2**62, answered=False)], now=30.0)
    totals = history.to_json()["totals"]
    assert totals["rounds_per_min"] == [None, 12.0], "b did not answer: its claimed rounds are not counted"
    assert totals["answered"] == [1, 1] and totals["training"] == [2, 2] and totals["samples"] == [5, 9]
    history.observe([row("a", 3.0, 2**62)], now=60.0)
    assert history.to_json()["totals"]["rounds_per_min"][-1] == 600.0, "a peer's claimed rounds are capped"


def test_a_peer_missing_from_a_read_is_gone_and_no_longer_shown_as_checked():
    history = SwarmHistory()
    history.observe([row("a", 1.0), row("b", 1.0)], now=1.0)
    history.observe([row("a", 2.0)], now=2.0)
    shown = {r["peer"]: r for r in history.to_json()["peers"]}
    assert shown["b"]["state"] == "gone" and shown["b"]["checked"]["answered_ms"] is None
    assert history.answered() == {"a"}
    history.observe([row("a", 3.0), row("b", 3.0)], now=3.0)
    assert history.to_json()["peers"][0]["state"] == "training" and history.answered() == {"a", "b"}


def test_claimed_edges_are_capped_at_what_the_source_published():
    history = SwarmHistory()
    history.observe([row("a", 1.0, published=10, used={"b": 4}), row("b", 1.0, published=3, used={"a": 50, "x": 9})],
                    now=1.0)
    edges = {(e["from"], e["to"]): e for e in history.to_json()["edges"]}
    assert edges == {("b", "a"): {"from": "b", "to": "a", "count": 3, "checked": False},
                     ("a", "b"): {"from": "a", "to": "b", "count": 10, "checked": False}}
    assert all("used" not in r and "evals" not in r for r in history.to_json()["peers"]), "not drawn, not sent"


def test_a_nodes_curves_come_from_its_own_lines_and_say_whose_samples_it_used(tmp_path):
    lines = [
        {"kind": "eval", "round": -1, "phase": "before", "eval_acc": 0.4, "time": 1.0},
        {"kind": "round", "round": 0, "time": 2.0, "reward_mean": 0.5, "own_samples": 8, "peer_samples": 8,
         "weight_mean": float("nan"), "filtered_frac": 0.0, "round_s": 1.5, "samples_by_peer": {"p": 8}},
        {"kind": "round", "round": 1, "time": 3.0, "reward_mean": 0.6, "own_samples": 8, "peer_samples": 0,
         "weight_mean": 1.0, "filtered_frac": 0.1, "round_s": 1.4, "samples_by_peer": {}},
    ]
    drawn = curves(lines, "me")
    assert drawn["peer_share"] == [0.5, 0.0] and drawn["weight_mean"] == [None, 1.0]
    assert drawn["eval_acc"] == [0.4] and drawn["edges"] == [{"from": "p", "to": "me", "count": 8, "checked": True}]
    json.dumps(drawn, allow_nan=False)
    path = tmp_path / "metrics.jsonl"
    reader = NodeCurves(tmp_path, "me")
    assert reader.to_json() is None
    path.write_text("\n".join(json.dumps(line) for line in lines[:2]) + "\n{torn")
    assert len(reader.to_json()["t"]) == 1
    path.write_text("\n".join(json.dumps(line) for line in lines))
    assert len(reader.to_json()["t"]) == 2, "read again once the file changed"
    assert curves([{**lines[1], "round": float("inf")}])["round"] == [None]


def test_only_the_tail_of_a_long_metrics_file_is_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"kind": "round", "round": i, "time": float(i)}) + "\n" for i in range(1000)))
    tail = tail_lines(path, tail_bytes=400)
    assert 5 < len(tail) < 20 and tail[-1]["round"] == 999 and all(line["round"] > 900 for line in tail)


@pytest.fixture
def served():
    page = SwarmPage()
    page.observe([row("<b>peer</b>", 1.0, model="<script>x()</script>")], now=1.0)
    server = serve(page, PageAddress("127.0.0.1", 0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_server_answers_get_only_with_the_page_its_files_and_the_state(served):
    with urllib.request.urlopen(served + "/") as answer:
        assert b"/static/page.js" in answer.read()
        assert answer.headers["Content-Security-Policy"] == SECURITY_HEADERS["Content-Security-Policy"]
    with urllib.request.urlopen(served + "/api/swarm") as answer:
        state = json.loads(answer.read())
    assert state["peers"][0]["model"] == "<script>x()</script>" and state["me"] is None
    for path in ("/static/../status_page.py", "/static/%2e%2e/cli.py", "/etc/passwd", "/static/"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(served + path)
        assert refused.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(served + "/api/swarm", data=b"x", method="POST"))
    assert refused.value.code == 501
    with pytest.raises(urllib.error.HTTPError) as refused:  # DNS rebinding: another name for this machine
        urllib.request.urlopen(urllib.request.Request(served + "/api/swarm", headers={"Host": "evil.example:80"}))
    assert refused.value.code == 403
    for name in ("localhost:1", "[::1]:1", "127.0.0.1"):
        with urllib.request.urlopen(urllib.request.Request(served + "/", headers={"Host": name})) as answer:
            assert answer.status == 200


def test_a_failed_read_is_shown_and_cleared_by_the_next():
    page, stop = SwarmPage(), threading.Event()
    errors: list[str] = []

    def failing_then_fine(first):
        if errors == []:
            errors.append("first")
            raise TimeoutError("the swarm stopped answering")
        errors.append(page.to_json()["error"])
        stop.set()
        return [row("a", 1.0)]

    read_forever(page, failing_then_fine, 0.0, stop)
    assert errors == ["first", "reading the swarm failed: the swarm stopped answering"]
    assert page.to_json()["error"] is None and len(page.history) == 1


@pytest.mark.parametrize(("text", "host", "port", "local"), [
    ("8080", "127.0.0.1", 8080, True), ("0", "127.0.0.1", 0, True), ("0.0.0.0:9000", "0.0.0.0", 9000, False),
    ("[::1]:7000", "::1", 7000, True), ("::1", "::1", 8765, True), ("localhost", "localhost", 8765, True),
])
def test_serve_addresses(text, host, port, local):
    address = parse_address(text)
    assert (address.host, address.port, address.local) == (host, port, local)


@pytest.mark.parametrize("text", ["127.0.0.1:http", "host:70000", ":-1"])
def test_a_bad_serve_address_is_refused_clearly(text):
    with pytest.raises(AddressError, match="PORT, HOST:PORT or HOST"):
        parse_address(text)


def test_the_page_listens_on_ipv6_loopback_too():
    server = serve(SwarmPage(), parse_address("[::1]:0"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with urllib.request.urlopen(f"http://[::1]:{server.server_address[1]}/api/swarm") as answer:
            assert json.loads(answer.read())["peers"] == []
    finally:
        server.shutdown()
        server.server_close()
