"""Who may sign bundles: trusted public keys, revoked keys, and the one verifier of a bundle folder.

Trust is read from files and folders (`--trust PATH`, repeatable):

    trust/
      ci-2025.pub        a PEM Ed25519 public key: trusted
      ci-2026.pub        rotation: drop the new key in; bundles it signs are accepted at once
      ci-2024.revoked    a PEM public key (e.g. an old `.pub` renamed): revoked
      revoked            a text file of revoked key ids, one per line (16 hex digits, as in
                         `signer_key_id`); `#` starts a comment

A file given directly is a trusted key, unless it is named `revoked` or ends in `.revoked`,
in which case it revokes (a `.revoked` file may hold a PEM key or a list of key ids).
Trust fails closed: anything else in a trust folder (`revoked.txt`, `ci.revoke`, a `revoked/`
folder, a stray file) is an error rather than ignored, since a revocation under a near-miss name
would otherwise leave the key trusted; so is a revocation that cannot be read.
Revocation wins: a bundle whose `signer_key_id` is revoked is refused even when its `.pub` is
still present, and even with `allow_unsigned`. A bundle that is unsigned (no `manifest.sig`) or
whose signer is not trusted is refused unless the caller passes `allow_unsigned=True`
(`--allow-unsigned`), which logs a loud warning. A signature that does not match a trusted
key's is tampering and is always refused. File sizes and hashes are checked in every case.

`verify` is the one verifier of a bundle folder; `farm.bundle.locate.open_bundle` finds the
folder of a run, a deployment or an archive and verifies it with `verify`.
"""
from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Union

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from farm.bundle import artifacts, signing
from farm.errors import BundleError, FarmError, shorten, show

REVOKED_LIST = "revoked"
REVOKED_SUFFIX = ".revoked"
MAX_REVOCATIONS_BYTES = 1 << 20
MAX_MANIFEST_BYTES = 1 << 20
_KEY_ID = re.compile(r"^[0-9a-f]{16}$")


class UnverifiedBundleWarning(UserWarning):
    """A bundle was accepted without a trusted signature (allow_unsigned)."""


@dataclasses.dataclass(frozen=True)
class Trust:
    """Trusted keys by key id, and revoked key ids with where each revocation came from."""

    keys: Mapping[str, Ed25519PublicKey]
    revoked: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def is_trusted(self, key_id: str) -> bool:
        """Whether bundles signed by `key_id` are accepted."""
        return key_id in self.keys and key_id not in self.revoked


TrustLike = Union[Trust, Mapping[str, Ed25519PublicKey], Sequence[Union[str, Path]], str, Path]


def _is_revocation(path: Path) -> bool:
    return path.name == REVOKED_LIST or path.name.endswith(REVOKED_SUFFIX)


def read_revocations(path: str | Path) -> dict[str, str]:
    """Revoked key ids from a PEM public key file or a list of key ids, each mapped to its source."""
    path = Path(path)
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "a folder")
        with open(path, "rb") as f:
            text = f.read(MAX_REVOCATIONS_BYTES + 1)
    except OSError as err:
        raise FarmError(f"{path}: cannot read revocations ({err.strerror}); expected a readable file") from None
    if len(text) > MAX_REVOCATIONS_BYTES:
        raise FarmError(f"{path}: more than {MAX_REVOCATIONS_BYTES} bytes; expected a list of key ids")
    if text.lstrip().startswith(b"-----BEGIN"):
        return {signing.key_id(signing.load_public_key(path)): str(path)}
    revoked: dict[str, str] = {}
    for number, line in enumerate(text.decode("utf-8", "replace").splitlines(), 1):
        entry = line.split("#", 1)[0].strip().lower()
        if not entry:
            continue
        if not _KEY_ID.match(entry):
            raise FarmError(f"{path}: line {number}: expected a key id of 16 hex digits, got {show(entry)}")
        revoked[entry] = f"{path}:{number}"
    return revoked


