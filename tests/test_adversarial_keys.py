"""Key files under hostile conditions: umask 000, links at the key paths, open permissions, junk.

Real `python -m farm keygen` processes (under a real `umask 000` shell) and real key files: each
case ends in keys with the right modes, or one error line with nothing written or followed.
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from farm.bundle import signing
from farm.errors import MAX_MESSAGE, FarmError

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 60


def _keygen(path: Path, umask: str = "022") -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f'umask {umask} && exec "$0" -m farm keygen "$1"', sys.executable,
                           str(path)], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", ["000", "022", "077"])
def test_key_modes_do_not_depend_on_the_umask(tmp_path, umask):
    proc = _keygen(tmp_path / "k.pem", umask)
    assert proc.returncode == 0, proc.stderr
    assert _mode(tmp_path / "k.pem") == 0o600 and _mode(tmp_path / "k.pem.pub") == 0o644


@pytest.mark.parametrize("which", ["private", "public"])
@pytest.mark.parametrize("link", ["dangling", "to-a-file"])
def test_links_at_key_paths_are_refused_not_followed(tmp_path, which, link):
    key = tmp_path / "k.pem"
    at = key if which == "private" else tmp_path / "k.pem.pub"
    target = tmp_path / "elsewhere" / "victim"
    target.parent.mkdir()
    if link == "to-a-file":
        target.write_text("precious")
    at.symlink_to(target)
    proc = _keygen(key, "000")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "symbolic link" in proc.stderr
    assert (target.read_text() == "precious") if link == "to-a-file" else not target.exists()
    other = tmp_path / "k.pem.pub" if which == "private" else key
    assert not os.path.lexists(other)  # nothing half-written


def test_keygen_in_an_unwritable_place_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    proc = _keygen(tmp_path / "file" / "k.pem")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o666])
def test_private_key_open_to_others_is_refused(tmp_path, mode, monkeypatch):
    private, _, _ = signing.generate_keypair(tmp_path / "k.pem")
    os.chmod(private, mode)
    monkeypatch.delenv(signing.ALLOW_OPEN_KEY_ENV, raising=False)
    with pytest.raises(FarmError, match=f"permissions {mode:04o}.*chmod 600"):
        signing.load_private_key(private)
    monkeypatch.setenv(signing.ALLOW_OPEN_KEY_ENV, "1")
    with pytest.warns(UserWarning, match="signing anyway"):
        assert signing.load_private_key(private) is not None
    os.chmod(private, 0o600)
    monkeypatch.delenv(signing.ALLOW_OPEN_KEY_ENV)
    assert signing.load_private_key(private) is not None


def test_cli_refuses_an_open_key_in_one_line(tmp_path):
    private, _, _ = signing.generate_keypair(tmp_path / "k.pem")
    os.chmod(private, 0o644)
    proc = subprocess.run([sys.executable, "-m", "farm", "bundle", str(tmp_path), "--out", str(tmp_path / "o.tar.gz"),
                           "--key", str(private), "--allow-unsigned"], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=REPO, env={**{k: v for k, v in os.environ.items()
                                                               if k != signing.ALLOW_OPEN_KEY_ENV},
                                                            "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and "chmod 600" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("content", [b"", b"\x00" * 100, os.urandom(3000), b"-----BEGIN PRIVATE KEY-----\n" * 5,
                                     b"A" * (1 << 20)])
def test_junk_key_files_are_bounded_errors(tmp_path, content):
    path = tmp_path / "junk.pem"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    for load in (signing.load_private_key, signing.load_public_key):
        with pytest.raises(FarmError) as err:
            load(path)
        assert "\n" not in str(err.value) and len(str(err.value)) <= MAX_MESSAGE


def test_a_fifo_or_device_as_a_key_is_refused_not_waited_on(tmp_path):
    """A plain open() of a FIFO blocks until a writer comes: a key path, or a `*.pub` in a trust folder."""
    from farm.bundle import trust

    fifo = tmp_path / "key.pem"
    os.mkfifo(fifo, 0o600)
    for load in (signing.load_private_key, signing.load_public_key):
        with pytest.raises(FarmError, match="regular file"):
            load(fifo)
    folder = tmp_path / "trust"
    folder.mkdir()
    os.mkfifo(folder / "ci.pub")
    with pytest.raises(FarmError, match="regular file"):
        trust.load_trust([folder])
    with pytest.raises(FarmError, match="regular file"):
        signing.load_public_key("/dev/zero")
