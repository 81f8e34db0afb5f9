"""The swarm page's speed and memory, which the tests do not time (swarmnode status --serve).

    python bench/status_page.py open [--peers 20] [--beats 10]
    python bench/status_page.py crowd [--identities 10000] [--reads 100] [--per-read 500]

`open`: --peers identities on 127.0.0.1, each a real hivemind peer that heartbeats and answers
the status client's question (as a node does); `swarmnode status --serve` reads them; headless
Chromium opens the page. Prints the seconds from opening the page until every peer's row is
shown (median of 5 opens), then, for --beats heartbeats, the seconds from one peer starting to
store a new heartbeat until the page shows its round (median and largest), and the page
process's memory. Needs Debian's chromium and chromium-driver.

`crowd`: the page process's memory while --identities junk identities heartbeat, every string
field at its longest: a status read returns at most STATUS_SHARDS shards' heartbeats (about 500
peers, swarmnode.swarm.hivemind.status), so each of --reads reads returns --per-read of them,
the crowd's identities in turn, and a browser-like client fetches /api/swarm after each. The
process imports what `swarmnode status --serve` imports (hivemind, and with it torch) and
serves the page and its history in this process, the DHT reads left out. Prints its resident
(RSS) and unique (USS: what the process alone holds) memory before the crowd, at their highest,
and the peers kept and the size of one /api/swarm answer.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import hivemind  # noqa: F401 (what `swarmnode status --serve` holds: the crowd bench measures it too)
import psutil
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.ops.status_page import PageAddress, SwarmPage, serve
from swarmnode.protocol.records import EVAL_HISTORY, MAX_USED_NAMED, Heartbeat, PeerRow
from swarmnode.settings.config import SwarmSettings
from swarmnode.swarm.hivemind.dht import owner_or_none, pack
from swarmnode.swarm.hivemind.payloads import PROTOCOL, PayloadServer
from swarmnode.swarm.hivemind.runtime import SwarmRuntime
from swarmnode.swarm.hivemind.shards import HEARTBEAT_FAMILY, ShardedFamily

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
RUN = "bench-page"


class Beater:
    """A peer that heartbeats and answers the status client's question, as a node does."""

    def __init__(self, initial_peers: list[str], key: Path) -> None:
        self.runtime = SwarmRuntime(SwarmSettings(initial_peers=initial_peers, host_maddrs=LOOPBACK), key)
        self.runtime.start()
        server = PayloadServer(RUN, keep_rounds=1)
        self.runtime.call(self.runtime.p2p.add_binary_stream_handler(PROTOCOL, server.handle), timeout=10)
        self.family = ShardedFamily(HEARTBEAT_FAMILY, self.runtime.peer_id, owner_or_none)

    def beat(self, round_: int) -> None:
        beat = Heartbeat(peer=self.runtime.peer_id, run=RUN, time=get_dht_time(), round=round_, model="tiny",
                         reward=0.3, eval_acc=0.5)
        self.runtime.call(self.runtime.store_owned_all(self.family.write_keys(), pack(beat.model_dump()),
                                                       get_dht_time() + 60), timeout=30)


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver") or "chromedriver"))


def _rows_shown(browser) -> int:
    return browser.execute_script("return document.querySelectorAll('#peers tbody tr').length")


