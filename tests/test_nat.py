"""A volunteer behind NAT exchanges both ways with public nodes (bench/nat.py's lab: network
namespaces, a masquerading router that forwards nothing in). Skipped, with the reason, where
namespaces cannot be made (no root, no `ip` or `iptables`): `sudo python bench/nat.py` runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from nat import missing_tools  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.skipif(os.environ.get("SWARMNODE_NAT_LAB") != "1",
                    reason="builds network namespaces as root: set SWARMNODE_NAT_LAB=1 (needs root, ip and "
                    "iptables; sudo python bench/nat.py runs the lab by hand)")
def test_a_node_behind_nat_pulls_and_is_pulled_from():
    why = missing_tools()
    if why:
        pytest.skip(f"no NAT lab here: {why}")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "nat.py"), "--rounds", "12", "--json"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rounds"] == {"pub": 12, "pub2": 12, "home": 12}, result
    assert result["reach"]["pub"] == "direct" and result["reach"]["pub2"] == "direct", result["reach"]
    assert result["reach"]["home"] in ("relayed", "private"), result["reach"]
    used = result["used"]
    assert used["home"]["pub"] > 0 and used["home"]["pub2"] > 0, ("home pulls from both", used)
    assert used["pub"]["home"] > 0 and used["pub2"]["home"] > 0, ("both pull from home", used)
