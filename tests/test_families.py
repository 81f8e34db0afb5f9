"""Tokenizer documents and the families a node reads: what crosses the wire once per family,
how it is checked, and the rule that bounds what a crowd can make a node fetch."""

from __future__ import annotations

import threading
import zlib
from pathlib import Path

import msgpack
import pytest

from swarmnode.model import families
from swarmnode.model.families import BadTokenizer, Families, tokenizer_document, tokenizer_from_document
from swarmnode.model.hub_tokenizers import (
    LOAD_WINDOW_S,
    MAX_HUB_TOKENIZER_BYTES,
    MAX_LOADS_PER_WINDOW,
    HubTokenizers,
    hub_document,
)
from swarmnode.model.hub_tokenizers import MAX_WAITING as MAX_HUB_WAITING
from swarmnode.model.tiny import TINY_LLAMA_SPEC, TINY_SPEC, build_tokenizer
from swarmnode.protocol.records import tokenizer_document_digest
from swarmnode.swarm.tokenizer_wants import MAX_DIGESTS_PER_PEER, MAX_WAITING, RETRY_S, TokenizerWants

TEXT = "<answer>12345</answer> and 7 + 8 = 15\n"


@pytest.mark.parametrize("spec", [TINY_SPEC, TINY_LLAMA_SPEC], ids=["tiny", "tiny-llama"])
def test_a_tokenizer_document_loads_into_a_tokenizer_that_reads_tokens_as_the_sender_s(spec):
    sender = build_tokenizer(spec)
    loaded = tokenizer_from_document(tokenizer_document(sender))
    ids = sender(TEXT, add_special_tokens=False)["input_ids"] + [sender.eos_token_id]
    assert loaded.decode(ids) == sender.decode(ids) and loaded.eos_token_id == sender.eos_token_id
    assert loaded(TEXT, add_special_tokens=False)["input_ids"] == ids[:-1]


def _document(json_text: bytes, eos: object = 0) -> bytes:
    return msgpack.packb({"json": zlib.compress(json_text), "eos": eos})


def test_what_is_no_tokenizer_is_refused_with_a_clear_error_and_a_json_bomb_within_its_bound(monkeypatch):
    honest = build_tokenizer(TINY_SPEC).backend_tokenizer.to_str().encode()
    for bad in [b"", b"\x93\x01\x02\x03", msgpack.packb({"json": b"not zlib", "eos": 0}), _document(b"{not json"),
                _document(honest, eos=10**9), _document(honest, eos=5000), _document(honest, eos="0"),
                _document(honest, eos=[None] * 1000), msgpack.packb({"json": zlib.compress(honest)})]:
        with pytest.raises(BadTokenizer):
            tokenizer_from_document(bad)
    monkeypatch.setattr(families, "MAX_JSON_BYTES", len(honest) - 1)
    with pytest.raises(BadTokenizer, match="beyond"):  # inflating past the bound stops there
        tokenizer_from_document(_document(honest))
    monkeypatch.setattr(families, "MAX_TOKENIZER_DOCUMENT_BYTES", 100)
    with pytest.raises(BadTokenizer, match="bytes"):
        tokenizer_from_document(_document(honest))


def test_a_node_learns_a_fetched_family_once_reads_its_own_vocabulary_as_its_own_and_keeps_the_recent_ones(monkeypatch):
    tiny, llama = build_tokenizer(TINY_SPEC), build_tokenizer(TINY_LLAMA_SPEC)
    known = Families(tiny, presets=False)
    document = tokenizer_document(llama)
    digest = tokenizer_document_digest(document)
    assert known.get(digest) is None, "without presets, a node knows only its own tokenizer"
    family = known.learn(digest, document)
    assert family is known.get(digest) and family.fingerprint != known.own.fingerprint and not known.is_own(family)
    assert family.vocab_size == len(llama) and known.learned == 1
    assert known.learn(digest, document) is family and known.learned == 1, "learned once"
    # our own tokenizer serialised otherwise (another version of the library): another digest, read as ours
    restyled = msgpack.packb({"json": zlib.compress(tiny.backend_tokenizer.to_str(pretty=True).encode()), "eos": 0})
    same = known.learn(tokenizer_document_digest(restyled), restyled)
    assert tokenizer_document_digest(restyled) != known.own.digest and known.is_own(same)
    assert known.learn("junk", b"junk") is None and "junk" in known.unreadable
    # a crowd's families make way for newer ones in turn: none locks a real family out
    monkeypatch.setattr(families, "MAX_FAMILIES", 2)
    known.get(digest)  # read lately: kept
    other = tokenizer_document(build_tokenizer({**TINY_LLAMA_SPEC, "vocab_size": 700}))
    newest = known.learn(tokenizer_document_digest(other), other)
    assert newest is not None and newest.vocab_size != family.vocab_size
    assert known.get(digest) is family and known.get(tokenizer_document_digest(restyled)) is None, "the least recently read went"


def test_the_presets_are_known_without_a_fetch():
    known = Families(build_tokenizer(TINY_SPEC))
    llama = tokenizer_document_digest(tokenizer_document(build_tokenizer(TINY_LLAMA_SPEC)))
    assert known.get(llama) is not None and known.learned == 0


