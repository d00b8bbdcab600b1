"""The deployment cache touches only what it wrote, and rollback protection is a total order.

Real deployments (`farm pull` into real folders, with links and foreign folders planted in them)
and real signed bundles made in the same second: pruning never deletes or follows what the farm
did not install, and two bundles never replace each other back and forth.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm.bundle import artifacts, signing
from farm.bundle.archive import write_archive
from farm.bundle.trust import load_trust
from farm.deploy import pull
from farm.errors import BundleError, FarmError
from tests import bundles as B

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 60


@pytest.fixture()
def key(tmp_path):
    private, public = B.keypair(tmp_path / "keys", "ci")
    return private, load_trust([public]), public


def _bundle(tmp_path: Path, name: str, private, created: str, bundle_id: str | None = None) -> Path:
    folder = B.write(tmp_path / "src" / name, [B.row("softmax", (64, 256), {"block_rows": 16})], private)
    manifest = json.loads((folder / artifacts.MANIFEST).read_text())
    manifest["created"] = created
    if bundle_id:
        manifest["bundle_id"] = bundle_id
    data = json.dumps(manifest, indent=2, sort_keys=True).encode()
    (folder / artifacts.MANIFEST).write_bytes(data)
    (folder / artifacts.SIGNATURE).write_bytes(signing.sign(data, private))
    return write_archive(folder, tmp_path / "www" / f"{name}.tar.gz")


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_versions_linked_elsewhere_is_refused_and_untouched(tmp_path, key):
    private, trust, _ = key
    elsewhere = tmp_path / "elsewhere"
    for i in range(3):
        (elsewhere / f"precious-{i}").mkdir(parents=True)
        (elsewhere / f"precious-{i}" / "data").write_text(str(i))
    dest = tmp_path / "deploy"
    dest.mkdir()
    (dest / pull.VERSIONS).symlink_to(elsewhere)
    before = _tree(elsewhere)
    with pytest.raises(FarmError, match="symbolic link") as err:
        pull.pull(str(_bundle(tmp_path, "v1", private, "2025-01-01T00:00:00+00:00")), dest, trust, keep=1)
    assert "\n" not in str(err.value) and ".staging" not in str(err.value)
    assert _tree(elsewhere) == before and sorted(p.name for p in elsewhere.iterdir()) == [
        "precious-0", "precious-1", "precious-2"]


@pytest.mark.parametrize("keep", [1, 2])
def test_prune_keeps_folders_and_links_the_farm_did_not_write(tmp_path, key, keep):
    private, trust, _ = key
    dest = tmp_path / "deploy"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data").write_text("precious")
    pull.pull(str(_bundle(tmp_path, "v0", private, "2025-01-01T00:00:00+00:00")), dest, trust, keep=keep)
    versions = dest / pull.VERSIONS
    foreign = {"00000000T000000-aaaaaaaaaaaa": "a folder named like a version",
               "mine": "someone's files", "zzzz": "sorted last"}
    for name, text in foreign.items():
        (versions / name).mkdir()
        (versions / name / "note").write_text(text)
    (versions / "20240101T000000-linkedlinked").symlink_to(outside)
    installed = []
    for day in range(2, 7):
        result = pull.pull(str(_bundle(tmp_path, f"v{day}", private, f"2025-01-0{day}T00:00:00+00:00")), dest,
                           trust, keep=keep)
        installed.append(result.installed.name)
    names = {p.name for p in versions.iterdir()}
    assert set(foreign) <= names and all((versions / n / "note").read_text() == t for n, t in foreign.items())
    assert (versions / "20240101T000000-linkedlinked").is_symlink() and (outside / "data").read_text() == "precious"
    assert set(installed[-keep:]) <= names and not set(installed[:-keep]) & names
    assert pull.read_record(dest) == installed[-keep:]


def test_same_second_bundles_do_not_swap_back_and_forth(tmp_path, key):
    private, trust, _ = key
    second = "2025-03-01T12:00:00+00:00"
    a = _bundle(tmp_path, "a", private, second, "a" * 32)
    b = _bundle(tmp_path, "b", private, second, "b" * 32)
    dest = tmp_path / "deploy"
    pull.pull(str(a), dest, trust)
    pull.pull(str(b), dest, trust)                        # the larger id counts as newer
    with pytest.raises(BundleError, match="older than the installed one.*same second"):
        pull.pull(str(a), dest, trust)                    # a replay of the other is refused
    assert pull.installed(dest).name.endswith("b" * 12)
    dest2 = tmp_path / "deploy2"
    pull.pull(str(b), dest2, trust)
    with pytest.raises(BundleError, match="older than the installed one"):
        pull.pull(str(a), dest2, trust)                   # same answer in the other order


def test_bundles_written_back_to_back_are_ordered(tmp_path, key):
    private, trust, public = key
    folders = [B.write(tmp_path / f"b{i}", B.SOFTMAX_ROWS, private) for i in range(3)]
    created = [json.loads((f / artifacts.MANIFEST).read_text())["created"] for f in folders]
    assert len(set(created)) == 3 and "." in created[0]   # to the microsecond
    dest = tmp_path / "deploy"
    for folder in folders:
        pull.pull(str(folder), dest, trust)
    with pytest.raises(BundleError, match="older than the installed one"):
        pull.pull(str(folders[0]), dest, trust)


def test_cli_pull_errors_name_the_url_not_staging(tmp_path, key):
    private, trust, public = key
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    (trust_dir / public.name).write_bytes(public.read_bytes())
    bad = tmp_path / "www" / "bad.tar.gz"
    bad.parent.mkdir(exist_ok=True)
    bad.write_bytes(os.urandom(2000))
    dest = tmp_path / "deploy"
    proc = subprocess.run([sys.executable, "-m", "farm", "pull", str(bad), "--dest", str(dest), "--trust",
                           str(trust_dir), "--keep", "1"], capture_output=True, text=True, timeout=TIMEOUT_S,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1 and str(bad) in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert ".staging" not in proc.stderr and "/tmp/farm-" not in proc.stderr
    assert [p.name for p in dest.iterdir() if not p.name.startswith(".lock")] == []
