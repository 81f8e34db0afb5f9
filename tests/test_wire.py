import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.protocol import wire
from swarmnode.protocol.records import WIRE_VERSION
from swarmnode.protocol.wire import CompletionGroup, RolloutBatch, WireError
from swarmnode.settings.config import WireSettings


def make_batch(groups: int = 2, per_group: int = 12, length: int = 256, seed: int = 0) -> RolloutBatch:
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        lengths = np.full(per_group, length, dtype=np.int64)
        n = int(lengths.sum())
        out.append(
            CompletionGroup(
                prompt_id=1000 + g,
                lengths=lengths,
                tokens=rng.integers(0, 151_000, n).astype(np.int32),
                logprobs=(-rng.exponential(2.0, n)).astype(np.float32),
            )
        )
    return RolloutBatch(
        "run-abc", "peer-1", 7, "ab" * 32, out
    )


def assert_same(a: RolloutBatch, b: RolloutBatch) -> None:
    assert (a.run_id, a.peer_id, a.round, a.tokenizer_digest) == (
        b.run_id,
        b.peer_id,
        b.round,
        b.tokenizer_digest,
    )
    assert len(a.groups) == len(b.groups)
    for x, y in zip(a.groups, b.groups):
        assert x.prompt_id == y.prompt_id
        assert np.array_equal(x.lengths, y.lengths)
        assert x.tokens.tobytes() == y.tokens.tobytes()
        assert x.logprobs.tobytes() == y.logprobs.tobytes()  # bit-exact


def test_eight_bytes_per_token_and_small_header():
    batch = make_batch(groups=2, per_group=12, length=256)
    data = wire.encode(batch)
    payload = batch.num_tokens * wire.BYTES_PER_TOKEN
    assert batch.num_tokens == 24 * 256
    assert (len(data) - payload) / payload <= 0.02
    assert_same(batch, wire.decode(data))


@st.composite
def batches(draw):
    groups = []
    ids = draw(st.lists(st.integers(0, 2**63 - 1), max_size=6, unique=True))
    for pid in ids:
        lengths = draw(st.lists(st.integers(1, 40), min_size=1, max_size=8))
        n = sum(lengths)
        tokens = draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n))
        logps = draw(
            st.lists(
                st.floats(max_value=0.0, width=32, allow_nan=False, allow_infinity=False),
                min_size=n,
                max_size=n,
            )
        )
        groups.append(
            CompletionGroup(
                pid,
                np.array(lengths, dtype=np.int64),
                np.array(tokens, dtype=np.int32),
                np.array(logps, dtype=np.float32),
            )
        )
    text = st.text(min_size=1, max_size=40)
    return RolloutBatch(
        draw(text),
        draw(text),
        draw(st.integers(0, 2**40)),
        draw(st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)),
        groups,
    )


@given(batches())
@settings(max_examples=150, deadline=None)
def test_round_trip_is_bit_exact(batch):
    assert_same(batch, wire.decode(wire.encode(batch)))


@given(batches(), st.data())
@settings(max_examples=300, deadline=None)
def test_mutated_or_truncated_bytes_raise_only_wire_error(batch, data):
    raw = bytearray(wire.encode(batch))
    action = data.draw(st.sampled_from(["truncate", "flip", "append", "splice"]))
    if action == "truncate":
        raw = raw[: data.draw(st.integers(0, max(len(raw) - 1, 0)))]
    elif action == "flip" and raw:
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= data.draw(st.integers(1, 255))
    elif action == "append":
        raw += data.draw(st.binary(min_size=1, max_size=64))
    else:
        i = data.draw(st.integers(0, len(raw)))
        raw[i:i] = data.draw(st.binary(min_size=1, max_size=16))
    try:
        decoded = wire.decode(bytes(raw))
    except WireError:
        return
    # A mutation can still yield a valid message (e.g. a flipped token id); it must re-encode.
    assert_same(decoded, wire.decode(wire.encode(decoded)))


