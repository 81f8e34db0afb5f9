"""What the swarm keeps in the DHT: small owned records (heartbeats, round manifests).

Every record sits in a subkey owned by its writer's RSA key (hivemind's RSASignatureValidator),
so only that peer can write it. `SwarmRecordValidator` adds the limits hivemind lacks: records
must be owned, small, expire soon, and sit in their owner's shard (swarm.hivemind.shards).
Payloads never go in the DHT; a manifest only says where and how big a payload is and what its
digest is.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgpack
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.bounded import note_newest
from swarmnode.protocol.records import Heartbeat, RecordError
from swarmnode.swarm.hivemind.identity import peer_id_of_owner
from swarmnode.swarm.hivemind.shards import HEARTBEAT_FAMILY, ShardIndex, in_shard

MAX_RECORD_BYTES = 4096  # far below the 16 KiB at which hivemind's forked DHT pipe breaks (we run no such pipe)
MAX_TTL_S = 3600.0
CLOCK_SLACK_S = 30.0
DIGEST_BYTES = 32
SIGNATURE_VERDICTS_KEPT = 8192  # distinct records whose signature check a node remembers
_OWNER_RE = re.compile(rb"\[owner:([^\]]+)\]")


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


def owner_or_none(subkey: Any) -> str | None:
    """The owner's peer id, None for a subkey no key owns."""
    try:
        return owner_peer_id(subkey)
    except RecordError:
        return None


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


def _whole_subkey(packed_subkey: bytes | None) -> bytes | None:
    """The subkey when it is exactly one owner marker, else None."""
    if packed_subkey is None or len(packed_subkey) > MAX_SUBKEY_BYTES:
        return None
    try:
        subkey = msgpack.unpackb(packed_subkey)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None
    return subkey if isinstance(subkey, bytes) and _OWNER_RE.fullmatch(subkey) else None


class SwarmRecordValidator(RecordValidatorBase):
    """Rejects records that are not owned, too large, set to expire too far in the future, or
    filed under a shard key their owner does not hash to (for the families in `shards`).

    Runs after RSASignatureValidator (lower priority), so it sees the value without signature.
    hivemind itself caps neither value sizes (beyond the 4 MiB message) nor expirations.
    """

    def __init__(
        self, shards: ShardIndex | None = None, max_bytes: int = MAX_RECORD_BYTES, max_ttl_s: float = MAX_TTL_S
    ) -> None:
        self.shards = shards or ShardIndex()
        self.max_bytes = max_bytes
        self.max_ttl_s = max_ttl_s

    def validate(self, record: DHTRecord) -> bool:
        subkey = _whole_subkey(record.subkey)
        if subkey is None:
            return False
        if len(record.value) > self.max_bytes + 16:  # msgpack's bytes header around our value
            return False
        if record.expiration_time > get_dht_time() + self.max_ttl_s + CLOCK_SLACK_S:
            return False
        shard = self.shards.shard(record.key)
        if shard is None:
            return True
        try:
            return in_shard(owner_peer_id(subkey), *shard)
        except RecordError:
            return False

    @property
    def priority(self) -> int:
        return 0

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return isinstance(other, SwarmRecordValidator)


class RememberingSignatureValidator(RSASignatureValidator):
    """hivemind's owner-signature check, each distinct record verified once. Every answer
    to a DHT lookup (reads, and the lookups a store makes to find where to store) carries
    every record under the key, and the same records come back lookup after lookup, each an
    RSA verification: under a crowd of identities most of a node's network CPU. A verdict
    depends on the record's bytes alone, so the last SIGNATURE_VERDICTS_KEPT are kept."""

    def __init__(self, private_key: RSAPrivateKey | None = None, kept: int = SIGNATURE_VERDICTS_KEPT) -> None:
        super().__init__(private_key)
        self.kept = kept
        self._verdicts: OrderedDict[bytes, bool] = OrderedDict()  # record digest -> verdict

    def validate(self, record: DHTRecord) -> bool:
        packed = msgpack.packb([record.key, record.subkey, record.value, record.expiration_time])
        digest = hashlib.blake2b(packed, digest_size=32).digest()
        verdict = self._verdicts.get(digest)
        if verdict is None:
            verdict = super().validate(record)
            note_newest(self._verdicts, digest, verdict, self.kept)
        else:
            self._verdicts.move_to_end(digest)
        return verdict


def make_validators(signer: RSASignatureValidator, shards: ShardIndex) -> list[RecordValidatorBase]:
    """The validators every node runs; all nodes must run the same ones. `shards` holds the
    heartbeat family; the node adds its run's manifest family once it knows the run."""
    shards.add(HEARTBEAT_FAMILY)
    return [signer, SwarmRecordValidator(shards)]
