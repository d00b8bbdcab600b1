"""One way to open a bundle: from wherever it lives, verified, with readers for its tables.

    with open_bundle("artifacts/run-a", trust) as opened:      # refuses anything unverified
        rows = opened.configs().to_pylist()

A bundle is found at one of these locations (`locate` says which):

    FOLDER      a bundle folder: manifest.json, manifest.sig, configs.parquet, trials.parquet
    RUN         a run folder of `farm sweep` / `farm retune`: RUN/bundle is the bundle
    DEPLOYMENT  a deployment folder of `farm pull`: DIR/current -> versions/<created>-<id>/
    ARCHIVE     a bundle archive (.tar.gz, .tgz, .tar): extracted safely (farm.bundle.archive)
                into a temporary folder that lives as long as the `with` block

Every location is verified by the one verifier, `farm.bundle.trust.verify` (revocation,
signature, every file's size and sha256, no unlisted files; `allow_unsigned` accepts an
unsigned or untrusted bundle with a warning). The readers re-check a table's sha256 on the
bytes they parse, so a file swapped after verification is never read. Errors name the location
the caller gave, or a file under it (for an archive: `ARCHIVE/configs.parquet`), never a
temporary folder.

The deployment layout (`CURRENT`, `VERSIONS`, `installed`) lives here because opening a
deployment needs it; `farm.deploy.pull` writes that layout with the same names.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from farm.bundle import artifacts
from farm.bundle.archive import extract_archive, is_archive
from farm.bundle.trust import TrustLike, as_trust, verify
from farm.errors import BundleError, FarmError, shorten

RUN_BUNDLE = "bundle"     # RUN_DIR/bundle
CURRENT = "current"       # DIR/current -> versions/<created>-<bundle id>
VERSIONS = "versions"     # DIR/versions/<created>-<bundle id>/
FOLDER, RUN, DEPLOYMENT, ARCHIVE = "folder", "run", "deployment", "archive"
# Rows a table may hold, checked from its footer before it is read: a tuned task a row (a
# deployment's registry of 100,000 tasks loads in about a second), a trial a row.
MAX_ROWS = {artifacts.CONFIGS: 1_000_000, artifacts.TRIALS: 5_000_000}
# The columns every reader relies on, with their types (older bundles may lack the others).
_TASK_COLUMNS = {"task_key": pa.string(), "kernel": pa.string(), "shape": pa.list_(pa.int64()),
                 "dtype": pa.string(), "target": pa.string(), "config": pa.string()}
REQUIRED_COLUMNS = {artifacts.CONFIGS: {**_TASK_COLUMNS, "status": pa.string()},
                    artifacts.TRIALS: {**_TASK_COLUMNS, "trial": pa.int64(), "outcome": pa.string()}}
EXPECTED = (f"expected a bundle folder ({artifacts.MANIFEST}), a run folder ({RUN_BUNDLE}/{artifacts.MANIFEST}), "
            f"a `farm pull` deployment folder ({CURRENT}) or a bundle archive (.tar.gz, .tgz, .tar)")


def installed(dest: str | Path) -> Path | None:
    """The version folder a deployment's `current` link points to, or None before the first pull."""
    link = Path(dest) / CURRENT
    if not os.path.lexists(link):
        return None
    if not link.is_symlink():
        raise FarmError(f"{link}: expected the symbolic link that `farm pull` makes, found something else")
    return link.resolve()


def locate(location: str | Path) -> tuple[str, Path]:
    """The kind of a bundle location (FOLDER, RUN, DEPLOYMENT or ARCHIVE) and its bundle folder or archive file.

    Raises FarmError naming `location` when it does not exist or holds no bundle.
    """
    path = Path(location)
    if path.is_file():
        if is_archive(path.name):
            return ARCHIVE, path
        raise FarmError(f"{location}: a file, not a bundle archive; {EXPECTED}")
    if not path.is_dir():
        raise FarmError(f"{location}: not found; {EXPECTED}")
    if os.path.lexists(path / CURRENT):
        version = installed(path)
        if version is None or not version.is_dir():
            raise FarmError(f"{location}: deployment folder whose {CURRENT} points to no version; "
                            f"expected a folder made by `farm pull`")
        return DEPLOYMENT, version
    if (path / RUN_BUNDLE / artifacts.MANIFEST).is_file():
        return RUN, path / RUN_BUNDLE
    if (path / artifacts.MANIFEST).is_file():
        return FOLDER, path
    raise FarmError(f"{location}: holds no bundle; {EXPECTED}")


