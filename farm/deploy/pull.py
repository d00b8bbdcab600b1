"""Download a bundle into a deployment folder: fetch, extract safely, verify, then swap atomically.

`farm pull URL --dest DIR --trust KEY...` reads URL through fsspec: a local path, file://,
http(s):// (aiohttp), and gs:// or s3:// when gcsfs / s3fs are installed. URL is a bundle
archive (.tar.gz, .tgz or .tar, made by `farm bundle`) or, on a file system that has folders,
a bundle folder. The deployment folder holds

    DIR/current -> versions/<created>-<bundle id>   a relative symbolic link, swapped by rename
    DIR/versions/<created>-<bundle id>/             verified bundles (the newest `keep` are kept)
    DIR/.farm-installed.json                        the versions this tool installed, oldest first
    DIR/.lock                                       serialises concurrent pulls into DIR

Pruning (`keep`) removes only versions named in `.farm-installed.json`, only real folders
directly inside `DIR/versions`: never a folder the farm did not write, never a symbolic link,
and nothing at all through a `versions` that is itself a link (such a DIR is refused).

(`farm.bundle.locate` owns this layout's names and opens a deployment folder like any bundle.)

Everything is downloaded and extracted into a staging folder inside DIR, and verified there
(revocation, signature, every file's size and sha256) before anything is installed. Extraction
refuses absolute paths, `..`, symbolic and hard links, devices and other special members, and
archives over the size limits; it never creates anything but plain folders and files. The new
version is renamed into `versions/`, then `current` is replaced by one atomic rename, so a
failed, partial or tampered download leaves the installed bundle untouched. A bundle older
than the installed one is refused unless `allow_older` is set, so a replayed old bundle cannot
roll a deployment back: bundles are ordered by manifest `created` (to the microsecond since
this version; to the second before) and then by bundle id, a total order, so two bundles made in
the same second cannot replace each other back and forth.

Before anything but the manifest and signature is extracted, the archive's headers are checked
(declared sizes against the manifest and a budget) and its signer against the trust (revoked,
untrusted or forged signers are refused unless `allow_unsigned`): a decompression bomb or a
forged archive writes nothing. Messages name URL and --dest as given, never the staging folder.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from farm.bundle import artifacts
from farm.bundle.archive import CHUNK, MAX_EXTRACTED_BYTES, MAX_MEMBERS, extract_archive, is_archive
from farm.bundle.compare import task_label
from farm.bundle.locate import CURRENT, VERSIONS, installed
from farm.bundle.trust import Trust, Verified, check_signature, unsigned_refusal, verify
from farm.errors import BundleError, FarmError, shorten, show

LOCK = ".lock"
RECORD = ".farm-installed.json"   # the version folders this tool installed, oldest first
MAX_DOWNLOAD_BYTES = MAX_EXTRACTED_BYTES


@dataclasses.dataclass(frozen=True)
class PullResult:
    """What a pull installed: the version folder, its manifest, and what it replaced."""

    installed: Path
    manifest: dict[str, Any]
    previous: Path | None
    signed: bool
    reused: bool
    warning: str | None = None
    dropped: tuple[str, ...] = ()   # tuned tasks (task key, and device kind where one is named) of the
    #                                 replaced bundle that the new one lacks: they now run a nearest or default


def _tuned_tasks(folder: Path) -> set[str]:
    """The tasks a bundle folder holds a tuned config for ("key" or "key on DEVICE KIND"); empty
    when its table cannot be read (an installed bundle that does not read does not block a pull)."""
    try:
        table = pq.read_table(folder / artifacts.CONFIGS, columns=["task_key", "device_kind", "status"])
    except (OSError, pa.ArrowException, KeyError):
        return set()
    return {task_label(str(key), kind)
            for key, kind, status in zip(*(table.column(c).to_pylist() for c in table.column_names))
            if status == "ok"}


def _open_source(url: str, timeout: float, storage_options: Mapping[str, Any]) -> tuple[Any, str]:
    """The fsspec file system and path for `url`; http(s) gets a total timeout."""
    import fsspec

    options = dict(storage_options)
    protocol = fsspec.core.split_protocol(url)[0] or "file"
    if protocol in ("http", "https"):
        import aiohttp

        options.setdefault("client_kwargs", {"timeout": aiohttp.ClientTimeout(total=timeout)})
        options.setdefault("skip_instance_cache", True)
    try:
        return fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as err:
        raise FarmError(f"{url}: cannot open this URL ({err}); expected a local path, file://, http(s)://, "
                        f"or gs:// / s3:// with gcsfs / s3fs installed") from None


def _is_http(fs: Any) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return any(p in ("http", "https") for p in protocols)


def _copy(fs: Any, path: str, target: Path, max_bytes: int, url: str) -> int:
    """Stream one remote file into `target`, refusing it once it passes `max_bytes` (or when its
    declared size already does, before a byte is read); its size."""
    kwargs = {"block_size": 0} if _is_http(fs) else {}  # stream, without range requests
    size = 0
    with fs.open(path, "rb", **kwargs) as source, open(target, "xb") as out:
        declared = getattr(source, "size", None)
        if isinstance(declared, int) and declared > max_bytes:
            raise BundleError(f"{url}: declares {declared} bytes, more than {max_bytes}; expected a bundle")
        while block := source.read(CHUNK):
            size += len(block)
            if size > max_bytes:
                raise BundleError(f"{url}: larger than {max_bytes} bytes; expected a bundle")
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    return size


def _download_error(url: str, err: Exception, timeout: float) -> str:
    """One line saying why a download failed (fsspec reports HTTP failures as FileNotFoundError)."""
    cause = err.__cause__ or err.__context__ or err
    status = getattr(cause, "status", None)
    if isinstance(cause, TimeoutError):
        return f"{url}: download failed (no complete answer within {timeout} s)"
    if status is not None:
        return f"{url}: download failed (HTTP {status} {getattr(cause, 'message', '')})".rstrip() + \
            (": not found" if status == 404 else "")
    if isinstance(err, FileNotFoundError):
        return f"{url}: not found; expected a bundle archive or folder"
    if isinstance(cause, OSError) and cause.strerror:  # its filename may be the staging folder: not shown
        return f"{url}: download failed ({type(cause).__name__}: {cause.strerror})"
    return f"{url}: download failed ({type(cause).__name__}: {shorten(str(cause), 300)})"


def download(url: str, staging: Path, *, timeout: float = 60.0, max_bytes: int = MAX_DOWNLOAD_BYTES,
             storage_options: Mapping[str, Any] | None = None,
             check_manifest: Callable[[bytes, bytes | None], None] | None = None) -> Path:
    """Fetch `url` (an archive or a bundle folder) into `staging`; the unverified bundle folder.

    At most `max_bytes` are downloaded in all (a folder: at most MAX_MEMBERS files); an archive is
    extracted only after its headers, declared sizes and `check_manifest` passed
    (`farm.bundle.archive.extract_archive`), so a decompression bomb writes nothing.
    """
    fs, path = _open_source(url, timeout, storage_options or {})
    try:
        if not is_archive(path) and not _is_http(fs) and fs.isdir(path):
            folder = staging / "bundle"
            folder.mkdir()
            entries = fs.ls(path, detail=True)
            if len(entries) > MAX_MEMBERS:
                raise BundleError(f"{url}: {len(entries)} entries; expected a bundle folder of at most "
                                  f"{MAX_MEMBERS} files")
            left = max_bytes
            for entry in entries:
                name = PurePosixPath(entry["name"]).name
                if entry.get("islink") or entry.get("type") != "file":
                    raise BundleError(f"{url}: {show(name)} is not a plain file; expected a bundle folder of files")
                left -= _copy(fs, entry["name"], folder / name, left, url)
            return folder
        archive = staging / "download"
        _copy(fs, path, archive, max_bytes, url)
    except FarmError:
        raise
    except Exception as err:  # network and backend errors come in many types
        raise FarmError(_download_error(url, err, timeout)) from None
    return extract_archive(archive, staging / "extracted", label=url, check_manifest=check_manifest)


def _fsync_tree(path: Path) -> None:
    for file in path.iterdir():
        with open(file, "rb") as f:
            os.fsync(f.fileno())
    artifacts.fsync_dir(path)


@contextlib.contextmanager
def _locked(dest: Path) -> Iterator[None]:
    fd = os.open(dest / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _version_name(manifest: Mapping[str, Any]) -> str:
    created = "".join(c for c in str(manifest.get("created", "")) if c.isalnum())[:15] or "undated"
    bundle_id = "".join(c for c in str(manifest.get("bundle_id", "")) if c.isalnum())[:12] or uuid.uuid4().hex[:12]
    return f"{created}-{bundle_id}"


def _versions_folder(dest: Path) -> Path:
    """DIR/versions, created when missing; FarmError when it is a link (installing or pruning through
    it would reach outside --dest) or not a folder."""
    versions = dest / VERSIONS
    if versions.is_symlink() or (versions.exists() and not versions.is_dir()):
        raise FarmError(f"--dest {dest}: {VERSIONS} is a symbolic link or not a folder; expected the folder "
                        f"`farm pull` makes (nothing outside --dest is touched)")
    versions.mkdir(exist_ok=True)
    return versions


def read_record(dest: Path) -> list[str]:
    """The version folders `farm pull` installed in `dest`, oldest first (DIR/.farm-installed.json)."""
    try:
        names = json.loads((dest / RECORD).read_bytes())
    except (OSError, ValueError):
        return []
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and n and "/" not in n and n not in (".", "..")]


def _write_record(dest: Path, names: list[str]) -> None:
    """Replace the record atomically (temp file, fsync, rename)."""
    tmp = dest / f"{RECORD}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "w") as f:
        json.dump(names, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dest / RECORD)
    artifacts.fsync_dir(dest)


def _install(staged: Verified, dest: Path, previous: Path | None) -> tuple[Path, bool]:
    versions = _versions_folder(dest)
    record = read_record(dest)
    name = _version_name(staged.manifest)
    target, reused = versions / name, False
    if os.path.lexists(target):
        same = name in record and not target.is_symlink() and target.is_dir() and \
            (target / artifacts.MANIFEST).is_file() and \
            (target / artifacts.MANIFEST).read_bytes() == staged.manifest_bytes
        if same:
            reused = True
        else:
            target = versions / f"{name}-{uuid.uuid4().hex[:6]}"
    # recorded before it exists: a crash leaves a name to skip, never an unrecorded folder to keep forever
    _write_record(dest, [n for n in record if n != target.name] + [target.name])
    if not reused:
        _fsync_tree(staged.path)
        os.rename(staged.path, target)
        artifacts.fsync_dir(versions)
    link_tmp = dest / f".{CURRENT}-{uuid.uuid4().hex[:8]}"
    os.symlink(Path(VERSIONS) / target.name, link_tmp)
    try:
        os.replace(link_tmp, dest / CURRENT)
    except BaseException:
        os.unlink(link_tmp)
        raise
    artifacts.fsync_dir(dest)
    return target, reused


def _prune(dest: Path, keep: int, current: Path) -> None:
    """Remove the oldest versions this tool installed beyond `keep` (the current one counts).

    Only names in the record, only real folders directly in DIR/versions (never a link, never
    anything the record does not name, never through a linked `versions`)."""
    versions = dest / VERSIONS
    if versions.is_symlink() or not versions.is_dir():
        return
    record = read_record(dest)
    old = [n for n in record if n != current.name]
    doomed = old[:max(0, len(old) - (keep - 1))]
    for name in doomed:
        folder = versions / name
        if os.path.lexists(folder) and not folder.is_symlink() and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
    if doomed:
        _write_record(dest, [n for n in record if n not in doomed])


def _order(manifest: Mapping[str, Any]) -> tuple[datetime, str] | None:
    """How bundles are ordered for rollback protection: `created` (to the microsecond in bundles this
    version writes), then bundle id, so two bundles made in the same second never both count as newer."""
    try:
        created = datetime.fromisoformat(str(manifest.get("created")))
    except ValueError:
        return None
    created = created if created.tzinfo else created.replace(tzinfo=timezone.utc)
    return created, str(manifest.get("bundle_id", ""))


def pull(url: str, dest: str | Path, trust: Trust, *, allow_unsigned: bool = False, allow_older: bool = False,
         keep: int = 2, timeout: float = 60.0, storage_options: Mapping[str, Any] | None = None) -> PullResult:
    """Download, verify and atomically install the bundle at `url` into the deployment folder `dest`."""
    if keep < 1:
        raise FarmError(f"keep: expected at least 1 version to keep, got {keep}")
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise FarmError(f"--dest {dest}: expected a deployment folder, found a file")
    dest.mkdir(parents=True, exist_ok=True)
    with _locked(dest):
        previous = installed(dest)
        kept = f"kept the installed bundle {previous}" if previous else "nothing was installed"
        def check_manifest(manifest: bytes, signature: bytes | None) -> None:
            """Before extracting: refuse a revoked, untrusted or forged signer (unless allow_unsigned)."""
            _, problem = check_signature(manifest, signature, trust, url)
            if problem is not None and not allow_unsigned:
                raise unsigned_refusal(url, problem)

        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=dest))
        try:
            folder = download(url, staging, timeout=timeout, storage_options=storage_options,
                              check_manifest=check_manifest)
            staged = verify(folder, trust, allow_unsigned=allow_unsigned, label=url)  # named as the user gave it
            if previous is not None and not allow_older:
                try:
                    old = json.loads((previous / artifacts.MANIFEST).read_bytes())
                except (OSError, ValueError):
                    old = {}  # an unreadable installed bundle does not block its replacement
                new_order, old_order = _order(staged.manifest), _order(old if isinstance(old, dict) else {})
                if new_order and old_order and new_order < old_order:
                    same_time = " (made in the same second; the larger bundle id counts as newer)" \
                        if new_order[0].replace(microsecond=0) == old_order[0].replace(microsecond=0) else ""
                    raise BundleError(f"{url}: bundle {show(staged.manifest.get('bundle_id'))} created "
                                      f"{show(staged.manifest['created'])} is older than the installed one "
                                      f"({show(old.get('created'))}, bundle {show(old.get('bundle_id'))}){same_time}; "
                                      f"expected a newer bundle (--allow-older installs it anyway)")
            target, reused = _install(staged, dest, previous)
        except BundleError as err:
            raise BundleError(f"{err}; {kept}") from None
        except FarmError as err:
            raise FarmError(f"{err}; {kept}") from None
        except OSError as err:  # its filename would name the staging folder, not what the user gave
            raise FarmError(f"--dest {dest}: cannot install {url} ({err.strerror}); {kept}") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        dropped = sorted(_tuned_tasks(previous) - _tuned_tasks(target)) if previous is not None else []
        _prune(dest, keep, target)
    return PullResult(target, staged.manifest, previous, staged.signed, reused, staged.warning, tuple(dropped))
