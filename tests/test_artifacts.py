"""Signed bundles: any single flipped byte, an untrusted key or a stray file fails verification."""
from __future__ import annotations

import os
import stat

import pyarrow.parquet as pq
import pytest

from farm import cli
from farm.bundle import artifacts, signing
from farm.bundle.trust import load_trust, verify
from farm.errors import BundleError, FarmError

ROW = {"task_key": "softmax/64x256/float32/interpret", "kernel": "softmax", "shape": [64, 256],
       "dtype": "float32", "target": "interpret", "status": "ok", "config": '{"block_rows":8}',
       "median_s": 1e-4, "trials": 3, "run_id": "r1", "created": "2026-11-30T00:00:00+00:00"}
TRIAL = {"task_key": ROW["task_key"], "kernel": "softmax", "shape": [64, 256], "dtype": "float32",
         "target": "interpret", "trial": 0, "config": ROW["config"], "outcome": "ok", "median_s": 1e-4}


@pytest.fixture
def bundle(tmp_path, signing_key):
    key = signing.load_private_key(signing_key[0])
    return artifacts.write_bundle(tmp_path / "bundle", [ROW], [TRIAL], key)


def trusted(signing_key):
    return load_trust([signing_key[1]])


def test_bundle_verifies_and_reads_back(bundle, signing_key):
    manifest = verify(bundle, trusted(signing_key)).manifest
    assert manifest["schema_version"] == artifacts.SCHEMA_VERSION
    row = pq.read_table(bundle / "configs.parquet").to_pylist()[0]
    assert row["config"] == ROW["config"] and row["shape"] == [64, 256]
    assert not any(p.name.startswith(".") for p in bundle.parent.iterdir())  # no temp folders left


@pytest.mark.parametrize("name", ["configs.parquet", "trials.parquet", "manifest.json", "manifest.sig"])
def test_every_single_byte_flip_fails(bundle, signing_key, name):
    path = bundle / name
    original = path.read_bytes()
    keys = trusted(signing_key)
    # Every byte of the small files; a spread of positions in the Parquet files.
    positions = range(len(original)) if len(original) <= 1024 else range(0, len(original), max(1, len(original) // 400))
    for i in positions:
        data = bytearray(original)
        data[i] ^= 0x01
        path.write_bytes(bytes(data))
        with pytest.raises(BundleError):
            verify(bundle, keys)
    path.write_bytes(original)
    verify(bundle, keys)


def test_cli_verify_fails_on_flip(bundle, signing_key, capsys):
    assert cli.main(["verify", str(bundle), "--trust", str(signing_key[1])]) == 0
    data = bytearray((bundle / "configs.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bundle / "configs.parquet").write_bytes(bytes(data))
    assert cli.main(["verify", str(bundle), "--trust", str(signing_key[1])]) == 1
    assert "configs.parquet: sha256 does not match" in capsys.readouterr().err


def test_untrusted_key_fails(bundle, tmp_path, capsys):
    _, other_public, _ = signing.generate_keypair(tmp_path / "other.pem")
    with pytest.raises(BundleError, match="not trusted"):
        verify(bundle, load_trust([other_public]))
    assert cli.main(["verify", str(bundle), "--trust", str(other_public)]) == 1


def test_signature_by_another_key_with_the_same_id_field_fails(bundle, tmp_path, signing_key):
    other = signing.load_private_key(signing.generate_keypair(tmp_path / "o.pem")[0])
    (bundle / "manifest.sig").write_bytes(signing.sign((bundle / "manifest.json").read_bytes(), other))
    with pytest.raises(BundleError, match="signature does not match"):
        verify(bundle, trusted(signing_key))


def test_stray_and_missing_files_fail(bundle, signing_key):
    (bundle / "extra.txt").write_text("x")
    with pytest.raises(BundleError, match="unlisted files"):
        verify(bundle, trusted(signing_key))
    (bundle / "extra.txt").unlink()
    (bundle / "trials.parquet").unlink()
    with pytest.raises(BundleError, match="missing"):
        verify(bundle, trusted(signing_key))


def test_failed_write_keeps_the_old_bundle(bundle, signing_key):
    before = {p.name: p.read_bytes() for p in bundle.iterdir()}
    key = signing.load_private_key(signing_key[0])
    with pytest.raises(Exception):
        artifacts.write_bundle(bundle, [{**ROW, "median_s": "not a number"}], [TRIAL], key)
    assert {p.name: p.read_bytes() for p in bundle.iterdir()} == before
    assert sorted(p.name for p in bundle.parent.iterdir()) == ["bundle"]


def test_rewrite_replaces_atomically(bundle, signing_key):
    key = signing.load_private_key(signing_key[0])
    artifacts.write_bundle(bundle, [{**ROW, "median_s": 5e-5}], [TRIAL], key)
    verify(bundle, trusted(signing_key))
    assert pq.read_table(bundle / "configs.parquet").column("median_s").to_pylist() == [5e-5]
    assert sorted(p.name for p in bundle.parent.iterdir()) == ["bundle"]


def test_rewrite_is_one_atomic_exchange_where_the_system_has_one(bundle, signing_key, monkeypatch, tmp_path):
    """No moment without a bundle: the old and new folders swap in one renameat2 call, so a crash
    cannot leave the run without its bundle/ (two renames could)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    if not artifacts.exchange(tmp_path / "a", tmp_path / "b"):
        pytest.skip("no atomic exchange on this system or file system (the two renames are used)")
    for name in ("a", "b"):
        (tmp_path / name).rmdir()
    key = signing.load_private_key(signing_key[0])

    def no_rename(*args):
        raise AssertionError("renamed in two steps")

    monkeypatch.setattr(os, "rename", no_rename)
    artifacts.write_bundle(bundle, [{**ROW, "median_s": 7e-5}], [TRIAL], key)
    verify(bundle, trusted(signing_key))
    assert pq.read_table(bundle / "configs.parquet").column("median_s").to_pylist() == [7e-5]
    assert sorted(p.name for p in bundle.parent.iterdir()) == ["bundle"]


def test_write_refuses_a_folder_that_is_not_a_bundle(tmp_path, signing_key):
    key = signing.load_private_key(signing_key[0])
    run = tmp_path / "run"
    run.mkdir()
    (run / "trials.jsonl").write_text("{}\n")
    (tmp_path / "file").write_text("mine")
    for dest in (run, tmp_path / "file"):
        with pytest.raises(FarmError, match="not a bundle folder"):
            artifacts.write_bundle(dest, [ROW], [TRIAL], key)
    assert (run / "trials.jsonl").read_text() == "{}\n" and (tmp_path / "file").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "run"]


def test_keygen_modes_and_refuses_overwrite(tmp_path):
    private, public, kid = signing.generate_keypair(tmp_path / "k.pem")
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert kid == signing.key_id(signing.load_public_key(public))
    with pytest.raises(FarmError, match="refusing to overwrite"):
        signing.generate_keypair(tmp_path / "k.pem")


def test_trust_folder_and_bad_key_file(tmp_path, signing_key):
    folder = tmp_path / "trusted"
    folder.mkdir()
    (folder / "a.pub").write_bytes(signing_key[1].read_bytes())
    assert len(signing.load_trusted_keys([folder])) == 1
    (tmp_path / "bad.pub").write_text("not a key")
    with pytest.raises(FarmError, match="expected a PEM Ed25519 public key"):
        signing.load_trusted_keys([tmp_path / "bad.pub"])
