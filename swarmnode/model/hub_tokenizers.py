"""Peers' tokenizers rebuilt from the Hugging Face hub, by the hub id their batches name.

A batch names its tokenizer by its document's digest and, when its model came from the hub,
by the hub id (and revision) it came from (swarmnode.protocol.wire). Loading that id the way a
node loads its own tokenizer (policy.load_tokenizer) rebuilds the very document when both
nodes run the same tokenizers and transformers versions. The digest decides: a rebuilt
document that hashes to the name is learned; one that does not (another library version, a
repository that changed, a peer naming someone else's model) is dropped, and the batch's
sender is asked for the document instead (swarmnode.swarm.tokenizer_wants). So the hub id is
a hint that spares peers' bandwidth, never something trusted: a false one costs one bounded
fetch, no strike (the sender may simply run other library versions).

Bounds: one load at a time in a background thread; at most MAX_WAITING digests waiting and
MAX_LOADS_PER_WINDOW loads begun in LOAD_WINDOW_S (a crowd naming junk ids fills them, and the peer
fetch takes over); a digest that failed is not tried again; only the tokenizer files of the
repository's commit the hub names, at most MAX_HUB_TOKENIZER_BYTES by its listing, are
downloaded, into a temporary directory that is removed after (nothing piles up in the hub
cache), and loaded from there; nothing at all when the hub is off (HF_HUB_OFFLINE).
"""

from __future__ import annotations

import logging
import queue
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable

from huggingface_hub import HfApi, snapshot_download
from transformers import PreTrainedTokenizerBase

from swarmnode.model.families import tokenizer_document
from swarmnode.model.policy import load_tokenizer
from swarmnode.protocol.records import tokenizer_document_digest

log = logging.getLogger(__name__)

MAX_WAITING = 8  # digests queued for the hub at once; past that, the sender is asked
MAX_LOADS_PER_WINDOW = 16  # hub loads begun within LOAD_WINDOW_S; past that, the sender is asked
LOAD_WINDOW_S = 600.0  # the window MAX_LOADS_PER_WINDOW counts loads in
MAX_TRIED = 1024  # digests remembered as tried (past that, the oldest may be tried again)
MAX_HUB_TOKENIZER_BYTES = 64 << 20  # the tokenizer files a hub load downloads, in all
# what AutoTokenizer may download for a repository; the rest of it (the weights) it never reads
TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "config.json",
    "chat_template.jinja", "chat_template.json",
})


def split_hub_name(hub: str) -> tuple[str, str | None]:
    """'org/name@rev' -> ('org/name', 'rev'); no '@': the default branch."""
    repo, _, revision = hub.partition("@")
    return repo, revision or None


def hub_document(hub: str, api: HfApi | None = None, download: Callable[..., str] = snapshot_download,
                 load: Callable[[str, str | None], PreTrainedTokenizerBase] = load_tokenizer) -> bytes:
    """The tokenizer document of hub id `hub`, built as its own node builds it, from the
    tokenizer files of the commit the hub lists (checked in size first) downloaded into a
    temporary directory; ValueError when they are too large, the hub's errors when it cannot
    be had."""
    repo, revision = split_hub_name(hub)
    info = (api or HfApi()).model_info(repo, revision=revision, files_metadata=True, timeout=10)
    files = [f for f in info.siblings or () if f.rfilename in TOKENIZER_FILES]
    size = sum(f.size or 0 for f in files)
    if size > MAX_HUB_TOKENIZER_BYTES:
        raise ValueError(f"its tokenizer files are {size} bytes (at most {MAX_HUB_TOKENIZER_BYTES})")
    with tempfile.TemporaryDirectory(prefix="swarmnode-tokenizer-") as folder:
        download(repo, revision=info.sha, allow_patterns=[f.rfilename for f in files], local_dir=folder)
        return tokenizer_document(load(folder, None))


class HubTokenizers:
    """The background loads: `want` as batches name (digest, hub id), `ready` for the documents
    that hashed to their digest. `fetch` (hub id -> document) is injectable for tests."""

    def __init__(self, offline: bool, fetch: Callable[[str], bytes] = hub_document) -> None:
        self.offline = offline
        self._fetch = fetch
        self._jobs: queue.Queue[tuple[str, str]] = queue.Queue()
        self._done: list[tuple[str, bytes | None]] = []  # (digest, its document or None), from the worker
        self._lock = threading.Lock()
        self._tried: dict[str, bool] = {}  # digest -> True while queued, False once it failed
        self._begun: deque[float] = deque()  # when loads were asked for, within LOAD_WINDOW_S
        self._worker: threading.Thread | None = None
        self._clock = time.monotonic

    def want(self, digest: str, hub: str) -> bool:
        """Rebuild `digest` from hub id `hub`: True while that is under way, False when the hub
        cannot help (off, no id, tried and failed, the queue or the window's loads full): ask
        the sender."""
        if self.offline or not hub:
            return False
        if digest in self._tried:
            return self._tried[digest]
        now = self._clock()
        while self._begun and now - self._begun[0] >= LOAD_WINDOW_S:
            self._begun.popleft()
        if self._jobs.qsize() >= MAX_WAITING or len(self._begun) >= MAX_LOADS_PER_WINDOW:
            return False
        self._begun.append(now)
        if len(self._tried) >= MAX_TRIED:
            del self._tried[next(iter(self._tried))]
        self._tried[digest] = True
        self._jobs.put((digest, hub))
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name="hub-tokenizers", daemon=True)
            self._worker.start()
        return True

    def ready(self) -> list[tuple[str, bytes]]:
        """Documents rebuilt since the last call whose bytes hash to the digest they were
        wanted for; the others are marked failed, so the next batch naming them asks its sender.
        A rebuilt digest is forgotten here: should the families forget it, it may be rebuilt."""
        with self._lock:
            done, self._done = self._done, []
        found = []
        for digest, document in done:
            if document is None:
                self._tried[digest] = False
            else:
                self._tried.pop(digest, None)
                found.append((digest, document))
        return found

    def join(self) -> None:
        """Block until every load asked for so far has ended."""
        self._jobs.join()

    def _run(self) -> None:
        while True:
            digest, hub = self._jobs.get()
            document = self._rebuild(digest, hub)
            with self._lock:
                self._done.append((digest, document))
            self._jobs.task_done()

    def _rebuild(self, digest: str, hub: str) -> bytes | None:
        try:
            document = self._fetch(hub)
        except Exception as err:  # the hub's errors, a too large tokenizer, files that break a loader: a hint that failed
            log.info("tokenizer %s: the hub could not give %s (%s: %s): asking its sender",
                     digest[:16], hub, type(err).__name__, str(err)[:200])
            return None
        if tokenizer_document_digest(document) != digest:
            log.info("tokenizer %s: %s on the hub is another document (other library versions, or a "
                     "changed repository): asking its sender", digest[:16], hub)
            return None
        return document
