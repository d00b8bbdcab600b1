"""Download a bundle into a deployment folder: fetch, extract safely, verify, then swap atomically.

`farm pull URL --dest DIR --trust KEY...` reads URL through fsspec: a local path, file://,
http(s):// (aiohttp), and gs:// or s3:// when gcsfs / s3fs are installed. URL is a bundle
archive (.tar.gz, .tgz or .tar, made by `farm bundle`) or, on a file system that has folders,
a bundle folder. The deployment folder holds

    DIR/current -> versions/<created>-<bundle id>   a relative symbolic link, swapped by rename
    DIR/versions/<created>-<bundle id>/             verified bundles (the newest `keep` are kept)
    DIR/.lock                                       serialises concurrent pulls into DIR

(`farm.bundle.locate` owns this layout's names and opens a deployment folder like any bundle.)

Everything is downloaded and extracted into a staging folder inside DIR, and verified there
(revocation, signature, every file's size and sha256) before anything is installed. Extraction
refuses absolute paths, `..`, symbolic and hard links, devices and other special members, and
archives over the size limits; it never creates anything but plain folders and files. The new
version is renamed into `versions/`, then `current` is replaced by one atomic rename, so a
failed, partial or tampered download leaves the installed bundle untouched. A bundle older
(by manifest `created`) than the installed one is refused unless `allow_older` is set, so a
replayed old bundle cannot roll a deployment back.
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
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from farm.bundle import artifacts
from farm.bundle.archive import CHUNK, extract_archive, is_archive
from farm.bundle.locate import CURRENT, VERSIONS, installed
from farm.bundle.trust import Trust, Verified, verify
from farm.errors import BundleError, FarmError

LOCK = ".lock"
MAX_DOWNLOAD_BYTES = 2 << 30


@dataclasses.dataclass(frozen=True)
class PullResult:
    """What a pull installed: the version folder, its manifest, and what it replaced."""

    installed: Path
    manifest: dict[str, Any]
    previous: Path | None
    signed: bool
    reused: bool
    warning: str | None = None


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
    """Stream one remote file into `target`; its size."""
    kwargs = {"block_size": 0} if _is_http(fs) else {}  # stream, without range requests
    size = 0
    with fs.open(path, "rb", **kwargs) as source, open(target, "xb") as out:
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
    return f"{url}: download failed ({type(cause).__name__}: {' '.join(str(cause).split())})"


def download(url: str, staging: Path, *, timeout: float = 60.0, max_bytes: int = MAX_DOWNLOAD_BYTES,
             storage_options: Mapping[str, Any] | None = None) -> Path:
    """Fetch `url` (an archive or a bundle folder) into `staging`; the unverified bundle folder."""
    fs, path = _open_source(url, timeout, storage_options or {})
    try:
        if not is_archive(path) and not _is_http(fs) and fs.isdir(path):
            folder = staging / "bundle"
            folder.mkdir()
            for entry in fs.ls(path, detail=True):
                name = PurePosixPath(entry["name"]).name
                if entry.get("islink") or entry.get("type") != "file":
                    raise BundleError(f"{url}: {name!r} is not a plain file; expected a bundle folder of files")
                _copy(fs, entry["name"], folder / name, max_bytes, url)
            return folder
        archive = staging / "download"
        _copy(fs, path, archive, max_bytes, url)
    except FarmError:
        raise
    except Exception as err:  # network and backend errors come in many types
        raise FarmError(_download_error(url, err, timeout)) from None
    return extract_archive(archive, staging / "extracted", label=url)


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


def _install(staged: Verified, dest: Path, previous: Path | None) -> tuple[Path, bool]:
    versions = dest / VERSIONS
    versions.mkdir(exist_ok=True)
    name = _version_name(staged.manifest)
    target, reused = versions / name, False
    if target.exists():
        same = (target / artifacts.MANIFEST).is_file() and \
            (target / artifacts.MANIFEST).read_bytes() == staged.manifest_bytes
        if same:
            reused = True
        else:
            target = versions / f"{name}-{uuid.uuid4().hex[:6]}"
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
    versions = sorted((p for p in (dest / VERSIONS).iterdir() if p.is_dir()), key=lambda p: p.name)
    old = [p for p in versions if p.resolve() != current]
    for folder in old[:max(0, len(old) - (keep - 1))]:
        shutil.rmtree(folder, ignore_errors=True)


def _created(manifest: Mapping[str, Any]) -> datetime | None:
    try:
        created = datetime.fromisoformat(str(manifest.get("created")))
    except ValueError:
        return None
    return created if created.tzinfo else created.replace(tzinfo=timezone.utc)


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
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=dest))
        try:
            folder = download(url, staging, timeout=timeout, storage_options=storage_options)
            staged = verify(folder, trust, allow_unsigned=allow_unsigned, label=url)  # named as the user gave it
            if previous is not None and not allow_older:
                try:
                    old = json.loads((previous / artifacts.MANIFEST).read_bytes())
                except (OSError, ValueError):
                    old = {}  # an unreadable installed bundle does not block its replacement
                new_time, old_time = _created(staged.manifest), _created(old)
                if new_time and old_time and new_time < old_time:
                    raise BundleError(f"{url}: bundle created {staged.manifest['created']} is older than the "
                                      f"installed one ({old['created']}); expected a newer bundle "
                                      f"(--allow-older installs it anyway)")
            target, reused = _install(staged, dest, previous)
        except BundleError as err:
            raise BundleError(f"{err}; {kept}") from None
        except FarmError as err:
            raise FarmError(f"{err}; {kept}") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _prune(dest, keep, target.resolve())
    return PullResult(target, staged.manifest, previous, staged.signed, reused, staged.warning)
