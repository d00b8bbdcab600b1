"""Bundle archives: pack a bundle folder into one .tar.gz, and extract one safely.

Extraction refuses absolute paths, `..`, symbolic and hard links, devices and other special
members, duplicate names, archives over the size and member limits, and files the manifest does
not list or whose size it does not declare; all of this from the headers, before a byte is
written (a decompression bomb writes nothing). It creates nothing but plain folders and new
plain files. Archives are written with the manifest and signature first.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import lzma
import os
import tarfile
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from farm.errors import BundleError, shorten, show

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
MAX_EXTRACTED_BYTES = 2 << 30
MAX_MEMBERS = 64
CHUNK = 1 << 20
MANIFEST_NAME, SIGNATURE_NAME = "manifest.json", "manifest.sig"   # farm.bundle.artifacts' names
# The small files read in the first pass, and the most bytes each may declare.
SMALL_FILES = {MANIFEST_NAME: 1 << 20, SIGNATURE_NAME: 4096}
# A pax or GNU long-name header's data is read whole into memory by `tarfile` as it iterates (a
# 14 MB .tar.gz can hold one of 3 GiB); a bundle's headers hold a few short names.
MAX_EXTENSION_HEADER = 64 << 10
_EXTENSION_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                    tarfile.SOLARIS_XHDTYPE)


class _BoundedTarInfo(tarfile.TarInfo):
    """A member header whose extension headers (pax, GNU long names) are refused over
    MAX_EXTENSION_HEADER bytes before `tarfile` reads their data, and sparse members refused."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENSION_TYPES and self.size > MAX_EXTENSION_HEADER:
            raise BundleError(f"{show(tarfile_.name or '?')}: a {self.size}-byte extended tar header; expected at "
                              f"most {MAX_EXTENSION_HEADER} (a header bomb?)")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise BundleError(f"{show(tarfile_.name or '?')}: a sparse member; expected only files and folders")
        return super()._proc_member(tarfile_)


def _open_tar(archive: Path) -> tarfile.TarFile:
    """A tar archive (any compression tarfile reads) opened for reading with bounded headers."""
    return tarfile.open(archive, "r:*", tarinfo=_BoundedTarInfo)


def is_archive(name: str) -> bool:
    """Whether a path or URL names a bundle archive (by its suffix)."""
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def _member_path(member: tarfile.TarInfo, archive: str) -> PurePosixPath | None:
    """The safe relative path of a member, None for the archive root; else BundleError."""
    name = member.name
    where = f"{archive}: member {show(name)}"
    if member.issym():
        raise BundleError(f"{where} is a symbolic link (to {show(member.linkname)}); expected only files and folders")
    if member.islnk():
        raise BundleError(f"{where} is a hard link (to {show(member.linkname)}); expected only files and folders")
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
    left = member.size
    with os.fdopen(fd, "wb") as out:
        while left > 0 and (block := source.read(min(CHUNK, left))):
            out.write(block)
            left -= len(block)


@dataclasses.dataclass
class _Plan:
    """What a first pass over an archive's headers found: its members, and the manifest's bytes."""

    members: dict[PurePosixPath, tarfile.TarInfo] = dataclasses.field(default_factory=dict)
    manifest: bytes | None = None
    signature: bytes | None = None


def _root(paths: list[PurePosixPath]) -> PurePosixPath:
    """The bundle root inside the archive: its only top folder when every member lies under one, else ''."""
    tops = {p.parts[0] for p in paths}
    if len(tops) == 1 and any(len(p.parts) > 1 for p in paths):
        return PurePosixPath(next(iter(tops)))
    return PurePosixPath()


def _scan(tar: tarfile.TarFile, label: str, max_bytes: int, max_members: int) -> _Plan:
    """Read only the headers (and the small manifest and signature): every check that needs no file data.

    A member's declared size is refused before its data is read, so a decompression bomb costs at
    most `max_bytes` of decompression here and writes nothing.
    """
    plan, total = _Plan(), 0
    for count, member in enumerate(tar, 1):
        if count > max_members:
            raise BundleError(f"{label}: more than {max_members} members; expected a bundle archive")
        rel = _member_path(member, label)
        if rel is None:
            continue
        if rel in plan.members:
            raise BundleError(f"{label}: member {show(member.name)} appears twice; expected unique names")
        plan.members[rel] = member
        if not member.isfile():
            continue
        limit = SMALL_FILES.get(rel.name, max_bytes)
        total += member.size
        if member.size > limit and rel.name in SMALL_FILES:
            raise BundleError(f"{label}: member {show(member.name)} declares {member.size} bytes; expected at most "
                              f"{limit} (decompression bomb?)")
        if total > max_bytes:
            raise BundleError(f"{label}: member {show(member.name)} declares {member.size} bytes ({total} in all); "
                              f"expected a bundle archive of at most {max_bytes} bytes (decompression bomb?)")
        if rel.name in SMALL_FILES and len(rel.parts) <= 2:
            source = tar.extractfile(member)
            assert source is not None
            data = source.read(limit + 1)
            if rel.name == MANIFEST_NAME:
                plan.manifest = data
            else:
                plan.signature = data
    return plan