def _folder_entries(folder: Path) -> tuple[list[Path], list[Path]]:
    """The key files and revocation files of a trust folder; FarmError for anything else in it.

    Failing closed: a revocation written to a near-miss name (`revoked.txt`, `ci.revoke`, a
    `revoked/` folder) would otherwise be ignored while the key it meant to revoke stays trusted.
    """
    try:
        entries = sorted(folder.iterdir())
    except OSError as err:
        raise FarmError(f"--trust {folder}: cannot list the trust folder ({err.strerror})") from None
    key_files, revocations = [], []
    for entry in entries:
        if _is_revocation(entry):
            revocations.append(entry)
        elif entry.name.endswith(signing.PUBLIC_SUFFIX) and not entry.is_dir():
            key_files.append(entry)
        else:
            kind = "folder" if entry.is_dir() else "file"
            raise FarmError(f"--trust {folder}: unknown {kind} {show(entry.name)} in a trust folder; expected only "
                            f"*{signing.PUBLIC_SUFFIX} keys, *{REVOKED_SUFFIX} keys or a `{REVOKED_LIST}` file of "
                            f"key ids (a near-miss name would leave a revoked key trusted, so it is refused)")
    return key_files, revocations


def load_trust(paths: Sequence[str | Path], *, require_keys: bool = True) -> Trust:
    """Trusted keys and revocations from key files and trust folders (see the module docstring).

    Fails closed: an unknown entry in a trust folder, or a revocation that cannot be read, is a
    FarmError, never silently skipped."""
    keys: dict[str, Ed25519PublicKey] = {}
    revoked: dict[str, str] = {}
    for path in map(Path, paths):
        if path.is_dir():
            key_files, revocations = _folder_entries(path)
        elif _is_revocation(path):
            key_files, revocations = [], [path]
        else:
            key_files, revocations = [path], []
        for file in key_files:
            key = signing.load_public_key(file)
            keys[signing.key_id(key)] = key
        for file in revocations:
            revoked.update(read_revocations(file))
    if require_keys and not set(keys) - set(revoked):
        gone = "; ".join(f"key {kid}, which is revoked ({revoked[kid]})" for kid in sorted(keys))
        raise FarmError(f"--trust: expected at least one public key file that is not revoked, found none in "
                        f"{show([str(p) for p in paths])}" + (f": {gone}" if gone else ""))
    return Trust(keys, revoked)


def as_trust(trusted: TrustLike) -> Trust:
    """A Trust from a Trust, a {key id: public key} mapping, or key/folder paths."""
    if isinstance(trusted, Trust):
        return trusted
    if isinstance(trusted, Mapping):
        return Trust(dict(trusted))
    if isinstance(trusted, (str, Path)):
        return load_trust([trusted])
    return load_trust(list(trusted))


@dataclasses.dataclass(frozen=True)
class Verified:
    """A bundle that passed verification: its manifest, and whether a trusted key signed it."""

    path: Path
    manifest: dict[str, Any]
    manifest_bytes: bytes
    signed: bool
    warning: str | None = None


def check_signature(manifest_bytes: bytes, signature: bytes | None, trust: Trust,
                    shown: str) -> tuple[dict[str, Any], str | None]:
    """The manifest, and why it is not signed by a trusted key (None when it is); BundleError for a
    revoked signer, a malformed manifest or a signature that does not match (tampering).

    Needs only the manifest and signature bytes, so `farm pull` can run it before it extracts
    anything else (`farm.bundle.archive.extract_archive`'s `check_manifest`).
    """
    if len(manifest_bytes) > MAX_MANIFEST_BYTES:
        raise BundleError(f"{shown}/{artifacts.MANIFEST}: more than {MAX_MANIFEST_BYTES} bytes; expected a manifest")
    try:
        manifest = json.loads(manifest_bytes)
        signer = manifest.get("signer_key_id")
    except (ValueError, AttributeError, RecursionError) as err:
        raise BundleError(f"{shown}/{artifacts.MANIFEST}: not a valid manifest ({type(err).__name__})") from None
    if not isinstance(signer, str):
        raise BundleError(f"{shown}/{artifacts.MANIFEST}: signer_key_id: expected a key id string, got {show(signer)}")
    if signer in trust.revoked:
        raise BundleError(f"{shown}: signed by key {shorten(signer, 64)}, which is revoked ({trust.revoked[signer]})")
    if signature is None:
        return manifest, f"unsigned: no {artifacts.SIGNATURE}"
    if signer not in trust.keys:
        return manifest, f"signed by key {shorten(signer, 64)}, which is not trusted (trusted: {sorted(trust.keys)})"
    if not signing.verify(manifest_bytes, signature, trust.keys[signer]):
        raise BundleError(f"{shown}/{artifacts.SIGNATURE}: signature does not match the manifest (tampered bundle?)")
    return manifest, None


