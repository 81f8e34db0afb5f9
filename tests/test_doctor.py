"""`swarmnode doctor` (swarmnode/ops/doctor.py): on this machine it says what is missing and
what the node will do instead, quickly; each check is shown failing, with its fix."""

from __future__ import annotations

import re
import socket
import time
from collections import namedtuple
from email.utils import formatdate

import huggingface_hub
import pytest
from huggingface_hub import constants as hub_constants
from typer.testing import CliRunner

from swarmnode.cli import app
from swarmnode.ops import doctor
from swarmnode.ops.doctor import BLOCKING, FINE, NOTE, examine
from swarmnode.settings.config import load_config
from swarmnode.sizing import memory
from swarmnode.sizing.devices import vllm_installed
from swarmnode.swarm.hivemind.addresses import tcp_endpoint
from swarmnode.swarm.hivemind.swarm_file import write_swarm_file

runner = CliRunner()


class _NoHub(Exception):
    pass


@pytest.fixture
def offline(monkeypatch):
    """The hub as this machine has it: no answer to anything."""
    def unreachable(*args, **kwargs):
        raise _NoHub("[Errno -2] Name or service not known")

    class Session:
        head = staticmethod(unreachable)

    monkeypatch.setattr(doctor, "get_session", lambda: Session())
    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    monkeypatch.setattr(huggingface_hub, "dataset_info", unreachable)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # a check that goes offline sets it: put back after the test


def _verdicts(config) -> dict[str, tuple[str, str]]:
    return {f.check: (f.verdict, f.said) for f in examine(config)}


def test_on_this_machine_it_says_what_is_missing_and_what_the_node_does_instead_quickly(tmp_path, offline):
    started = time.monotonic()
    result = runner.invoke(app, ["doctor", "--run-dir", str(tmp_path / "run")])
    took = time.monotonic() - started
    said = re.sub(r"\s+", " ", result.output)
    assert result.exit_code == 0, said
    assert "note device no GPU: the node trains and generates on CPU" in said
    assert "note hub the Hugging Face hub cannot be reached" in said and "ok model tiny" in said
    assert took < 5, took