def _check_plan(plan: _Plan, label: str) -> PurePosixPath:
    """Every file member is one the manifest lists, with the size it declares; the bundle root."""
    root = _root(list(plan.members))
    files = {rel: m for rel, m in plan.members.items() if m.isfile()}
    manifest = None
    if plan.manifest is not None and (root / MANIFEST_NAME) in files:
        try:
            manifest = json.loads(plan.manifest)
        except ValueError:
            manifest = None
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict):  # refused before any file is written: nothing says what may be
        what = "missing" if (root / MANIFEST_NAME) not in files else "not a JSON object with a 'files' table"
        raise BundleError(f"{label}: {MANIFEST_NAME} {what}; expected a bundle archive (its manifest lists "
                          f"every file)")
    known = {root / MANIFEST_NAME, root / SIGNATURE_NAME}
    unlisted = sorted(str(rel) for rel in files if rel not in known and
                      (rel.parent != root or rel.name not in listed))
    if unlisted:
        raise BundleError(f"{label}: unlisted files {show(unlisted)}; expected only the files its "
                          f"{MANIFEST_NAME} lists")
    for rel, member in files.items():
        entry = listed.get(rel.name) if rel not in known else None
        declared = entry.get("bytes") if isinstance(entry, dict) else None
        if isinstance(declared, int) and member.size != declared:
            raise BundleError(f"{label}: member {show(member.name)} holds {member.size} bytes; its "
                              f"{MANIFEST_NAME} says {declared} (truncated or tampered)")
    return root


def extract_archive(archive: str | Path, dest: str | Path, *, max_bytes: int = MAX_EXTRACTED_BYTES,
                    max_members: int = MAX_MEMBERS, label: str | None = None,
                    check_manifest: Callable[[bytes, bytes | None], None] | None = None) -> Path:
    """Extract a tar archive's plain files and folders into the new folder `dest`; the bundle root in it.

    Two passes. The first reads only headers (and the manifest and signature, each a few KiB) and
    refuses, before anything is written: links, devices, absolute paths, `..`, duplicate members,
    more than `max_members` members, declared sizes over `max_bytes` in all, files the manifest
    does not list or whose size differs from the manifest's, and whatever `check_manifest(manifest,
    signature)` refuses (e.g. a signer that is not trusted). The second writes each file, copying
    no more than its declared size. Returns `dest`, or its only subfolder when the archive wraps
    one folder. Errors name `label` (e.g. the URL it came from), else the archive's path.
    """
    archive, dest = Path(archive), Path(dest)
    label = label or str(archive)
    try:
        with _open_tar(archive) as tar:
            plan = _scan(tar, label, max_bytes, max_members)
        _check_plan(plan, label)
        if check_manifest is not None and plan.manifest is not None:
            check_manifest(plan.manifest, plan.signature)
        dest.mkdir()
        written = 0
        with _open_tar(archive) as tar:
            for member in tar:
                rel = _member_path(member, label)
                if rel is None:
                    continue
                known = plan.members.get(rel)
                if known is None or known.size != member.size or known.type != member.type:
                    raise BundleError(f"{label}: changed while it was read; expected a stable archive file")
                written += member.size if member.isfile() else 0
                if written > max_bytes:
                    raise BundleError(f"{label}: more than {max_bytes} bytes when extracted; expected a bundle archive")
                try:
                    _extract_member(tar, member, dest.joinpath(*rel.parts))
                except OSError as err:
                    raise BundleError(f"{label}: member {show(member.name)}: cannot extract ({err.strerror})") from None
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError) as err:
        raise BundleError(f"{label}: not a complete tar archive (truncated or corrupt download?): "
                          f"{shorten(str(err), 200)}") from None
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
            for file in sorted(bundle.iterdir(), key=lambda f: (f.name not in SMALL_FILES, f.name)):
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
