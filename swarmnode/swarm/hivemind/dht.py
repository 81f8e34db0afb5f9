"""What the swarm keeps in the DHT: small owned records (heartbeats, round manifests).

Every record sits in a subkey owned by its writer's RSA key (hivemind's RSASignatureValidator),
so only that peer can write it. `SwarmRecordValidator` adds the limits hivemind lacks: records
must be owned, small, and expire soon. Payloads never go in the DHT; a manifest only says where
and how big a payload is and what its digest is.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import msgpack
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.records import DHT_NAMESPACE, Heartbeat, RecordError
from swarmnode.swarm.hivemind.identity import peer_id_of_owner

HEARTBEAT_KEY = f"{DHT_NAMESPACE}/heartbeats"
MAX_RECORD_BYTES = 4096  # far below the 16 KiB line where hivemind's DHT pipe used to break
MAX_TTL_S = 3600.0
CLOCK_SLACK_S = 30.0
DIGEST_BYTES = 32
_OWNER_RE = re.compile(rb"\[owner:([^\]]+)\]")


def manifest_key(run_id: str) -> str:
    """The run's manifests: one owned subkey per peer, holding its newest batch's manifest."""
    return f"{DHT_NAMESPACE}/{run_id}/manifests"


def subkey_items(entry: Any) -> list[tuple[Any, Any]]:
    """(subkey, value) pairs of a dictionary entry as DHTNode.get returns it; none when the
    key is missing or holds a plain value."""
    if entry is None or not hasattr(entry.value, "items"):
        return []
    return [(subkey, item.value) for subkey, item in entry.value.items()]


def payload_digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=DIGEST_BYTES).digest()


def pack(fields: dict[str, Any]) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def unpack(raw: Any) -> dict[str, Any]:
    """Strictly decode a record value: bytes of a small msgpack map with string keys."""
    if not isinstance(raw, bytes) or len(raw) > MAX_RECORD_BYTES:
        raise RecordError("record value is not bytes of a bounded size")
    try:
        value = msgpack.unpackb(
            raw, raw=False, strict_map_key=True, max_bin_len=1024, max_str_len=1024,
            max_array_len=64, max_map_len=64, max_ext_len=0,
        )
    except (ValueError, msgpack.UnpackException) as err:
        raise RecordError(f"record value is not msgpack ({err})") from None
    if not isinstance(value, dict):
        raise RecordError("record value is not a map")
    return value


def owner_peer_id(subkey: Any) -> str:
    """The peer id whose key owns a subkey, from its '[owner:ssh-rsa ...]' marker."""
    if not isinstance(subkey, bytes):
        raise RecordError("subkey is not owned")
    found = _OWNER_RE.fullmatch(subkey)
    if not found:
        raise RecordError("subkey is not owned")
    try:
        return peer_id_of_owner(found.group(1))
    except (ValueError, TypeError) as err:
        raise RecordError(f"owner key is not an RSA public key ({err})") from None


@dataclass(frozen=True)
class Manifest:
    """A peer's announcement that its batch of its own round `round` is ready to download."""

    peer_id: str
    round: int
    size: int
    digest: bytes
    tokens: int

    def to_value(self) -> bytes:
        return pack(
            {"peer": self.peer_id, "round": self.round, "size": self.size, "digest": self.digest,
             "tokens": self.tokens}
        )

    @classmethod
    def from_record(cls, subkey: Any, raw: Any, max_bytes: int) -> Manifest:
        """Parse and check a manifest; the writer's key must be the peer it names."""
        owner = owner_peer_id(subkey)
        value = unpack(raw)
        peer, r, size = value.get("peer"), value.get("round"), value.get("size")
        digest, tokens = value.get("digest"), value.get("tokens")
        if peer != owner:
            raise RecordError(f"manifest names {peer!r} but is signed by {owner}")
        if not (isinstance(r, int) and 0 <= r < 2**62):
            raise RecordError(f"manifest round {r!r} is not a round number")
        if not (isinstance(size, int) and 0 < size <= max_bytes):
            raise RecordError(f"payload size {size!r} outside 1..{max_bytes}")
        if not (isinstance(digest, bytes) and len(digest) == DIGEST_BYTES):
            raise RecordError("manifest digest is malformed")
        if not (isinstance(tokens, int) and tokens >= 0):
            raise RecordError("manifest token count is malformed")
        return cls(owner, r, size, digest, tokens)


def heartbeat_from_record(subkey: Any, raw: Any) -> Heartbeat:
    """A peer's heartbeat; the peer it names must be the key that signed it."""
    owner = owner_peer_id(subkey)
    heartbeat = Heartbeat.parse(unpack(raw))
    if heartbeat.peer != owner:
        raise RecordError(f"heartbeat names {heartbeat.peer!r} but is signed by {owner}")
    return heartbeat


MAX_SUBKEY_BYTES = 1024  # an owner marker with a 2048-bit RSA public key is about 400 bytes


def owned_whole(packed_subkey: bytes | None) -> bool:
    """Is the (msgpack-packed) subkey exactly one owner marker? hivemind's signature check
    finds the marker anywhere in it, so one key could write `[owner:KEY]#1`, `#2`, ... without
    end under a key every node reads; a full match leaves each owner one subkey per key."""
    if packed_subkey is None or len(packed_subkey) > MAX_SUBKEY_BYTES:
        return False
    try:
        subkey = msgpack.unpackb(packed_subkey)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return False
    return isinstance(subkey, bytes) and _OWNER_RE.fullmatch(subkey) is not None


class SwarmRecordValidator(RecordValidatorBase):
    """Rejects records that are not owned, too large, or set to expire too far in the future.

    Runs after RSASignatureValidator (lower priority), so it sees the value without signature.
    hivemind itself caps neither value sizes (beyond the 4 MiB message) nor expirations.
    """

    def __init__(self, max_bytes: int = MAX_RECORD_BYTES, max_ttl_s: float = MAX_TTL_S) -> None:
        self.max_bytes = max_bytes
        self.max_ttl_s = max_ttl_s

    def validate(self, record: DHTRecord) -> bool:
        if not owned_whole(record.subkey):
            return False
        if len(record.value) > self.max_bytes + 16:  # msgpack's bytes header around our value
            return False
        return record.expiration_time <= get_dht_time() + self.max_ttl_s + CLOCK_SLACK_S

    @property
    def priority(self) -> int:
        return 0

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return isinstance(other, SwarmRecordValidator)


def make_validators(signer: RSASignatureValidator) -> list[RecordValidatorBase]:
    """The validators every node runs; all nodes must run the same ones."""
    return [signer, SwarmRecordValidator()]
