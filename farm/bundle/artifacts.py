"""Signed bundles: configs.parquet, trials.parquet, manifest.json and manifest.sig.

A bundle is written into a temporary sibling folder and renamed into place, so a reader
sees either the old bundle or the complete new one. Bundles are opened and verified by
`farm.bundle.locate.open_bundle` (the verifier is `farm.bundle.trust.verify`).
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from farm.bundle import records, signing
from farm.errors import FarmError

SCHEMA_VERSION = 1
CONFIGS = "configs.parquet"
TRIALS = "trials.parquet"
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
BUNDLE_FILES = frozenset((CONFIGS, TRIALS, MANIFEST, SIGNATURE))

# A config's knobs as typed values, so that pandas, Polars and DuckDB read them without a JSON
# parser or hand-written types: one struct per knob, its value in the field of its type.
KNOB = pa.struct([("name", pa.string()), ("int", pa.int64()), ("float", pa.float64()),
                  ("bool", pa.bool_()), ("string", pa.string())])
KNOBS = pa.list_(KNOB)

CONFIG_COLUMNS = pa.schema([
    ("task_key", pa.string()), ("kernel", pa.string()), ("shape", pa.list_(pa.int64())),
    ("dtype", pa.string()), ("target", pa.string()), ("device_kind", pa.string()),
    ("interpret", pa.bool_()), ("software", pa.string()), ("fingerprint", pa.string()),
    ("fingerprint_sha256", pa.string()), ("status", pa.string()),
    ("config", pa.string()), ("median_s", pa.float64()), ("spread", pa.float64()),
    ("min_s", pa.float64()), ("n_timed", pa.int64()), ("numerics_error", pa.float64()),
    ("default_config", pa.string()), ("default_median_s", pa.float64()),
    ("sweep_median_s", pa.float64()), ("finalists", pa.int64()), ("floor_s", pa.float64()), ("settled", pa.bool_()),
    ("clock", pa.string()),
    ("trials", pa.int64()), ("pruned", pa.int64()), ("oom", pa.int64()), ("outcome_counts", pa.string()),
    ("run_id", pa.string()), ("created", records.TIMESTAMP),
    ("knobs", KNOBS),
])

# derived from TrialRecord, plus the typed knobs of each trial's config
TRIAL_COLUMNS = records.SCHEMA.append(pa.field("knobs", KNOBS))


def now() -> str:
    """UTC time in ISO 8601, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def now_precise() -> str:
    """UTC time in ISO 8601, to the microsecond: a bundle's `created`, which orders bundles
    (`farm pull`'s rollback protection; ties broken by bundle id)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def knob_values(config: str | None) -> list[dict[str, Any]] | None:
    """The KNOBS value of a config's canonical JSON (None for no config)."""
    if not config:
        return None
    knobs = []
    for name, value in json.loads(config).items():
        kind = ("bool" if isinstance(value, bool) else "int" if isinstance(value, int)
                else "float" if isinstance(value, float) else "string")
        knobs.append({"name": name, kind: value if kind != "string" else str(value)})
    return knobs


def _cell(value: Any, type_: pa.DataType) -> Any:
    """A row value as its column stores it: ISO 8601 text becomes a timestamp."""
    if pa.types.is_timestamp(type_) and isinstance(value, str):
        parsed = datetime.fromisoformat(value)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
    return value


def _table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    cells = []
    for row in rows:
        cell = {f.name: _cell(row.get(f.name), f.type) for f in schema}
        if "knobs" in schema.names and row.get("knobs") is None:
            cell["knobs"] = knob_values(row.get("config"))
        cells.append(cell)
    return pa.Table.from_pylist(cells, schema=schema)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2   # <fcntl.h>, <linux/fs.h>


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux `renameat2` with RENAME_EXCHANGE), so a
    reader or a crash sees one or the other, never neither; False where the system or file system
    has no such call (the caller then renames twice). Other failures raise OSError."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):   # a C library without it (glibc < 2.28, musl)
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_replaceable(path: Path) -> bool:
    """Whether a bundle may be written over `path`: nothing there, an empty folder, or a bundle
    folder (its files a subset of the bundle's four, a partly written one included)."""
    if not os.path.lexists(path):
        return True
    if path.is_symlink() or not path.is_dir():
        return False
    return {entry.name for entry in path.iterdir()} <= BUNDLE_FILES


def write_bundle(dest: str | Path, configs: Sequence[Mapping[str, Any]],
                 trials: Sequence[records.TrialRecord | Mapping[str, Any]], private_key: Ed25519PrivateKey,
                 meta: Mapping[str, Any] | None = None) -> Path:
    """Write a signed bundle at `dest` atomically (replacing an older bundle there; anything else
    at `dest`, a file or a folder holding other files, is refused and left as it was).

    `trials`: `TrialRecord`s (or rows already in their dict form, e.g. read from another bundle).
    """
    trials = [t.to_dict() if isinstance(t, records.TrialRecord) else t for t in trials]

    def fill(tmp: Path) -> None:
        pq.write_table(_table(configs, CONFIG_COLUMNS), tmp / CONFIGS)
        pq.write_table(_table(trials, TRIAL_COLUMNS), tmp / TRIALS)
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "bundle_id": uuid.uuid4().hex,
            "created": now_precise(),
            "signer_key_id": signing.key_id(private_key.public_key()),
            "files": {name: {"sha256": sha256_file(tmp / name), "bytes": (tmp / name).stat().st_size}
                      for name in (CONFIGS, TRIALS)},
            **dict(meta or {}),
        }
        manifest_bytes = json.dumps(manifest, indent=2, sort_keys=True).encode()
        (tmp / MANIFEST).write_bytes(manifest_bytes)
        (tmp / SIGNATURE).write_bytes(signing.sign(manifest_bytes, private_key))

    return _place(Path(dest), fill)


def copy_bundle(src: str | Path, dest: str | Path) -> Path:
    """Copy a bundle folder's four files to `dest` byte for byte (its id and signature kept),
    atomically, as `write_bundle` writes (the caller verified `src`)."""
    src = Path(src)

    def fill(tmp: Path) -> None:
        for name in (CONFIGS, TRIALS, MANIFEST, SIGNATURE):
            shutil.copyfile(src / name, tmp / name)

    return _place(Path(dest), fill)


def _place(dest: Path, fill: Callable[[Path], None]) -> Path:
    """Have `fill` write a bundle's four files into a new folder beside `dest`, then put that folder
    at `dest` in one atomic exchange where the system has one (two renames where not)."""
    if not dest.name:
        dest = dest.resolve()
    if not is_replaceable(dest):
        raise FarmError(f"{dest}: exists and is not a bundle folder (expected a new path, an empty folder or a "
                        f"bundle's {', '.join(sorted(BUNDLE_FILES))}); refusing to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        os.chmod(tmp, 0o755)
        fill(tmp)
        for name in (CONFIGS, TRIALS, MANIFEST, SIGNATURE):
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
        old = None
        if dest.exists() and exchange(tmp, dest):   # one atomic step: tmp now holds the old bundle
            fsync_dir(dest.parent)
            shutil.rmtree(tmp)
            return dest
        if dest.exists():   # no atomic exchange here: a crash between the renames leaves `old` aside
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


def read_configs(path: str | Path) -> pa.Table:
    """The configs table of a bundle (verify it first)."""
    return pq.read_table(Path(path) / CONFIGS)


def read_trials(path: str | Path) -> pa.Table:
    """The trials table of a bundle."""
    return pq.read_table(Path(path) / TRIALS)
