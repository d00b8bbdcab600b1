"""Signed bundles: configs.parquet, trials.parquet, manifest.json and manifest.sig.

A bundle is written into a temporary sibling folder and renamed into place, so a reader
sees either the old bundle or the complete new one. `verify_bundle` checks the signature
against trusted keys, then every file's sha256, and refuses files the manifest does not list.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from farm.bundle import records, signing
from farm.errors import BundleError

SCHEMA_VERSION = 1
CONFIGS = "configs.parquet"
TRIALS = "trials.parquet"
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"

CONFIG_COLUMNS = pa.schema([
    ("task_key", pa.string()), ("kernel", pa.string()), ("shape", pa.list_(pa.int64())),
    ("dtype", pa.string()), ("target", pa.string()), ("device_kind", pa.string()),
    ("interpret", pa.bool_()), ("software", pa.string()), ("fingerprint", pa.string()),
    ("fingerprint_sha256", pa.string()), ("status", pa.string()),
    ("config", pa.string()), ("median_s", pa.float64()), ("spread", pa.float64()),
    ("min_s", pa.float64()), ("n_timed", pa.int64()), ("numerics_error", pa.float64()),
    ("default_config", pa.string()), ("default_median_s", pa.float64()),
    ("trials", pa.int64()), ("pruned", pa.int64()), ("oom", pa.int64()), ("outcome_counts", pa.string()),
    ("run_id", pa.string()), ("created", pa.string()),
])

TRIAL_COLUMNS = records.SCHEMA   # derived from TrialRecord


def now() -> str:
    """UTC time in ISO 8601, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist([{name: row.get(name) for name in schema.names} for row in rows], schema=schema)


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bundle(dest: str | Path, configs: Sequence[Mapping[str, Any]],
                 trials: Sequence[records.TrialRecord | Mapping[str, Any]], private_key: Ed25519PrivateKey,
                 meta: Mapping[str, Any] | None = None) -> Path:
    """Write a signed bundle at `dest` atomically (replacing an older bundle there).

    `trials`: `TrialRecord`s (or rows already in their dict form, e.g. read from another bundle).
    """
    trials = [t.to_dict() if isinstance(t, records.TrialRecord) else t for t in trials]
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        os.chmod(tmp, 0o755)
        pq.write_table(_table(configs, CONFIG_COLUMNS), tmp / CONFIGS)
        pq.write_table(_table(trials, TRIAL_COLUMNS), tmp / TRIALS)
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "bundle_id": uuid.uuid4().hex,
            "created": now(),
            "signer_key_id": signing.key_id(private_key.public_key()),
            "files": {name: {"sha256": sha256_file(tmp / name), "bytes": (tmp / name).stat().st_size}
                      for name in (CONFIGS, TRIALS)},
            **dict(meta or {}),
        }
        manifest_bytes = json.dumps(manifest, indent=2, sort_keys=True).encode()
        (tmp / MANIFEST).write_bytes(manifest_bytes)
        (tmp / SIGNATURE).write_bytes(signing.sign(manifest_bytes, private_key))
        for name in (CONFIGS, TRIALS, MANIFEST, SIGNATURE):
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
        old = None
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}")
            os.rename(dest, old)
        os.rename(tmp, dest)
        fsync_dir(dest.parent)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def verify_bundle(path: str | Path, trusted: Mapping[str, Ed25519PublicKey]) -> dict[str, Any]:
    """The manifest of a bundle whose signature and every file hash check out; else BundleError."""
    path = Path(path)
    if not path.is_dir():
        raise BundleError(f"{path}: expected a bundle folder")
    try:
        manifest_bytes = (path / MANIFEST).read_bytes()
        signature = (path / SIGNATURE).read_bytes()
    except FileNotFoundError as err:
        raise BundleError(f"{path}: missing {Path(err.filename).name}; expected a signed bundle") from None
    try:
        manifest = json.loads(manifest_bytes)
        signer = manifest["signer_key_id"]
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as err:
        raise BundleError(f"{path / MANIFEST}: not a valid manifest ({err})") from None
    key = trusted.get(signer)
    if key is None:
        raise BundleError(f"{path}: signed by key {signer}, which is not trusted "
                          f"(trusted: {sorted(trusted)})")
    if not signing.verify(manifest_bytes, signature, key):
        raise BundleError(f"{path / SIGNATURE}: signature does not match the manifest (tampered bundle?)")
    check_files(path, manifest)
    return manifest


def check_files(path: str | Path, manifest: Mapping[str, Any]) -> None:
    """Check a bundle folder's files against its manifest (schema, names, sizes, sha256); else BundleError."""
    path = Path(path)
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise BundleError(f"{path / MANIFEST}: schema_version {manifest.get('schema_version')!r}; "
                          f"expected {SCHEMA_VERSION}")
    files = manifest.get("files")
    if not isinstance(files, Mapping) or not all(isinstance(e, Mapping) for e in files.values()):
        raise BundleError(f"{path / MANIFEST}: files: expected an object of {{name: {{sha256, bytes}}}}")
    listed = set(files) | {MANIFEST, SIGNATURE}
    present = {p.name for p in path.iterdir()}
    if present - listed:
        raise BundleError(f"{path}: unlisted files {sorted(present - listed)}; expected only {sorted(listed)}")
    for name, entry in files.items():
        if "/" in name or name.startswith("."):
            raise BundleError(f"{path / MANIFEST}: file name {name!r} is not a plain file name")
        file = path / name
        if file.is_symlink() or not file.is_file():
            raise BundleError(f"{file}: missing or not a regular file; the manifest lists it")
        size = file.stat().st_size
        if "bytes" in entry and size != entry["bytes"]:
            raise BundleError(f"{file}: {size} bytes; the manifest says {entry['bytes']} (truncated or tampered)")
        if sha256_file(file) != entry.get("sha256"):
            raise BundleError(f"{file}: sha256 does not match the manifest (corrupt or tampered)")


def read_configs(path: str | Path) -> pa.Table:
    """The configs table of a bundle (verify it first)."""
    return pq.read_table(Path(path) / CONFIGS)


def read_trials(path: str | Path) -> pa.Table:
    """The trials table of a bundle."""
    return pq.read_table(Path(path) / TRIALS)
