"""Merge the bundles of several runs into one signed bundle (a folder or a .tar.gz archive).

Each input is a run folder (its `bundle/` is used), a bundle folder, a `farm pull` deployment
folder or a bundle archive; each is opened and verified by `farm.bundle.locate.open_bundle`
first. Rows are merged per task key and device kind (one target, e.g. gpu-triton, may be tuned
on several device kinds): the newest row by `created` wins, and on equal `created` the later
input wins. Trials of every run are kept (a trial that appears in two inputs, e.g. when a
merged bundle is merged again, is kept once).
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from farm.bundle import artifacts, signing
from farm.bundle.archive import ARCHIVE_SUFFIXES, is_archive, write_archive
from farm.bundle.locate import open_bundle
from farm.bundle.trust import Trust, verify
from farm.errors import BundleError, FarmError, show
from farm.tasks import json_object

# Archive formats `farm bundle` does not write: such an --out is refused rather than made a folder.
OTHER_ARCHIVE_SUFFIXES = (".zip", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tar.zst", ".gz", ".xz", ".bz2", ".zst",
                          ".7z")
_TRIAL_IDENTITY = ("run_id", "task_key", "trial", "attempt", "worker", "started", "finished")


@dataclasses.dataclass(frozen=True)
class MergeResult:
    """What `merge` wrote: the output, its task rows and trials, and which inputs were merged."""

    out: Path
    rows: int
    trials: int
    replaced: int
    inputs: tuple[str, ...]
    warnings: tuple[str, ...]
    bundle_id: str = ""
    kept: bool = False        # one input that the key had signed, written byte for byte (its id kept)


def _created(row: dict[str, Any], source: str) -> datetime:
    try:
        return datetime.fromisoformat(str(row["created"]))
    except (KeyError, TypeError, ValueError):
        raise BundleError(f"{source}: task {row.get('task_key')!r}: created: expected an ISO 8601 time, "
                          f"got {row.get('created')!r}") from None


def check_row(row: dict[str, Any], source: str) -> None:
    """A BundleError unless the row is one a deployment can read: its task named by text fields and
    a shape of positive integers, and an "ok" row's config a JSON object (an input opened with
    --allow-unsigned may hold anything; a merge signs what it writes)."""
    where = f"{source}: {artifacts.CONFIGS}: row {show(row.get('task_key'))}"
    for field in ("task_key", "kernel", "dtype", "target", "status"):
        if not isinstance(row.get(field), str) or not row[field]:
            raise BundleError(f"{where}: {field}: expected text, got {show(row.get(field))}")
    shape = row.get("shape")
    if not isinstance(shape, list) or not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise BundleError(f"{where}: shape: expected positive integers, got {show(shape)}")
    if row["status"] == "ok":
        if json_object(row.get("config")) is None:
            raise BundleError(f"{where}: config: expected a JSON object, got {show(row.get('config'))}")


def merge_rows(inputs: Sequence[tuple[str, list[dict[str, Any]]]]) -> tuple[list[dict[str, Any]], int]:
    """The newest row per (task key, device kind), later inputs winning ties; and how many were replaced."""
    chosen: dict[tuple[str, str | None], tuple[datetime, dict[str, Any]]] = {}
    replaced = 0
    for source, rows in inputs:
        for row in rows:
            check_row(row, source)
            key = (row["task_key"], row.get("device_kind"))
            created = _created(row, source)
            if key in chosen:
                replaced += 1
                if created < chosen[key][0]:
                    continue
            chosen[key] = (created, row)
    return [row for _, row in sorted(chosen.values(), key=lambda item: item[1]["task_key"])], replaced


def merge_trials(inputs: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """All trials of all inputs, each distinct trial once, in input order."""
    seen: set[tuple[Any, ...]] = set()
    merged = []
    for trials in inputs:
        for trial in trials:
            identity = tuple(trial.get(name) for name in _TRIAL_IDENTITY)
            if identity not in seen:
                seen.add(identity)
                merged.append(trial)
    return merged


def check_out(out: Path, replace: bool) -> Path:
    """`out` as a merge may write it: an archive name (ARCHIVE_SUFFIXES) or a folder name with no
    other archive's suffix; an existing path only with `replace`, and then only an archive file
    or a bundle folder (anything else there is refused, never removed)."""
    if not out.name or out.name in (".", ".."):
        out = out.resolve()
    if not is_archive(out.name) and out.name.lower().endswith(OTHER_ARCHIVE_SUFFIXES):
        raise FarmError(f"--out {out}: expected FILE{', FILE'.join(ARCHIVE_SUFFIXES)} for an archive, or a folder "
                        f"name without an archive suffix (other archive formats are not written)")
    if not os.path.lexists(out):
        return out
    if not replace:
        raise FarmError(f"--out {out}: already exists; expected a new path (--replace replaces an archive or a "
                        f"bundle folder there)")
    if is_archive(out.name) and (out.is_symlink() or not out.is_file()):
        raise FarmError(f"--out {out}: expected an archive file to replace, found a folder or link; left as it was")
    if not is_archive(out.name) and not artifacts.is_replaceable(out):
        raise FarmError(f"--out {out}: exists and is not a bundle folder (expected its files to be a bundle's "
                        f"{', '.join(sorted(artifacts.BUNDLE_FILES))}); left as it was")
    return out


def merge(inputs: Sequence[str | Path], out: str | Path, key: Ed25519PrivateKey, trust: Trust, *,
          allow_unsigned: bool = False, replace: bool = False) -> MergeResult:
    """Verify each input bundle, merge them, and write one signed bundle at `out` (archive or folder).
    An existing `out` is refused unless `replace` (see `check_out`); it may be one of the inputs.
    One bundle that `key` signed already (a run's, packed to publish) is written byte for byte, its
    id kept: the id a retune's report names is the one deployments pull."""
    if not inputs:
        raise FarmError("bundle: expected at least one run folder, bundle folder or bundle archive")
    out = check_out(Path(out), replace)
    configs: list[tuple[str, list[dict[str, Any]]]] = []
    trials: list[list[dict[str, Any]]] = []
    run_ids: list[str] = []
    merged_from: list[str] = []
    notes: list[str] = []
    signer = signing.key_id(key.public_key())
    kept: Path | None = None   # a copy of the one input, where `key` signed it
    with tempfile.TemporaryDirectory(prefix=".farm-bundle-", dir=out.parent if out.parent.exists() else None) as tmp:
        for given in inputs:
            with open_bundle(given, trust, allow_unsigned=allow_unsigned) as opened:
                if opened.warning:
                    notes.append(opened.warning)
                if opened.bundle_id in merged_from:
                    notes.append(f"{given}: bundle {opened.bundle_id} was already given; merged once")
                    continue
                merged_from.append(opened.bundle_id)
                rows = opened.configs().to_pylist()
                configs.append((str(given), rows))
                trials.append(opened.trials().to_pylist())
                if len(merged_from) == 1 and opened.signed and opened.manifest.get("signer_key_id") == signer:
                    kept = artifacts.copy_bundle(opened.folder, Path(tmp) / "kept")
            saved_ids = opened.manifest.get("run_ids")
            for run_id in [*(saved_ids if isinstance(saved_ids, list) else []), *(r.get("run_id") for r in rows)]:
                if isinstance(run_id, str) and run_id and run_id not in run_ids:
                    run_ids.append(run_id)
        rows, replaced = merge_rows(configs)
        all_trials = merge_trials(trials)
        meta = {"run_ids": run_ids, "merged_from": merged_from}
        keep = kept is not None and len(merged_from) == 1 and not replaced
        if keep:
            staged = kept
        else:
            staged = artifacts.write_bundle(Path(tmp) / "merged", rows, all_trials, key, meta)
        written = verify(staged, Trust({signer: key.public_key()}))   # a kept copy: the bytes verified above
        if is_archive(out.name):
            write_archive(staged, out)
        else:
            artifacts.copy_bundle(staged, out)
    return MergeResult(out, len(rows), len(all_trials), replaced, tuple(map(str, inputs)), tuple(notes),
                       str(written.manifest.get("bundle_id")), keep)