@given(st.binary(max_size=512))
@settings(max_examples=300, deadline=None)
def test_random_bytes_raise_only_wire_error(raw):
    with pytest.raises(WireError):
        wire.decode(wire.MAGIC + raw)


def _limits(**changed) -> WireSettings:
    """Settings with limits below what validation allows a user, to hit them with small messages."""
    return WireSettings().model_copy(update=changed)


def test_limits_are_enforced_before_allocation():
    data = wire.encode(make_batch(groups=2, per_group=4, length=8))
    with pytest.raises(WireError, match="exceeds the limit"):
        wire.decode(data, _limits(max_bytes=len(data) - 1))
    with pytest.raises(WireError, match="completions required"):
        wire.decode(data, WireSettings(max_completions_per_group=3))
    with pytest.raises(WireError, match="outside 1..7"):
        wire.decode(data, WireSettings(max_tokens_per_completion=7))
    with pytest.raises(WireError, match="tokens exceed"):
        wire.decode(data, WireSettings(max_total_tokens=63))
    with pytest.raises(WireError, match="outside the vocabulary"):
        wire.decode(data, WireSettings(), vocab_size=100)


GOOD_HEADER = {"v": WIRE_VERSION, "run": "r", "peer": "p", "round": 0, "tok": "0" * 64, "hub": ""}


def raw_message(header: dict) -> bytes:
    """Prefix plus a hand-made msgpack header, padded to 8 bytes, no arrays."""
    import msgpack

    packed = msgpack.packb(header)
    raw = wire._PREFIX.pack(wire.MAGIC, len(packed)) + packed
    return raw + b"\0" * ((-len(raw)) % 8)


def test_header_that_claims_huge_sizes_is_rejected_without_allocating():
    raw = raw_message(dict(GOOD_HEADER, groups=[[i, [8192] * 64] for i in range(4)]))
    with pytest.raises(WireError, match="tokens exceed"):
        wire.decode(raw, WireSettings(max_total_tokens=1000))


@pytest.mark.parametrize("bad,reason", [(np.nan, "non-finite"), (np.inf, "non-finite"), (0.5, "above 0")])
def test_bad_logprobs_rejected(bad, reason):
    batch = make_batch(groups=1, per_group=2, length=4)
    batch.groups[0].logprobs[3] = bad
    with pytest.raises(WireError, match=reason):
        wire.decode(wire.encode(batch))


def test_inconsistent_batch_cannot_be_encoded():
    batch = make_batch(groups=1, per_group=2, length=4)
    batch.groups[0].lengths[0] = 5
    with pytest.raises(WireError):
        wire.encode(batch)


def test_decoder_rejects_wrong_types_in_header():
    good = dict(GOOD_HEADER, groups=[])
    for key, value in [
        ("v", WIRE_VERSION + 1),
        ("v", 1),  # the version that carried the sender's model info
        ("policy", ["m", 1, None, "hf"]),  # no longer a field: unknown keys are refused
        ("round", -1),
        ("round", True),
        ("run", ""),
        ("groups", [[1, []]]),
        ("groups", [[1, [1]], [1, [1]]]),
        ("extra", 1),
        ("hub", None),
        ("hub", "no-org"),
        ("hub", "org/name@"),
        ("hub", "org/na me"),
        ("hub", "../../etc/passwd"),
    ]:
        raw = raw_message(dict(good, **{key: value})) + (b"\0" * 8 if key == "groups" else b"")
        with pytest.raises(WireError):
            wire.decode(raw)


@pytest.mark.parametrize("hub", ["", "Qwen/Qwen2.5-3B", "meta-llama/Llama-3.2-1B@main", "org/m@refs/pr/1"])
def test_a_batch_names_the_hub_id_its_tokenizer_came_from_or_none(hub):
    batch = make_batch(groups=1, per_group=2, length=4)
    batch.tokenizer_hub = hub
    assert wire.decode(wire.encode(batch)).tokenizer_hub == hub
