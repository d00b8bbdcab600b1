"""Ed25519 keys and signatures for bundles (the `cryptography` package).

Key files: the private key is written 0600 and the public key 0644 whatever the umask, never
through a link; signing refuses a private key that group or others may access, as ssh does
(`FARM_ALLOW_OPEN_KEY=1` signs anyway, with a warning).
"""
from __future__ import annotations

import hashlib
import os
import stat
import warnings
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from farm.errors import FarmError, shorten
from farm.inputs import NotAFile, TooLarge, read_regular

PUBLIC_SUFFIX = ".pub"
PRIVATE_MODE, PUBLIC_MODE = 0o600, 0o644
ALLOW_OPEN_KEY_ENV = "FARM_ALLOW_OPEN_KEY"
MAX_KEY_BYTES = 64 << 10


def key_id(public_key: Ed25519PublicKey) -> str:
    """A short stable id: the first 16 hex digits of sha256 of the raw public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create `path` with exactly `mode` (whatever the umask), never following a link, never replacing
    anything (a dangling symbolic link included), durable once this returns."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def generate_keypair(private_path: str | Path) -> tuple[Path, Path, str]:
    """Write a new private key (mode 0600) and its public key beside it (`<name>.pub`, mode 0644).

    Modes are set explicitly (a umask of 000 does not make the public key world-writable); an
    existing file or link at either path, even a dangling link, is refused (FarmError), never
    followed or overwritten. On failure nothing is left behind."""
    private_path = Path(private_path)
    public_path = private_path.with_name(private_path.name + PUBLIC_SUFFIX)
    for path in (private_path, public_path):
        if os.path.lexists(path):
            what = "a symbolic link" if path.is_symlink() else "already exists"
            raise FarmError(f"{path}: {what}; expected a new key path (refusing to overwrite or follow)")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    written: list[Path] = []
    try:
        private_path.parent.mkdir(parents=True, exist_ok=True)
        _write_new(private_path, pem, PRIVATE_MODE)
        written.append(private_path)
        _write_new(public_path, public_pem, PUBLIC_MODE)
        written.append(public_path)
    except OSError as err:
        for path in written:
            path.unlink(missing_ok=True)
        raise FarmError(f"{err.filename or private_path}: cannot write the key ({err.strerror}); expected a new "
                        f"key path in a writable folder") from None
    return private_path, public_path, key_id(key.public_key())


def _check_private_mode(path: Path) -> None:
    """Refuse (as ssh does) a private key that others may read or write, unless FARM_ALLOW_OPEN_KEY=1 (warns)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # reading it says what is wrong
    if not mode & 0o077:
        return
    message = (f"{path}: private key permissions {stat.S_IMODE(mode):04o} let others read or change it; "
               f"expected 0600 (chmod 600 {path})")
    if os.environ.get(ALLOW_OPEN_KEY_ENV, "") in ("1", "true", "yes"):
        warnings.warn(f"{message}; signing anyway ({ALLOW_OPEN_KEY_ENV}=1)", UserWarning, stacklevel=3)
        return
    raise FarmError(f"{message}, or {ALLOW_OPEN_KEY_ENV}=1 to sign anyway")


def _read_key_file(path: str | Path, what: str) -> bytes:
    try:
        return read_regular(path, MAX_KEY_BYTES)
    except NotAFile:
        raise ValueError(f"expected a regular file for {what}, not a folder, device or FIFO") from None
    except TooLarge:
        raise ValueError(f"more than {MAX_KEY_BYTES} bytes for {what}") from None


def _load_key(path: str | Path, load: Any, kind: type, role: str, not_found: str) -> Any:
    """A PEM Ed25519 key of `kind` read with `load`; every problem a one-line FarmError."""
    what = "private" if kind is Ed25519PrivateKey else "public"
    try:
        key = load(_read_key_file(path, "a key"))
    except FileNotFoundError:
        raise FarmError(f"{path}: {role} not found; {not_found}") from None
    except OSError as err:
        raise FarmError(f"{path}: cannot read the {role} ({err.strerror})") from None
    except (ValueError, TypeError) as err:
        raise FarmError(f"{path}: expected a PEM Ed25519 {what} key ({shorten(str(err), 200)})") from None
    if not isinstance(key, kind):
        raise FarmError(f"{path}: expected an Ed25519 {what} key, got {type(key).__name__}")
    return key


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """Read a PEM Ed25519 private key; refused when group or others may access the file (see
    `_check_private_mode`)."""
    _check_private_mode(Path(path))
    return _load_key(path, lambda data: serialization.load_pem_private_key(data, password=None),
                     Ed25519PrivateKey, "signing key",
                     f"expected a private key file (create one with `farm keygen {path}`)")


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """Read a PEM Ed25519 public key."""
    return _load_key(path, serialization.load_pem_public_key, Ed25519PublicKey, "trusted key",
                     "expected a public key file")


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