@dataclasses.dataclass(frozen=True)
class OpenedBundle:
    """A verified bundle: where it came from, its folder and manifest, and readers for its tables.

    `folder` of an ARCHIVE is temporary: use it (and the readers) inside `open_bundle`'s block.
    """

    location: str           # what the caller passed
    kind: str               # FOLDER, RUN, DEPLOYMENT or ARCHIVE
    folder: Path            # the verified bundle folder
    where: str              # how messages name the bundle folder: its path, or the archive's
    manifest: dict[str, Any]
    manifest_bytes: bytes
    signed: bool            # a trusted, unrevoked key signed it
    warning: str | None = None   # why it is unverified (allow_unsigned), else None

    @property
    def bundle_id(self) -> str:
        """The manifest's bundle id."""
        return str(self.manifest.get("bundle_id"))

    def configs(self, columns: Sequence[str] | None = None) -> pa.Table:
        """configs.parquet (the verified bytes), optionally only some columns."""
        return self._read(artifacts.CONFIGS, columns)

    def trials(self, columns: Sequence[str] | None = None) -> pa.Table:
        """trials.parquet (the verified bytes), optionally only some columns."""
        return self._read(artifacts.TRIALS, columns)

    def _read(self, name: str, columns: Sequence[str] | None) -> pa.Table:
        shown = f"{self.where}/{name}"
        entry = self.manifest.get("files", {}).get(name)
        try:
            data = (self.folder / name).read_bytes()
        except OSError as err:
            raise BundleError(f"{shown}: cannot read ({err.strerror})") from None
        if entry is None or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise BundleError(f"{shown}: changed since it was verified, or not in the manifest")
        try:
            metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
            schema = metadata.schema.to_arrow_schema()
        except (pa.ArrowException, OSError) as err:
            raise BundleError(f"{shown}: expected Parquet ({shorten(str(err), 200)})") from None
        if metadata.num_rows > MAX_ROWS[name]:  # a few hundred kB of dictionary-encoded rows can hold 50 million
            raise BundleError(f"{shown}: {metadata.num_rows} rows; expected at most {MAX_ROWS[name]}")
        for column, kind in REQUIRED_COLUMNS[name].items():
            index = schema.get_field_index(column)
            if index < 0 or schema.field(index).type != kind:
                got = "missing" if index < 0 else str(schema.field(index).type)
                raise BundleError(f"{shown}: column {column}: expected {kind}, got {got}")
        try:
            return pq.read_table(pa.BufferReader(data), columns=list(columns) if columns is not None else None)
        except (pa.ArrowException, KeyError) as err:
            wanted = f" with columns {list(columns)}" if columns is not None else ""
            raise BundleError(f"{shown}: expected Parquet{wanted} ({shorten(str(err), 200)})") from None


@contextlib.contextmanager
def open_bundle(location: str | Path, trust: TrustLike, *, allow_unsigned: bool = False) -> Iterator[OpenedBundle]:
    """Find, verify and open the bundle at `location` (see the module docstring); else FarmError / BundleError.

    Args:
        location: a bundle folder, run folder, `farm pull` deployment folder or bundle archive.
        trust: a Trust, a {key id: public key} mapping, or key files / trust folders.
        allow_unsigned: accept an unsigned or untrusted (never a revoked or tampered) bundle, with a warning.

    Yields:
        The OpenedBundle; an archive's temporary folder is removed when the block ends.
    """
    trust = as_trust(trust)
    kind, path = locate(location)
    with contextlib.ExitStack() as stack:
        where = str(path)
        if kind == ARCHIVE:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="farm-bundle-"))
            where = str(location)
            path = extract_archive(path, Path(tmp) / "bundle", label=where)
        verified = verify(path, trust, allow_unsigned=allow_unsigned, label=where)
        yield OpenedBundle(str(location), kind, path, where, verified.manifest, verified.manifest_bytes,
                           verified.signed, verified.warning)