def unsigned_refusal(shown: str, problem: str) -> BundleError:
    """The error for a bundle that is unsigned or signed by an untrusted key (without allow_unsigned)."""
    return BundleError(f"{shown}: {problem}; expected a bundle signed by a trusted key "
                       f"(farm pull, bundle and retune accept it anyway with --allow-unsigned; farm show "
                       f"without --trust shows it, unverified)")


def verify(path: str | Path, trust: Trust, *, allow_unsigned: bool = False, label: str | None = None) -> Verified:
    """The one bundle verifier: revocation, signature, then every file's size and sha256; else BundleError.

    Args:
        path: a bundle folder (`farm.bundle.locate.open_bundle` finds it for other locations).
        trust: trusted and revoked keys (`load_trust`).
        allow_unsigned: accept an unsigned or untrusted bundle (never a revoked or tampered one),
            with an UnverifiedBundleWarning.
        label: how messages name the folder (e.g. the archive or URL it came from); default its path.
    """
    path = Path(path)
    shown = label or str(path)
    if not path.is_dir():
        raise BundleError(f"{shown}: expected a bundle folder")
    manifest_path, signature_path = path / artifacts.MANIFEST, path / artifacts.SIGNATURE
    try:
        with open(manifest_path, "rb") as f:
            manifest_bytes = f.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise BundleError(f"{shown}: missing {artifacts.MANIFEST}; expected a bundle") from None
    except OSError as err:
        raise BundleError(f"{shown}/{artifacts.MANIFEST}: cannot read ({err.strerror})") from None
    signature = None
    if signature_path.is_file():
        with open(signature_path, "rb") as f:
            signature = f.read(4096)
    manifest, problem = check_signature(manifest_bytes, signature, trust, shown)
    warning = None
    if problem is not None:
        if not allow_unsigned:
            raise unsigned_refusal(shown, problem)
        warning = f"ACCEPTING AN UNVERIFIED BUNDLE {shown}: {problem} (allow_unsigned)"
        warnings.warn(warning, UnverifiedBundleWarning, stacklevel=2)
    _check_files(path, manifest, shown)
    return Verified(path, manifest, manifest_bytes, signed=problem is None, warning=warning)


def _check_files(path: Path, manifest: Mapping[str, Any], shown: str) -> None:
    """Check a bundle folder's files against its manifest (schema, names, sizes, sha256); else BundleError."""
    where = f"{shown}/{artifacts.MANIFEST}"
    if manifest.get("schema_version") != artifacts.SCHEMA_VERSION:
        raise BundleError(f"{where}: schema_version {manifest.get('schema_version')!r}; "
                          f"expected {artifacts.SCHEMA_VERSION}")
    files = manifest.get("files")
    if not isinstance(files, Mapping) or not all(isinstance(e, Mapping) for e in files.values()):
        raise BundleError(f"{where}: files: expected an object of {{name: {{sha256, bytes}}}}")
    listed = set(files) | {artifacts.MANIFEST, artifacts.SIGNATURE}
    present = {p.name for p in path.iterdir()}
    if present - listed:
        raise BundleError(f"{shown}: unlisted files {show(sorted(present - listed))}; expected only "
                          f"{show(sorted(listed))}")
    for name, entry in files.items():
        if "/" in name or name.startswith("."):
            raise BundleError(f"{where}: file name {show(name)} is not a plain file name")
        file = path / name
        if file.is_symlink() or not file.is_file():
            raise BundleError(f"{shown}/{name}: missing or not a regular file; the manifest lists it")
        size = file.stat().st_size
        if "bytes" in entry and size != entry["bytes"]:
            raise BundleError(f"{shown}/{name}: {size} bytes; the manifest says {show(entry['bytes'])} "
                              f"(truncated or tampered)")
        if artifacts.sha256_file(file) != entry.get("sha256"):
            raise BundleError(f"{shown}/{name}: sha256 does not match the manifest (corrupt or tampered)")
