"""Hostile bundle archives: refused from their headers before a byte is written, in bounded time.

Real archives (decompression bombs, lying headers, forged signers, random corruption) go through
`extract_archive`, `farm pull` and a real `python -m farm verify` process (killed after a timeout,
so a hang fails the test); every refusal is one line naming what the user gave, never a staging
folder, and leaves nothing behind.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import random
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from farm.bundle import artifacts, signing
from farm.bundle.archive import extract_archive, write_archive
from farm.bundle.trust import load_trust
from farm.deploy import pull
from farm.errors import MAX_MESSAGE, BundleError, FarmError
from tests import bundles as B

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 60


@pytest.fixture()
def signed(tmp_path):
    """A signed bundle folder, its archive, the private key and a trust folder."""
    folder, trust, private, _ = B.signed_with_trust(tmp_path, "src")
    return folder, write_archive(folder, tmp_path / "good.tar.gz"), private, trust


def _refused_before_writing(archive: Path, dest: Path, match: str, seconds: float) -> None:
    """Extraction refuses `archive` within `seconds`, in one line, and creates nothing at `dest`."""
    start = time.monotonic()
    with pytest.raises(BundleError, match=match) as err:
        extract_archive(archive, dest)
    assert time.monotonic() - start < seconds and not dest.exists()
    _one_line(err.value)


def _resign(folder: Path, private, **changes) -> None:
    manifest = json.loads((folder / artifacts.MANIFEST).read_text())
    manifest.update(changes)
    data = json.dumps(manifest, indent=2, sort_keys=True).encode()
    (folder / artifacts.MANIFEST).write_bytes(data)
    (folder / artifacts.SIGNATURE).write_bytes(signing.sign(data, private))


def _tar(out: Path, members: list[tuple[str, bytes | int]], mode: str = "w:gz") -> Path:
    """An archive of (name, data) members; an int is a member of that many zero bytes (streamed)."""
    with tarfile.open(out, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, int):
                info.size = data
                tar.addfile(info, _Zeros(data))
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def _lying_header(out: Path, name: str, declared: int, folder: Path) -> Path:
    """A gzip tar whose member `name` declares `declared` bytes but carries only 1 MiB of zeros."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for file in (artifacts.MANIFEST, artifacts.SIGNATURE):
            tar.add(folder / file, arcname=file)
    info = tarfile.TarInfo(name)
    info.size = declared
    header = info.tobuf(tarfile.GNU_FORMAT)
    raw = buf.getvalue().rstrip(b"\0")
    raw += bytes(-len(raw) % 512) + header + bytes(1 << 20)
    out.write_bytes(gzip.compress(raw, 1))
    return out


def _no_staging(text: str) -> None:
    assert ".staging" not in text and "/tmp/farm-" not in text and "farm-bundle-" not in text, text


def _one_line(err: Exception | str) -> str:
    text = str(err)
    assert "\n" not in text and len(text) <= MAX_MESSAGE, text[:300]
    _no_staging(text)
    return text


def test_decompression_bomb_writes_nothing(tmp_path, signed):
    folder, _, private, _ = signed
    bomb = _tar(tmp_path / "bomb.tar.gz", [(artifacts.MANIFEST, (folder / artifacts.MANIFEST).read_bytes()),
                                           (artifacts.SIGNATURE, (folder / artifacts.SIGNATURE).read_bytes()),
                                           (artifacts.CONFIGS, 64 << 20)])
    assert bomb.stat().st_size < 1 << 20
    _refused_before_writing(bomb, tmp_path / "out", "holds 67108864 bytes; its manifest.json says", 10)


@pytest.mark.parametrize("declared", [3 << 30, 1 << 40, 8 ** 11 - 1])
def test_declared_size_over_the_budget_is_refused_before_reading(tmp_path, signed, declared):
    folder, _, _, _ = signed
    bomb = _lying_header(tmp_path / "lying.tar.gz", artifacts.CONFIGS, declared, folder)
    _refused_before_writing(bomb, tmp_path / "out", "declares|not a complete tar", 5)


@pytest.mark.parametrize("kind", ["pax", "gnu"])
def test_an_extended_header_bomb_is_refused_before_its_data_is_read(tmp_path, signed, kind):
    """tarfile reads a pax or GNU long-name header's data whole into memory: one of 3 GiB took 3.2
    GB and 71 s before `farm verify` said OK. Refused from its declared size (here 65 MiB, a 70 kB file)."""
    folder, _, _, _ = signed
    info = tarfile.TarInfo("././@PaxHeader" if kind == "pax" else "././@LongLink")
    info.type = tarfile.XHDTYPE if kind == "pax" else tarfile.GNUTYPE_LONGNAME
    info.size = 65 << 20
    raw = info.tobuf(tarfile.GNU_FORMAT) + b"%d x=%s\n" % (9, b"y") + bytes(info.size)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for file in (artifacts.MANIFEST, artifacts.SIGNATURE, artifacts.CONFIGS, artifacts.TRIALS):
            tar.add(folder / file, arcname=file)
    bomb = tmp_path / f"{kind}.tar.gz"
    bomb.write_bytes(gzip.compress(raw[:-(len(raw) % 512) or None] + buf.getvalue(), 1))
    assert bomb.stat().st_size < 1 << 20
    _refused_before_writing(bomb, tmp_path / "out", "extended tar header; expected at most 65536", 5)


