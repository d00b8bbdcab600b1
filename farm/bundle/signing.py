"""Ed25519 keys and signatures for bundles (the `cryptography` package)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from farm.errors import FarmError

PUBLIC_SUFFIX = ".pub"


def key_id(public_key: Ed25519PublicKey) -> str:
    """A short stable id: the first 16 hex digits of sha256 of the raw public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_keypair(private_path: str | Path) -> tuple[Path, Path, str]:
    """Write a new private key (mode 0600) and its public key beside it (`<name>.pub`)."""
    private_path = Path(private_path)
    public_path = private_path.with_name(private_path.name + PUBLIC_SUFFIX)
    for path in (private_path, public_path):
        if path.exists():
            raise FarmError(f"{path}: already exists; expected a new key path (refusing to overwrite a key)")
    private_path.parent.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public_path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private_path, public_path, key_id(key.public_key())


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """Read a PEM Ed25519 private key."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except FileNotFoundError:
        raise FarmError(f"{path}: signing key not found; expected a private key file "
                        f"(create one with `farm keygen {path}`)") from None
    except (ValueError, TypeError) as err:
        raise FarmError(f"{path}: expected a PEM Ed25519 private key ({err})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise FarmError(f"{path}: expected an Ed25519 private key, got {type(key).__name__}")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """Read a PEM Ed25519 public key."""
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except FileNotFoundError:
        raise FarmError(f"{path}: trusted key not found; expected a public key file") from None
    except (ValueError, TypeError) as err:
        raise FarmError(f"{path}: expected a PEM Ed25519 public key ({err})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise FarmError(f"{path}: expected an Ed25519 public key, got {type(key).__name__}")
    return key


def load_trusted_keys(paths: list[str | Path]) -> dict[str, Ed25519PublicKey]:
    """Trusted public keys by key id, from files and folders (every `*.pub`), less revoked ones (farm.bundle.trust)."""
    from farm.bundle import trust

    loaded = trust.load_trust(paths)
    return {kid: key for kid, key in loaded.keys.items() if kid not in loaded.revoked}


def sign(data: bytes, private_key: Ed25519PrivateKey) -> bytes:
    """The 64-byte Ed25519 signature of `data`."""
    return private_key.sign(data)


def verify(data: bytes, signature: bytes, public_key: Ed25519PublicKey) -> bool:
    """Whether `signature` is `public_key`'s signature of `data`."""
    try:
        public_key.verify(signature, data)
    except InvalidSignature:
        return False
    return True
