"""A volunteer behind NAT, on this machine: Linux network namespaces, a router that masquerades
and forwards nothing in, and `swarmnode join` processes on either side.

    sudo python bench/nat.py [--rounds 20] [--no-relay] [--json]

The lab (names carry this process's id, so runs never collide; everything is removed at the end):

    ns wan     a bridge: the "internet", 11.77.0.0/24 (an address range that counts as global)
    ns pub     11.77.0.2  the bootstrap node, which also serves as a relay
    ns pub2    11.77.0.3  a second public node: it never dialled the NATed node itself
    ns router  11.77.0.4 on the internet, 192.168.77.1 at home; MASQUERADE out, nothing forwarded in
    ns home    192.168.77.2, default route through the router: the volunteer

Printed: how each node says it is reached (direct, relayed, private), and for each node the
share of its rounds (from the 3rd) that trained on each other node's samples, so "both ways"
is read off the home row and the home column. Needs root, `ip` and `iptables`; says which
is missing otherwise (tests/test_nat.py skips with that reason).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from swarmnode.model.tiny import TINY_PRESETS, ensure_tiny
from swarmnode.ops.metrics import read_metrics, round_lines

WAN, HOME = "11.77.0", "192.168.77"
NODES = {"pub": f"{WAN}.2", "pub2": f"{WAN}.3", "home": f"{HOME}.2"}
PORT = 31337


def missing_tools() -> str | None:
    """Why this machine cannot build the lab, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = f"snprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False)
    return None


