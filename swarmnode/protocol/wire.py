"""The rollout wire format: the only module that knows the byte layout.

A message is::

    magic b"SNRB" | u32 LE header length | msgpack header | zero padding to 8 bytes
    | int32 LE token ids (one per completion token)
    | float32 LE generation log-probs (one per completion token)

so each completion token costs exactly 8 bytes and the header is a few hundred bytes.
Decoding is strict: anything malformed raises `WireError` with a reason, and every size is
checked against the node's `wire` settings before anything is allocated.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

import msgpack
import numpy as np

from swarmnode.protocol.records import WIRE_VERSION
from swarmnode.settings.config import WireSettings

MAGIC = b"SNRB"
MAX_HEADER_BYTES = 64 * 1024
MAX_STRING_LEN = 256
_PREFIX = struct.Struct("<4sI")
_ALIGN = 8
_TOKEN_DTYPE = np.dtype("<i4")
_LOGPROB_DTYPE = np.dtype("<f4")
BYTES_PER_TOKEN = _TOKEN_DTYPE.itemsize + _LOGPROB_DTYPE.itemsize
# a hub repository id, optionally @revision (a branch, tag or commit; branches may hold '/')
HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9_.-]{1,96}(@[A-Za-z0-9_./-]{1,64})?")


class WireError(ValueError):
    """A message that cannot be accepted; `str(err)` says why."""


@dataclass(frozen=True)
class Completion:
    """One sampled completion, as every part of a node sees it, from its generator to the loss:
    its token ids and the generator's log-probability of each (log pi_gen)."""

    tokens: np.ndarray  # int32
    logprobs: np.ndarray  # float32
    finished: bool | None = None  # ended with EOS (False: cut at max_new_tokens); None: not known (a peer's)


