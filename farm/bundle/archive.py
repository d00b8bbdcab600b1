"""Bundle archives: pack a bundle folder into one .tar.gz, and extract one safely.

Extraction refuses absolute paths, `..`, symbolic and hard links, devices and other special
members, duplicate names and archives over the size and member limits; it creates nothing
but plain folders and new plain files.
"""
from __future__ import annotations

import gzip
import os
import shutil
import tarfile
import uuid
import zlib
from pathlib import Path, PurePosixPath

from farm.errors import BundleError

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
MAX_EXTRACTED_BYTES = 4 << 30
MAX_MEMBERS = 64
CHUNK = 1 << 20


def is_archive(name: str) -> bool:
    """Whether a path or URL names a bundle archive (by its suffix)."""
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def _member_path(member: tarfile.TarInfo, archive: str) -> PurePosixPath | None:
    """The safe relative path of a member, None for the archive root; else BundleError."""
    name = member.name
    where = f"{archive}: member {name!r}"
    if member.issym():
        raise BundleError(f"{where} is a symbolic link (to {member.linkname!r}); expected only files and folders")
    if member.islnk():
        raise BundleError(f"{where} is a hard link (to {member.linkname!r}); expected only files and folders")
    if member.ischr() or member.isblk() or member.isfifo():
        raise BundleError(f"{where} is a device or FIFO; expected only files and folders")
    if not (member.isfile() or member.isdir()):
        raise BundleError(f"{where} has unsupported type {member.type!r}; expected only files and folders")
    if not name or "\x00" in name or "\\" in name:
        raise BundleError(f"{where}: not a valid member name")
    path = PurePosixPath(name)
    if path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        raise BundleError(f"{where} has an absolute path; expected paths relative to the archive")
    parts = [p for p in path.parts if p != "."]
    if ".." in parts:
        raise BundleError(f"{where} contains '..' (path traversal); expected paths inside the archive")
    return PurePosixPath(*parts) if parts else None


def _extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    """Create a plain folder, or a new plain file with the member's bytes (never a link or device)."""
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    source = tar.extractfile(member)
    assert source is not None  # a regular file
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(source, out, CHUNK)


def extract_archive(archive: str | Path, dest: str | Path, *, max_bytes: int = MAX_EXTRACTED_BYTES,
                    max_members: int = MAX_MEMBERS, label: str | None = None) -> Path:
    """Extract a tar archive's plain files and folders into the new folder `dest`; the bundle root in it.

    Refuses (BundleError) links, devices, absolute paths, `..`, duplicate members and archives
    over the limits. Returns `dest`, or its only subfolder when the archive wraps one folder.
    Errors name `label` (e.g. the URL it came from), else the archive's path.
    """
    archive, dest = Path(archive), Path(dest)
    label = label or str(archive)
    dest.mkdir()
    seen: set[PurePosixPath] = set()
    total = 0
    try:
        with tarfile.open(archive, "r:*") as tar:
            for count, member in enumerate(tar, 1):
                if count > max_members:
                    raise BundleError(f"{label}: more than {max_members} members; expected a bundle archive")
                rel = _member_path(member, label)
                if rel is None:
                    continue
                if rel in seen:
                    raise BundleError(f"{label}: member {member.name!r} appears twice; expected unique names")
                seen.add(rel)
                if member.isfile():
                    total += member.size
                    if total > max_bytes:
                        raise BundleError(f"{label}: more than {max_bytes} bytes when extracted; "
                                          f"expected a bundle archive")
                try:
                    _extract_member(tar, member, dest.joinpath(*rel.parts))
                except OSError as err:
                    raise BundleError(f"{label}: member {member.name!r}: cannot extract ({err.strerror})") from None
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise BundleError(f"{label}: not a complete tar archive (truncated or corrupt download?): {err}") from None
    entries = list(dest.iterdir())
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return dest



def write_archive(bundle: Path, out: Path) -> Path:
    """Pack a bundle folder's files, at the archive root, into a .tar.gz written atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tarfile.open(tmp, "w:gz" if not out.name.endswith(".tar") else "w") as tar:
            for file in sorted(bundle.iterdir()):
                info = tar.gettarinfo(str(file), arcname=file.name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                with open(file, "rb") as f:
                    tar.addfile(info, f)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out