def _sh(*commands: str) -> None:
    for command in commands:
        done = subprocess.run(command.split(), capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{command}: {done.stderr.strip()}")


@contextlib.contextmanager
def nat_lab() -> Iterator[dict[str, str]]:
    """Build the namespaces above; yields their names by role and removes them on exit."""
    tag = str(os.getpid())[-5:]
    ns = {role: f"sn{role}{tag}" for role in ("wan", "pub", "pub2", "router", "home")}
    try:
        for name in ns.values():
            _sh(f"ip netns add {name}", f"ip -n {name} link set lo up")
        _sh(f"ip -n {ns['wan']} link add br0 type bridge", f"ip -n {ns['wan']} link set br0 up")
        for role, address in (("pub", f"{WAN}.2"), ("pub2", f"{WAN}.3"), ("router", f"{WAN}.4")):
            outside, inside = f"w{role[:4]}{tag}", f"e{role[:4]}{tag}"
            _sh(
                f"ip link add {outside} netns {ns['wan']} type veth peer name {inside} netns {ns[role]}",
                f"ip -n {ns['wan']} link set {outside} master br0",
                f"ip -n {ns['wan']} link set {outside} up",
                f"ip -n {ns[role]} addr add {address}/24 dev {inside}",
                f"ip -n {ns[role]} link set {inside} up",
            )
        lan_router, lan_home = f"lr{tag}", f"lh{tag}"
        _sh(
            f"ip link add {lan_router} netns {ns['router']} type veth peer name {lan_home} netns {ns['home']}",
            f"ip -n {ns['router']} addr add {HOME}.1/24 dev {lan_router}",
            f"ip -n {ns['router']} link set {lan_router} up",
            f"ip -n {ns['home']} addr add {HOME}.2/24 dev {lan_home}",
            f"ip -n {ns['home']} link set {lan_home} up",
            f"ip -n {ns['home']} route add default via {HOME}.1",
            f"ip netns exec {ns['router']} sysctl -q -w net.ipv4.ip_forward=1",
            f"ip netns exec {ns['router']} iptables -t nat -A POSTROUTING -s {HOME}.0/24 -o erout{tag} -j MASQUERADE",
            # a home router: replies to what home opened come back, nothing new gets in
            f"ip netns exec {ns['router']} iptables -A FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
            f"ip netns exec {ns['router']} iptables -A FORWARD -s {HOME}.0/24 -j ACCEPT",
            f"ip netns exec {ns['router']} iptables -P FORWARD DROP",
        )
        yield ns
    finally:
        for name in ns.values():
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def node_config(directory: Path, address: str, rounds: int, relay: bool) -> dict:
    return {
        "model": {"name": "tiny", "device": "cpu"},
        "task": {"name": "arithmetic", "system_prompt": ""},
        "rollout": {"group_size": 8, "prompts_per_round": 4, "max_new_tokens": 10},
        "node": {"rounds": rounds, "eval_size": 20, "checkpoint_every": 0, "gather_timeout_s": 5.0,
                 "run_dir": str(directory / "run")},
        "swarm": {"host_maddrs": [f"/ip4/{address}/tcp/{PORT}" if address.startswith(WAN) else "/ip4/0.0.0.0/tcp/0"],
                  "heartbeat_interval_s": 1.0, "stale_after_s": 10.0, "min_peers": 2, "wait_for_peers_s": 120.0,
                  "auto_relay": relay},
    }


def start(namespace: str, directory: Path, config: dict, initial_peers: list[str]) -> subprocess.Popen:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    cmd = ["ip", "netns", "exec", namespace, sys.executable, "-m", "swarmnode", "join",
           "--config", str(directory / "config.yaml"), "-q"]
    for maddr in initial_peers:
        cmd += ["--initial-peers", maddr]
    log = (directory / "node.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_for(path: Path, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"no {path.name}; see {path.parent.parent / 'node.log'}")
        time.sleep(0.2)


def run(rounds: int, relay: bool) -> dict:
    """The three nodes train `rounds` rounds in the lab; what each used of whom, and its reach."""
    for spec in TINY_PRESETS.values():
        ensure_tiny(spec)
    with nat_lab() as ns, tempfile.TemporaryDirectory(prefix="swarmnode-nat-") as scratch:
        root = Path(scratch)
        processes = {}
        try:
            processes["pub"] = start(ns["pub"], root / "pub", node_config(root / "pub", NODES["pub"], rounds, relay), [])
            wait_for(root / "pub" / "run" / "swarm.json", processes["pub"], 120)
            bootstrap = json.loads((root / "pub" / "run" / "swarm.json").read_text())["maddrs"][:1]
            for role in ("pub2", "home"):
                config = node_config(root / role, NODES[role], rounds, relay)
                processes[role] = start(ns[role], root / role, config, bootstrap)
            deadline = time.monotonic() + 900
            while any(p.poll() is None for p in processes.values()) and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            for process in processes.values():
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        return summarise(root, list(processes))


def summarise(root: Path, roles: list[str]) -> dict:
    lines = {role: round_lines(read_metrics(root / role / "run" / "metrics.jsonl"))
             if (root / role / "run" / "metrics.jsonl").exists() else [] for role in roles}
    ids = {role: rounds[0]["peer_id"] if rounds else "" for role, rounds in lines.items()}
    reach = {}
    for role in roles:
        swarm_file = root / role / "run" / "swarm.json"
        reach[role] = json.loads(swarm_file.read_text()).get("reach") if swarm_file.exists() else None
    used = {
        role: {other: sum(ids[other] in m.get("samples_by_peer", {}) for m in rounds[2:]) / max(len(rounds) - 2, 1)
               for other in roles if other != role}
        for role, rounds in lines.items()
    }
    return {"rounds": {role: len(rounds) for role, rounds in lines.items()}, "reach": reach, "used": used}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--no-relay", action="store_true", help="swarm.auto_relay false on every node")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args()
    why = missing_tools()
    if why:
        sys.exit(f"cannot build the NAT lab: {why}")
    result = run(args.rounds, relay=not args.no_relay)
    if args.json:
        print(json.dumps(result))
        return
    print(f"NAT lab, {args.rounds} rounds, swarm.auto_relay {not args.no_relay}")
    for role in result["rounds"]:
        shares = ", ".join(f"{other}'s samples in {share:.0%}" for other, share in result["used"][role].items())
        print(f"{role:<5} reach {result['reach'][role]!s:<8} {result['rounds'][role]} rounds; of its rounds from "
              f"the 3rd: {shares}")


if __name__ == "__main__":
    main()
