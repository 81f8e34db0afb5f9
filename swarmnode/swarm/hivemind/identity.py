"""A node's identity: one RSA key that is both its libp2p peer id and its DHT record owner.

Using the same key for both lets a receiver check that the peer which signed a manifest in the
DHT is the peer it downloads the payload from, so nobody can publish in another peer's name.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from pathlib import Path

import base58
import multihash
from cryptography.hazmat.primitives import serialization
from hivemind.p2p import P2P, PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

log = logging.getLogger(__name__)


class IdentityError(ValueError):
    """The identity file cannot be used; the message says why."""


def new_identity() -> bytes:
    """A fresh libp2p RSA identity, serialized as `P2P.generate_identity` writes it (a new key
    per call): what grinding a DHT place generates again and again (the eclipse bench)."""
    return crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.RSA, data=RSAPrivateKey().to_bytes()).SerializeToString()


def ensure_identity(path: Path) -> str:
    """Create the key file on first use (owner-only permissions); return the peer id (base58)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        P2P.generate_identity(str(path))  # writes a libp2p RSA key, mode 0400
        os.chmod(path, 0o600)
        log.info("created a new identity in %s", path)
    elif path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s is readable by other users; run: chmod 600 %s", path, path)
    try:
        return PeerID.from_identity(path.read_bytes()).to_base58()
    except Exception as err:  # protobuf/DER errors have no common base class
        raise IdentityError(f"{path} is not a libp2p RSA private key ({err})") from None


def load_signing_key(path: Path) -> RSAPrivateKey:
    """The identity's RSA key as the private key hivemind's RSASignatureValidator signs with."""
    try:
        der = crypto_pb2.PrivateKey.FromString(path.read_bytes()).data
        serialization.load_der_private_key(der, password=None)
    except Exception as err:
        raise IdentityError(f"{path} is not a libp2p RSA private key ({err})") from None
    key = RSAPrivateKey.__new__(RSAPrivateKey)
    key.__setstate__({"_private_key": der})  # hivemind's own (de)serialisation path for the key
    return key


def peer_id_of_owner(owner_public_key: bytes) -> str:
    """The libp2p peer id (base58) of an OpenSSH RSA public key taken from a DHT owner marker."""
    public_key = RSAPublicKey.from_bytes(owner_public_key)._public_key
    der = public_key.public_bytes(
        encoding=serialization.Encoding.DER, format=serialization.PublicFormat.SubjectPublicKeyInfo
    )
    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    digest = multihash.encode(hashlib.sha256(encoded).digest(), multihash.coerce_code("sha2-256"))
    return base58.b58encode(digest).decode()
