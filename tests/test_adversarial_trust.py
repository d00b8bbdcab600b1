"""Trust folders fail closed: a revocation under a near-miss name is an error, never ignored.

Generated near-miss names, folders, dangling links and junk go through `load_trust` and a real
`python -m farm verify` / `farm show` process: each ends in one error line (the key never stays
trusted by accident), and a revoked key is reported as "revoked".
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm.bundle import signing
from farm.bundle.trust import load_trust
from farm.errors import MAX_MESSAGE, FarmError
from tests import bundles as B

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 60


@pytest.fixture()
def setup(tmp_path):
    """A signed bundle folder, its trust folder (one .pub) and the signer's key id."""
    folder, trust, _, public = B.signed_with_trust(tmp_path)
    return folder, trust, signing.key_id(signing.load_public_key(public)), public


def _farm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "farm", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


NEAR_MISSES = ["revoked.txt", "revoked.list", "REVOKED", "Revoked", "revoke", "ci.revoke", "ci.pub.revoke",
               "ci.revoked.bak", "ci.pub~", "revoked~", ".revoked.swp", "README", "notes.md", "ci.pem", "revocations"]


@pytest.mark.parametrize("name", NEAR_MISSES)
def test_near_miss_revocation_names_are_errors(setup, name):
    folder, trust, key_id, _ = setup
    (trust / name).write_text(f"{key_id}\n")
    with pytest.raises(FarmError, match="unknown file") as err:
        load_trust([trust])
    assert name in str(err.value) and "\n" not in str(err.value)
    proc = _farm("verify", str(folder), "--trust", str(trust))
    assert proc.returncode == 2 and "OK" not in proc.stdout and len(proc.stderr.strip().splitlines()) == 1
    assert "unknown file" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", ["revoked.d", "revoked", "keys", "ci.pub"])
def test_folders_in_a_trust_folder_are_errors(setup, name):
    folder, trust, key_id, _ = setup
    (trust / name).mkdir()
    (trust / name / "list").write_text(f"{key_id}\n")
    with pytest.raises(FarmError) as err:
        load_trust([trust])
    assert name in str(err.value)
    proc = _farm("verify", str(folder), "--trust", str(trust))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["revoked", "old.revoked", "ci2.pub"])
def test_dangling_links_in_a_trust_folder_are_errors(setup, name):
    folder, trust, _, _ = setup
    (trust / name).symlink_to(trust / "nowhere")
    with pytest.raises(FarmError, match="cannot read|not found"):
        load_trust([trust])
    proc = _farm("verify", str(folder), "--trust", str(trust))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("content", [b"\xff\xfe" * 1000, b"x" * (2 << 20), b"0123456789abcdef0\n" * 3,
                                     b"-----BEGIN PUBLIC KEY-----\ngarbage\n-----END PUBLIC KEY-----\n"])
def test_junk_revocations_are_bounded_errors(setup, content):
    _, trust, _, _ = setup
    (trust / "revoked").write_bytes(content)
    with pytest.raises(FarmError) as err:
        load_trust([trust])
    assert "\n" not in str(err.value) and len(str(err.value)) <= MAX_MESSAGE


@pytest.mark.parametrize("how", ["list", "key-file"])
def test_verify_and_show_say_revoked(setup, how):
    folder, trust, key_id, public = setup
    if how == "list":
        (trust / "revoked").write_text(f"# compromised\n{key_id}\n")
    else:
        (trust / f"{public.name}.revoked").write_bytes(public.read_bytes())
    for command in ("verify", "show"):  # the only key is revoked: the trust itself says so
        proc = _farm(command, str(folder), "--trust", str(trust))
        assert proc.returncode == 2, proc.stderr
        assert f"{key_id}, which is revoked" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    (trust / "other.pub").write_bytes(B.keypair(trust.parent / "k2", "other")[1].read_bytes())
    for command in ("verify", "show"):  # another key is trusted: the bundle is refused as revoked
        proc = _farm(command, str(folder), "--trust", str(trust))
        assert proc.returncode == 1, proc.stderr
        assert f"{key_id}, which is revoked" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_proper_names_still_work(setup):
    folder, trust, key_id, _ = setup
    (trust / "revoked").write_text("# nothing revoked yet\n")
    assert key_id in load_trust([trust]).keys
    proc = _farm("verify", str(folder), "--trust", str(trust))
    assert proc.returncode == 0 and proc.stdout.startswith("OK")