def _wait(condition, timeout_s: float, what: str, every_s: float = 0.02) -> float:
    """Seconds until `condition()` holds; RuntimeError after `timeout_s`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every_s)
    return time.monotonic() - started


def bench_open(peers: int, beats: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="page-bench-"))
    first = Beater([], tmp / "0.key")
    bootstrap = [str(a) for a in first.runtime.visible_maddrs()]
    beaters = [first] + [Beater(bootstrap, tmp / f"{i}.key") for i in range(1, peers)]
    for i, beater in enumerate(beaters):
        beater.beat(1 + i)
    log = tmp / "page.log"
    page = subprocess.Popen([sys.executable, "-m", "swarmnode", "status", "--serve", "0", "--initial-peers", bootstrap[0]],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"), start_new_session=True)
    browser = _browser()
    try:
        _wait(lambda: re.search(r"http://127\.0\.0\.1:\d+/", log.read_text()), 120, "the page's address", 0.2)
        url = re.search(r"http://127\.0\.0\.1:\d+/", log.read_text()).group(0)
        opened = []
        for _ in range(5):
            browser.get("about:blank")
            started = time.monotonic()
            browser.get(url)
            opened.append(time.monotonic() - started + _wait(lambda: _rows_shown(browser) >= peers, 60, "every row"))
        print(f"{peers} peers shown after opening the page: median {statistics.median(opened):.2f} s "
              f"(opens: {', '.join(f'{s:.2f}' for s in opened)})")
        watched = beaters[-1]
        cell = f"#peers tr[data-peer='{watched.runtime.peer_id}'] td:nth-child(10)"  # the round column
        latencies = []
        for k in range(beats):
            round_ = 10_000 + k
            started = time.monotonic()  # from the start of its store: what a node's beat costs is counted
            watched.beat(round_)
            latencies.append(time.monotonic() - started + _wait(lambda r=round_: browser.execute_script(
                f"const c = document.querySelector(\"{cell}\"); return c && c.textContent") == str(r), 30,
                f"round {round_} on the page"))
            time.sleep(1.0)
        print(f"a heartbeat on the page after it was stored: median {statistics.median(latencies):.2f} s, "
              f"largest {max(latencies):.2f} s over {beats}")
        memory = psutil.Process(page.pid).memory_full_info()
        print(f"the page process (status client and page): RSS {memory.rss / 2**20:.0f} MiB, "
              f"USS {memory.uss / 2**20:.0f} MiB (its p2p daemon apart)")
    finally:
        browser.quit()
        page.terminate()
        page.wait(timeout=30)
        for beater in beaters:
            beater.runtime.shutdown()


def _junk_row(index: int) -> PeerRow:
    longest = "x" * 256
    beat = Heartbeat(
        peer=f"junk{index:0124d}", run="r" * 64, time=time.time(), round=index, model=longest, tokenizer="t" * 64,
        backend="b" * 32, device="d" * 32, version="v" * 32, reach="r" * 16, reward=0.5, eval_acc=0.5,
        evals=[0.5] * EVAL_HISTORY, used={f"u{index}-{n:0120d}": n for n in range(MAX_USED_NAMED)},
    )
    return PeerRow(beat, 0.0, "training", True, None, None)


def bench_crowd(identities: int, reads: int, per_read: int) -> None:
    process = psutil.Process()
    page = SwarmPage()
    server = serve(page, PageAddress("127.0.0.1", 0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api/swarm"
    before = process.memory_full_info()
    highest_rss, highest_uss, answer_bytes = before.rss, before.uss, 0
    for read in range(reads):
        page.observe([_junk_row((read * per_read + i) % identities) for i in range(per_read)])
        with urllib.request.urlopen(url) as answer:
            answer_bytes = len(answer.read())
        now = process.memory_full_info()
        highest_rss, highest_uss = max(highest_rss, now.rss), max(highest_uss, now.uss)
    server.shutdown()
    mib = 1024 * 1024
    print(f"{identities} junk identities, {reads} reads of {per_read}: RSS {before.rss / mib:.0f} MiB before, "
          f"{highest_rss / mib:.0f} MiB at most; USS {before.uss / mib:.0f} MiB before, {highest_uss / mib:.0f} MiB "
          f"at most; {len(page.history)} peers kept; one /api/swarm answer {answer_bytes / 1e6:.2f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="bench", required=True)
    opened = commands.add_parser("open", help="page latency against a real local swarm")
    opened.add_argument("--peers", type=int, default=20)
    opened.add_argument("--beats", type=int, default=10)
    crowd = commands.add_parser("crowd", help="the page's memory under a crowd of junk identities")
    crowd.add_argument("--identities", type=int, default=10_000)
    crowd.add_argument("--reads", type=int, default=100)
    crowd.add_argument("--per-read", type=int, default=500)
    args = parser.parse_args()
    if args.bench == "open":
        bench_open(args.peers, args.beats)
    else:
        bench_crowd(args.identities, args.reads, args.per_read)


if __name__ == "__main__":
    main()