def test_a_digest_is_asked_of_one_peer_at_a_time_known_peers_first_and_a_crowd_of_names_is_bounded():
    now = [0.0]
    wants = TokenizerWants(clock=lambda: now[0])
    wants.want("a", "d1")
    wants.want("b", "d1")
    assert wants.next() == ("a", "d1") and wants.next() is None, "one fetch at a time"
    wants.settle(fetched=False)  # a failed: the next peer that named it is asked
    assert wants.next() == ("b", "d1")
    wants.settle(fetched=True)
    wants.want("c", "d1")
    assert wants.next() is None, "a fetched digest is not asked again"
    for i in range(MAX_DIGESTS_PER_PEER + 3):  # one identity naming ever new tokenizers
        wants.want("liar", f"junk{i}")
        if wants.next() is not None:
            wants.settle(fetched=False)
    assert wants._per_peer["liar"] == MAX_DIGESTS_PER_PEER
    crowd = TokenizerWants(clock=lambda: now[0])
    for i in range(1000):
        crowd.want(f"id{i}", f"digest{i}")
    crowd.want("honest", "real")  # the queue is full of strangers' digests ...
    assert len(crowd._waiting) <= MAX_WAITING and "real" not in crowd._waiting
    crowd._waiting.popitem(last=False)
    crowd.want("honest", "real")
    assert crowd.next(known=lambda peer: peer == "honest") == ("honest", "real"), "... a known peer's goes first"
    crowd.settle(fetched=False)
    crowd.want("honest", "real")
    assert crowd.next(known=lambda peer: peer == "honest") != ("honest", "real")
    crowd.settle(fetched=False)
    now[0] += RETRY_S  # a failed fetch (a busy peer, a restart) is tried again later, and so is a forgotten family
    crowd.want("honest", "real")
    wants.want("c", "d1")
    assert crowd.next(known=lambda peer: peer == "honest") == ("honest", "real") and wants.next() == ("c", "d1")


def test_the_hub_path_rebuilds_a_document_checks_its_digest_and_says_when_the_sender_must_be_asked():
    document = tokenizer_document(build_tokenizer(TINY_LLAMA_SPEC))
    digest = tokenizer_document_digest(document)
    assert not HubTokenizers(offline=True, fetch=lambda hub: document).want(digest, "org/llama"), "hub off: the sender"
    calls = []
    hub = HubTokenizers(offline=False, fetch=lambda name: calls.append(name) or document)
    assert not hub.want(digest, ""), "no hub id: the sender"
    assert hub.want(digest, "org/llama") and hub.want(digest, "org/llama")
    hub.join()
    assert hub.ready() == [(digest, document)] and calls == ["org/llama"], "rebuilt once"
    assert hub.want(digest, "org/llama"), "learned and then forgotten by the families: it may be rebuilt"
    hub.join()
    assert hub.ready() == [(digest, document)] and len(calls) == 2
    for fetch in (lambda name: b"other bytes", lambda name: (_ for _ in ()).throw(OSError("hub unreachable"))):
        failing = HubTokenizers(offline=False, fetch=fetch)
        assert failing.want(digest, "org/llama")
        failing.join()
        assert failing.ready() == [] and not failing.want(digest, "org/llama"), "failed: the sender is asked"


def test_a_crowd_of_hub_ids_fills_a_bounded_queue_and_window_and_its_overflow_goes_to_the_senders():
    release = threading.Event()
    hub = HubTokenizers(offline=False, fetch=lambda name: release.wait(5) and b"")
    asked = [hub.want(f"{k:064x}", f"crowd/m{k}") for k in range(MAX_HUB_WAITING + 5)]
    release.set()
    hub.join()
    assert asked.count(False) >= 4 and asked[0] and asked[MAX_HUB_WAITING - 1]
    now = [0.0]
    windowed = HubTokenizers(offline=False, fetch=lambda name: b"")
    windowed._clock = lambda: now[0]
    begun = []
    for k in range(3 * MAX_LOADS_PER_WINDOW):
        begun.append(windowed.want(f"{k:064x}", f"crowd/m{k}"))
        windowed.join()
    assert sum(begun) == MAX_LOADS_PER_WINDOW, "a window's loads, then the senders"
    now[0] += LOAD_WINDOW_S
    assert windowed.want(f"{10**6:064x}", "crowd/later"), "a new window"


class _Sibling:
    def __init__(self, name: str, size: int) -> None:
        self.rfilename, self.size = name, size


class _Api:
    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes

    def model_info(self, repo, revision=None, files_metadata=False, timeout=None):
        return type("Info", (), {"sha": "c0ffee", "siblings": [_Sibling(n, s) for n, s in self.sizes.items()]})()


def test_a_hub_tokenizer_is_downloaded_from_the_listed_commit_only_its_tokenizer_files_within_the_bound():
    downloads = []
    huge = _Api({"tokenizer.json": MAX_HUB_TOKENIZER_BYTES, "config.json": 10, "model.safetensors": 10**10})
    with pytest.raises(ValueError, match="bytes"):
        hub_document("org/huge", api=huge, download=lambda *a, **k: downloads.append(k))
    assert downloads == []
    tokenizer = build_tokenizer(TINY_LLAMA_SPEC)
    folders = []

    def download(repo, revision, allow_patterns, local_dir):
        downloads.append((repo, revision, sorted(allow_patterns)))
        folders.append(local_dir)

    api = _Api({"tokenizer.json": 5000, "config.json": 10, "model.safetensors": 10**10, "extra/evil.json": 10**9})
    built = hub_document("org/m@v1", api=api, download=download, load=lambda folder, rev: tokenizer)
    assert built == tokenizer_document(tokenizer)
    assert downloads == [("org/m", "c0ffee", ["config.json", "tokenizer.json"])], "the listed commit, tokenizer files"
    assert not Path(folders[0]).exists(), "the temporary directory is gone"