def test_an_archive_without_a_manifest_writes_nothing(tmp_path):
    """Nothing says which files or sizes to expect: refused from the headers, not after writing them."""
    archive = _tar(tmp_path / "bare.tar.gz", [(artifacts.CONFIGS, 8 << 20), ("notes.txt", b"x")])
    _refused_before_writing(archive, tmp_path / "out", "manifest.json missing", 5)
    bad = _tar(tmp_path / "bad.tar.gz", [(artifacts.MANIFEST, b"[1, 2]"), (artifacts.CONFIGS, 1 << 20)])
    _refused_before_writing(bad, tmp_path / "out", "manifest.json not a JSON object", 5)
    big = _tar(tmp_path / "big.tar.gz", [(artifacts.MANIFEST, 2 << 20)])
    _refused_before_writing(big, tmp_path / "out", "declares 2097152 bytes; expected at most 1048576", 5)


def test_consistent_manifest_still_bounded_by_the_budget(tmp_path, signed):
    folder, _, private, _ = signed
    _resign(folder, private, files={artifacts.CONFIGS: {"sha256": "0" * 64, "bytes": 8 << 20}})
    bomb = _tar(tmp_path / "bomb.tar.gz", [(artifacts.MANIFEST, (folder / artifacts.MANIFEST).read_bytes()),
                                           (artifacts.CONFIGS, 8 << 20)])
    with pytest.raises(BundleError, match="at most 1048576 bytes"):
        extract_archive(bomb, tmp_path / "out", max_bytes=1 << 20)
    assert not (tmp_path / "out").exists()


def test_untrusted_signer_is_refused_before_extraction(tmp_path, signed):
    folder, archive, _, trust = signed
    stranger, _ = B.keypair(tmp_path / "keys", "stranger")
    _resign(folder, stranger, signer_key_id=signing.key_id(stranger.public_key()))
    forged = write_archive(folder, tmp_path / "forged.tar.gz")
    seen: list[bytes] = []

    def check(manifest: bytes, signature: bytes | None) -> None:
        seen.append(manifest)
        raise BundleError("refused by the check")

    with pytest.raises(BundleError, match="refused by the check"):
        extract_archive(forged, tmp_path / "out", check_manifest=check)
    assert seen and not (tmp_path / "out").exists()
    with pytest.raises(BundleError, match="not trusted") as err:
        pull.pull(str(forged), tmp_path / "deploy", load_trust([trust]))
    _one_line(err.value)
    assert not [p for p in (tmp_path / "deploy").iterdir() if p.name.startswith(".staging")]


@pytest.mark.parametrize("case", ["too-many", "duplicate", "unlisted-nested", "huge-manifest", "empty",
                                  "not-tar", "manifest-not-json"])
def test_malformed_archives_are_one_line_errors(tmp_path, signed, case):
    folder, _, _, trust = signed
    files = [(p.name, p.read_bytes()) for p in sorted(folder.iterdir())]
    members = {
        "too-many": files + [(f"x{i}", b"") for i in range(100)],
        "duplicate": files + [files[0]],
        "unlisted-nested": files + [("sub/configs.parquet", b"x")],
        "huge-manifest": [(artifacts.MANIFEST, b" " * (2 << 20))],
        "empty": [],
        "manifest-not-json": [(artifacts.MANIFEST, b"\xff" * 100)] + files[:1],
    }
    out = tmp_path / f"{case}.tar.gz"
    if case == "not-tar":
        out.write_bytes(os.urandom(4096))
    else:
        _tar(out, members[case])
    with pytest.raises(FarmError) as err:
        pull.pull(str(out), tmp_path / "deploy", load_trust([trust]))
    text = _one_line(err.value)
    assert str(out) in text
    assert pull.installed(tmp_path / "deploy") is None


@pytest.mark.parametrize("seed", range(12))
def test_random_corruption_is_refused_or_verified(tmp_path, signed, seed):
    """Truncations and byte flips of a real archive: an error line naming it, or a verified bundle."""
    _, archive, _, trust = signed
    rng = random.Random(seed)
    data = bytearray(archive.read_bytes())
    if seed % 2:
        data = data[: rng.randrange(1, len(data))]
    else:
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(bytes(data))
    start = time.monotonic()
    try:
        result = pull.pull(str(bad), tmp_path / "deploy", load_trust([trust]))
    except FarmError as err:
        assert str(bad) in _one_line(err)
    else:
        assert result.signed  # a flip in gzip padding can leave the content intact: then it verified
    assert time.monotonic() - start < 10


def test_download_is_bounded(tmp_path, signed):
    folder, archive, _, _ = signed
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(BundleError, match="more than 1000") as err:
        pull.download(str(archive), staging, max_bytes=1000)
    _one_line(err.value)
    many = tmp_path / "many"
    many.mkdir()
    for i in range(100):
        (many / f"f{i}").write_bytes(b"x")
    staging2 = tmp_path / "staging2"
    staging2.mkdir()
    with pytest.raises(BundleError, match="at most 64 files"):
        pull.download(str(many), staging2)
    big = tmp_path / "bigfolder"
    big.mkdir()
    for name in ("a", "b", "c"):
        (big / name).write_bytes(bytes(600))
    staging3 = tmp_path / "staging3"
    staging3.mkdir()
    with pytest.raises(BundleError, match="more than"):  # the budget is for the folder, not per file
        pull.download(str(big), staging3, max_bytes=1000)


def test_cli_verify_of_a_bomb_exits_fast(tmp_path, signed):
    folder, _, _, trust = signed
    bomb = _lying_header(tmp_path / "bomb.tar.gz", artifacts.CONFIGS, 1 << 40, folder)
    proc = subprocess.run([sys.executable, "-m", "farm", "verify", str(bomb), "--trust", str(trust)],
                          capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and str(bomb) in proc.stderr
    _no_staging(proc.stderr)


def test_archives_are_written_manifest_first(signed):
    _, archive, _, _ = signed
    with tarfile.open(archive) as tar:
        assert tar.getnames()[:2] == [artifacts.MANIFEST, artifacts.SIGNATURE]