@dataclass
class CompletionGroup:
    """The G completions one generator sampled for one prompt.

    `tokens` and `logprobs` hold the whole group's tokens back to back; `lengths` splits them.
    """

    prompt_id: int
    lengths: np.ndarray  # int64, one entry per completion
    tokens: np.ndarray  # int32
    logprobs: np.ndarray  # float32

    def completions(self) -> list[Completion]:
        """Each completion, as views into the group's arrays."""
        bounds = np.concatenate([[0], np.cumsum(self.lengths)])
        return [Completion(self.tokens[a:b], self.logprobs[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

    @classmethod
    def of(cls, prompt_id: int, completions: list[Completion]) -> CompletionGroup:
        """One generator's completions for one prompt, laid out for the wire."""
        return cls(
            prompt_id=prompt_id,
            lengths=np.array([len(c.tokens) for c in completions], dtype=np.int64),
            tokens=np.concatenate([c.tokens for c in completions]).astype(np.int32),
            logprobs=np.concatenate([c.logprobs for c in completions]).astype(np.float32),
        )


@dataclass
class RolloutBatch:
    """One node's published rollouts for one round."""

    run_id: str
    peer_id: str
    round: int
    tokenizer_digest: str  # its sender's tokenizer document's SHA-256 (swarmnode.model.families)
    groups: list[CompletionGroup] = field(default_factory=list)
    tokenizer_hub: str = ""  # the hub id (@revision) its tokenizer came from, a hint: "" for none

    @property
    def num_tokens(self) -> int:
        return int(sum(int(g.lengths.sum()) for g in self.groups))

    @property
    def num_completions(self) -> int:
        return sum(len(g.lengths) for g in self.groups)


def encode(batch: RolloutBatch) -> bytes:
    """Serialise a batch; raises `WireError` if the batch is internally inconsistent."""
    for group in batch.groups:
        n = int(np.sum(group.lengths))
        if len(group.tokens) != n or len(group.logprobs) != n:
            raise WireError(f"group {group.prompt_id}: lengths do not match the token arrays")
    header = {
        "v": WIRE_VERSION,
        "run": batch.run_id,
        "peer": batch.peer_id,
        "round": int(batch.round),
        "tok": batch.tokenizer_digest,
        "hub": batch.tokenizer_hub,
        "groups": [[int(g.prompt_id), [int(x) for x in g.lengths]] for g in batch.groups],
    }
    header_bytes = msgpack.packb(header, use_bin_type=True)
    pad = (-(_PREFIX.size + len(header_bytes))) % _ALIGN
    parts = [_PREFIX.pack(MAGIC, len(header_bytes)), header_bytes, b"\0" * pad]
    if batch.groups:
        parts.append(np.concatenate([g.tokens for g in batch.groups]).astype(_TOKEN_DTYPE).tobytes())
        parts.append(np.concatenate([g.logprobs for g in batch.groups]).astype(_LOGPROB_DTYPE).tobytes())
    return b"".join(parts)


def decode(
    data: bytes | bytearray | memoryview, limits: WireSettings | None = None, vocab_size: int | None = None
) -> RolloutBatch:
    """Parse and validate a message against `limits`; every failure is a `WireError`.

    With `vocab_size`, every token id must be below it."""
    limits = limits or WireSettings()
    buf = memoryview(data).cast("B")
    if len(buf) > limits.max_bytes:
        raise WireError(f"message of {len(buf)} bytes exceeds the limit of {limits.max_bytes}")
    if len(buf) < _PREFIX.size:
        raise WireError("message shorter than its fixed prefix")
    magic, header_len = _PREFIX.unpack_from(buf, 0)
    if magic != MAGIC:
        raise WireError("bad magic: not a swarmnode rollout message")
    if header_len > MAX_HEADER_BYTES:
        raise WireError(f"header of {header_len} bytes exceeds {MAX_HEADER_BYTES}")
    body_start = _PREFIX.size + header_len
    if body_start > len(buf):
        raise WireError("truncated header")
    header = _unpack_header(bytes(buf[_PREFIX.size : body_start]), limits)
    fields = _check_header(header, limits)
    lengths_per_group = [lengths for _, lengths in fields["groups"]]
    total = sum(sum(lengths) for lengths in lengths_per_group)
    if total > limits.max_total_tokens:
        raise WireError(f"{total} tokens exceed the limit of {limits.max_total_tokens}")
    arrays_start = body_start + (-body_start) % _ALIGN
    if bytes(buf[body_start:arrays_start]).strip(b"\0"):
        raise WireError("non-zero header padding")
    expected = arrays_start + total * BYTES_PER_TOKEN
    if len(buf) != expected:
        raise WireError(f"message is {len(buf)} bytes, header implies {expected}")
    tokens = np.frombuffer(buf, dtype=_TOKEN_DTYPE, count=total, offset=arrays_start)
    logprobs = np.frombuffer(buf, dtype=_LOGPROB_DTYPE, count=total, offset=arrays_start + total * 4)
    _check_arrays(tokens, logprobs, vocab_size)
    groups: list[CompletionGroup] = []
    offset = 0
    for prompt_id, lengths in fields["groups"]:
        n = sum(lengths)
        groups.append(
            CompletionGroup(
                prompt_id=prompt_id,
                lengths=np.asarray(lengths, dtype=np.int64),
                tokens=tokens[offset : offset + n],
                logprobs=logprobs[offset : offset + n],
            )
        )
        offset += n
    return RolloutBatch(
        run_id=fields["run"],
        peer_id=fields["peer"],
        round=fields["round"],
        tokenizer_digest=fields["tok"],
        groups=groups,
        tokenizer_hub=fields["hub"],
    )


def _unpack_header(raw: bytes, limits: WireSettings) -> object:
    try:
        return msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=MAX_STRING_LEN,
            max_bin_len=0,
            max_array_len=max(limits.max_groups, limits.max_completions_per_group, 4),
            max_map_len=16,
            max_ext_len=0,
        )
    except Exception as err:  # msgpack raises many types; all mean "malformed"
        raise WireError(f"malformed header: {type(err).__name__}: {err}") from None


def _is_digest(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_header(header: object, limits: WireSettings) -> dict:
    if not isinstance(header, dict):
        raise WireError("header is not a map")
    expected_keys = {"v", "run", "peer", "round", "tok", "hub", "groups"}
    if set(header) != expected_keys:
        raise WireError(f"header keys {sorted(map(str, header))} != {sorted(expected_keys)}")
    if header["v"] != WIRE_VERSION:
        raise WireError(f"unsupported format version {header['v']!r}")
    for key in ("run", "peer", "tok"):
        if not isinstance(header[key], str) or not header[key]:
            raise WireError(f"header field {key!r} must be a non-empty string")
    if not _is_digest(header["tok"]):
        raise WireError("header field 'tok' must be a SHA-256 digest (64 lowercase hex characters)")
    if not isinstance(header["hub"], str) or (header["hub"] and not HUB_NAME.fullmatch(header["hub"])):
        raise WireError("header field 'hub' must be empty or a hub id (org/name, optionally @revision)")
    if not _is_int(header["round"]) or not 0 <= header["round"] < 2**53:
        raise WireError("round must be a non-negative integer")
    groups = header["groups"]
    if not isinstance(groups, list) or len(groups) > limits.max_groups:
        raise WireError(f"groups must be a list of at most {limits.max_groups}")
    seen: set[int] = set()
    for group in groups:
        if not (isinstance(group, list) and len(group) == 2 and _is_int(group[0])):
            raise WireError("each group must be [prompt_id, [lengths]]")
        prompt_id, lengths = group
        if not 0 <= prompt_id < 2**63 or prompt_id in seen:
            raise WireError(f"prompt id {prompt_id} out of range or repeated")
        seen.add(prompt_id)
        if not isinstance(lengths, list) or not 1 <= len(lengths) <= limits.max_completions_per_group:
            raise WireError(f"group {prompt_id}: 1..{limits.max_completions_per_group} completions required")
        for length in lengths:
            if not _is_int(length) or not 1 <= length <= limits.max_tokens_per_completion:
                raise WireError(
                    f"group {prompt_id}: completion length {length!r} outside "
                    f"1..{limits.max_tokens_per_completion}"
                )
    return header


def _check_arrays(tokens: np.ndarray, logprobs: np.ndarray, vocab_size: int | None) -> None:
    if tokens.size == 0:
        return
    if int(tokens.min()) < 0:
        raise WireError("negative token id")
    if vocab_size is not None and int(tokens.max()) >= vocab_size:
        raise WireError(f"token id {int(tokens.max())} outside the vocabulary ({vocab_size})")
    if not np.all(np.isfinite(logprobs)):
        raise WireError("non-finite log-prob")
    if float(logprobs.max()) > 0.0:
        raise WireError("log-prob above 0")