def test_each_check_says_what_stops_the_node_and_the_fix(tmp_path, offline, monkeypatch):
    base = [f"node.run_dir={tmp_path / 'run'}"]
    assert _verdicts(load_config(None, [*base, "model.device=cuda"]))["device"][0] == BLOCKING
    if not vllm_installed():
        generation = _verdicts(load_config(None, [*base, "rollout.backend=vllm"]))["generation"]
        assert generation[0] == BLOCKING and "--backend hf" in generation[1]
    found = _verdicts(load_config(None, [*base, "model.name=Qwen2.5-7B", "task.name=gsm8k"]))
    assert found["model"][0] == BLOCKING and "give a local model directory" in found["model"][1]
    assert "memory" not in found, "no estimate for a model that cannot be found"
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)  # the checks above went offline, as a node would
    notes = [f.said for f in examine(load_config(None, [*base, "task.name=gsm8k"]))]
    assert any("openai/gsm8k from the datasets cache, if it is there" in note for note in notes), notes
    missing = _verdicts(load_config(None, [*base, "task.name=gsm8k", f"task.data={tmp_path / 'none'}"]))
    assert missing["data"] == (BLOCKING, f"task.data: {tmp_path / 'none'} does not exist")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **k: None)  # the hub answers for the model
    monkeypatch.setattr(memory, "device_capacity", lambda on_gpu, index: 1 << 30)  # a 1 GiB machine
    assert _verdicts(load_config(None, [*base, "model.name=Qwen2.5-7B"]))["memory"][0] == BLOCKING
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    run_dir = _verdicts(load_config(None, [f"node.run_dir={a_file / 'run'}"]))["run dir"]
    assert run_dir[0] == BLOCKING and "give --run-dir" in run_dir[1]
    task = _verdicts(load_config(None, [*base, "task.name=rg:no_such_set"]))["task"]
    assert task[0] == BLOCKING and "no dataset 'no_such_set'" in task[1]
    addresses = _verdicts(load_config(None, [*base, "swarm.initial_peers=['/ip4/1.2.3/tcp/1']"]))["addresses"]
    assert addresses[0] == BLOCKING and "is not a multiaddr" in addresses[1]
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1 << 20))
    disk = _verdicts(load_config(None, base))["disk"]
    assert disk[0] == BLOCKING and "free some space" in disk[1]
    result = runner.invoke(app, ["doctor", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 1 and "stop" in result.output


def test_a_reachable_hub_and_an_offline_one_are_told_apart(tmp_path, offline, monkeypatch):
    class Session:
        @staticmethod
        def head(*args, **kwargs):  # the hub answers, its Date a minute behind ours
            return type("Answer", (), {"headers": {"Date": formatdate(time.time() - 60, usegmt=True)}})()

    monkeypatch.setattr(doctor, "get_session", lambda: Session())
    found = _verdicts(load_config(None, [f"node.run_dir={tmp_path}"]))
    assert found["hub"][0] == FINE
    assert found["clock"][0] == BLOCKING and "ahead of the hub's clock" in found["clock"][1]
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    hub = _verdicts(load_config(None, [f"node.run_dir={tmp_path}"]))["hub"]
    assert hub[0] == NOTE and "HF_HUB_OFFLINE" in hub[1]


def test_initial_peers_are_asked_on_tcp_and_none_answering_blocks(tmp_path, offline):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        open_port = listener.getsockname()[1]
        with socket.socket() as probe:  # a port nobody listens on
            probe.bind(("127.0.0.1", 0))
            closed_port = probe.getsockname()[1]
        peer = "/p2p/QmXfV8jn6FiD1VTcSmxpstA2WmtvRCB9yYbGcw3rTYXbbb"
        base = [f"node.run_dir={tmp_path / 'run'}", "swarm.host_maddrs=['/ip4/127.0.0.1/tcp/0']"]
        one = _verdicts(load_config(None, [*base, f"swarm.initial_peers=['/ip4/127.0.0.1/tcp/{open_port}{peer}', "
                                                  f"'/ip4/127.0.0.1/tcp/{closed_port}{peer}']"]))
        assert one["initial peers"][0] == FINE and "1 of 2 answer" in one["initial peers"][1]
        none = _verdicts(load_config(None, [*base, f"swarm.initial_peers=['/ip4/127.0.0.1/tcp/{closed_port}{peer}']"]))
        assert none["initial peers"][0] == BLOCKING and "copy it whole" in none["initial peers"][1]
        assert one["reach"][0] == NOTE and one["reach"][1].startswith("local:")
    assert "initial peers" not in _verdicts(load_config(None, [*base, "swarm.enabled=false"])), "alone: no peers"


def test_the_peers_file_is_read_as_join_reads_it_and_its_peers_asked(tmp_path, offline):
    peer = "/p2p/QmXfV8jn6FiD1VTcSmxpstA2WmtvRCB9yYbGcw3rTYXbbb"
    peers_file = tmp_path / "a" / "swarm.json"
    base = [f"node.run_dir={tmp_path / 'b'}", f"swarm.initial_peers_file={peers_file}"]
    not_yet = _verdicts(load_config(None, base))["initial peers"]
    assert not_yet[0] == NOTE and "is not there yet: join waits" in not_yet[1], "the bootstrap may start later"
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"/ip4/127.0.0.1/tcp/{probe.getsockname()[1]}{peer}"
    given = _verdicts(load_config(None, [*base, f"swarm.initial_peers=['{closed}']"]))["initial peers"]
    assert given[0] == BLOCKING and "is not there yet" in given[1], "the peers given are still asked"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        write_swarm_file(peers_file.parent, "Qm", [f"/ip4/127.0.0.1/tcp/{listener.getsockname()[1]}{peer}"])
        found = _verdicts(load_config(None, base))["initial peers"]
    assert found == (FINE, f"1 of 1 answer on TCP (1 from {peers_file})")
    peers_file.write_text("/ip4/1.2.3/tcp/1" + peer)
    typo = _verdicts(load_config(None, base))["initial peers"]
    assert typo[0] == BLOCKING and "is not a multiaddr" in typo[1]
    peers_file.write_text("{not json")
    broken = _verdicts(load_config(None, base))["initial peers"]
    assert broken[0] == BLOCKING and "is not a swarm.json" in broken[1]


def test_the_tcp_endpoint_of_a_multiaddr_is_read_by_its_parser():
    peer = "/p2p/QmXfV8jn6FiD1VTcSmxpstA2WmtvRCB9yYbGcw3rTYXbbb"
    assert tcp_endpoint(f"/ip4/10.0.0.2/tcp/31337{peer}") == ("10.0.0.2", 31337)
    assert tcp_endpoint(f"/ip6/::1/tcp/8{peer}") == ("::1", 8)
    assert tcp_endpoint(f"/dns4/relay.example.org/tcp/4001{peer}/p2p-circuit{peer}") == ("relay.example.org", 4001)
    assert tcp_endpoint(f"/ip4/10.0.0.2/udp/4001/quic{peer}") is None, "not TCP"
    assert tcp_endpoint("/ip4/10.0.0.2/tcp/notaport") is None and tcp_endpoint("tcp/ip4") is None


def test_a_clock_far_from_the_hub_s_blocks_and_none_to_ask_is_a_note():
    fine = doctor._clock(1000.0, now=1005.0)
    assert (fine.verdict, fine.said) == (FINE, "5 s ahead of the hub's clock")
    late = doctor._clock(1000.0, now=900.0)
    assert late.verdict == BLOCKING and "100 s behind" in late.said and "timedatectl" in late.said
    synced = doctor._clock(None, kernel_synced=True)
    assert synced.verdict == FINE and "kept in sync by a time service" in synced.said
    drifting = doctor._clock(None, kernel_synced=False)
    assert drifting.verdict == NOTE and "no time service keeps it in sync" in drifting.said
    assert "set-ntp" in drifting.said
    assert doctor._clock(None).verdict in (FINE, NOTE), "without the hub the kernel is asked, never a block"


def test_the_kernel_s_sync_flag_is_read_by_adjtimex_and_a_refusal_is_no_answer(monkeypatch):
    answers = iter([0, doctor.TIME_ERROR, -1])  # TIME_OK, unsynchronised, refused (a seccomp filter)
    asked = []

    class Libc:
        @staticmethod
        def adjtimex(buffer):
            asked.append(bytes(buffer.raw[:4]))  # modes, the first field: 0 only reads
            return next(answers)

    monkeypatch.setattr(doctor.sys, "platform", "linux")
    monkeypatch.setattr(doctor.ctypes, "CDLL", lambda *a, **k: Libc())
    assert [doctor._kernel_clock_synced() for _ in range(3)] == [True, False, None]
    assert asked == [b"\0" * 4] * 3, "read only: nothing set"
    monkeypatch.setattr(doctor.sys, "platform", "darwin")
    assert doctor._kernel_clock_synced() is None
