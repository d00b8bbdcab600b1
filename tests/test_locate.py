"""open_bundle: one way to open a bundle folder, run folder, deployment or archive, always verified."""
from __future__ import annotations

import json
import os

import pytest

from farm import cli
from farm.bundle import artifacts, locate
from farm.bundle.archive import write_archive
from farm.bundle.locate import open_bundle
from farm.bundle.trust import UnverifiedBundleWarning, load_trust
from farm.deploy import pull
from farm.errors import BundleError, FarmError
from tests import bundles as B


@pytest.fixture()
def made(tmp_path):
    """One signed bundle at every kind of location: {kind: location}, and the trust for it."""
    private, public = B.keypair(tmp_path / "keys", "ci")
    run = tmp_path / "run-a"
    folder = B.write(run / locate.RUN_BUNDLE, B.SOFTMAX_ROWS, private)
    archive = write_archive(folder, tmp_path / "b.tar.gz")
    trust = load_trust([public])
    pull.pull(str(archive), tmp_path / "deploy", trust)
    locations = {locate.FOLDER: folder, locate.RUN: run, locate.DEPLOYMENT: tmp_path / "deploy",
                 locate.ARCHIVE: archive}
    return locations, trust, public


@pytest.mark.parametrize("kind", [locate.FOLDER, locate.RUN, locate.DEPLOYMENT, locate.ARCHIVE])
def test_every_location_kind_opens_verified(made, kind):
    locations, trust, _ = made
    with open_bundle(locations[kind], trust) as opened:
        assert opened.kind == kind and opened.signed and opened.warning is None
        assert opened.location == str(locations[kind])
        assert (opened.folder / artifacts.MANIFEST).is_file()
        assert json.loads((opened.folder / artifacts.MANIFEST).read_bytes()) == opened.manifest
        rows = opened.configs().to_pylist()
        assert {json.loads(r["config"])["block_rows"] for r in rows} == {16, 32}
        assert opened.trials().num_rows == 2
        assert opened.configs(columns=["task_key"]).column_names == ["task_key"]
        folder = opened.folder
    if kind == locate.ARCHIVE:
        assert not folder.exists() and opened.where == str(locations[kind])  # the temporary folder is gone
    else:
        assert folder.is_dir() and opened.where == str(folder)
    if kind == locate.DEPLOYMENT:
        assert folder == pull.installed(locations[kind]) and folder.parent.name == locate.VERSIONS


def test_missing_and_unknown_locations_name_what_was_given(tmp_path, made):
    _, trust, _ = made
    with pytest.raises(FarmError, match=f"^{tmp_path / 'missing'}: not found; expected a bundle folder"):
        with open_bundle(tmp_path / "missing", trust):
            pass
    (tmp_path / "empty").mkdir()
    with pytest.raises(FarmError, match=f"^{tmp_path / 'empty'}: holds no bundle"):
        with open_bundle(tmp_path / "empty", trust):
            pass
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(FarmError, match="notes.txt: a file, not a bundle archive"):
        with open_bundle(tmp_path / "notes.txt", trust):
            pass
    broken = tmp_path / "broken-deploy"
    broken.mkdir()
    os.symlink("versions/gone", broken / locate.CURRENT)
    with pytest.raises(FarmError, match=f"^{broken}: deployment folder whose current points to no version"):
        with open_bundle(broken, trust):
            pass


def test_a_tampered_archive_is_refused_naming_the_archive(tmp_path, made):
    locations, trust, _ = made
    source = locations[locate.FOLDER]
    configs = source / artifacts.CONFIGS
    configs.write_bytes(configs.read_bytes().replace(b"run-a", b"run-z"))
    tampered = write_archive(source, tmp_path / "tampered.tgz")
    with pytest.raises(BundleError, match=f"^{tampered}/configs.parquet: sha256 does not match") as err:
        with open_bundle(tampered, trust):
            pass
    assert "farm-bundle-" not in str(err.value)


def test_unsigned_is_refused_unless_allowed_with_a_warning(made):
    locations, trust, _ = made
    folder = locations[locate.FOLDER]
    (folder / artifacts.SIGNATURE).unlink()
    with pytest.raises(BundleError, match="unsigned"):
        with open_bundle(folder, trust):
            pass
    with pytest.warns(UnverifiedBundleWarning, match="UNVERIFIED"):
        with open_bundle(locations[locate.RUN], trust, allow_unsigned=True) as opened:
            assert not opened.signed and "unsigned" in opened.warning


def test_readers_refuse_a_file_swapped_after_verification(made):
    locations, trust, _ = made
    with open_bundle(locations[locate.FOLDER], trust) as opened:
        trials = opened.folder / artifacts.TRIALS
        trials.write_bytes(trials.read_bytes() + b"\0")
        with pytest.raises(BundleError, match="trials.parquet: changed since it was verified"):
            opened.trials()


def test_cli_verify_takes_every_location_kind(tmp_path, made, capsys):
    locations, _, public = made
    for kind, location in locations.items():
        assert cli.main(["verify", str(location), "--trust", str(public)]) == 0, kind
        assert capsys.readouterr().out.startswith(f"OK: {location}")
    data = bytearray(locations[locate.ARCHIVE].read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "bad.tar.gz").write_bytes(bytes(data))
    assert cli.main(["verify", str(tmp_path / "bad.tar.gz"), "--trust", str(public)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: verification failed:") and str(tmp_path / "bad.tar.gz") in err
    assert cli.main(["verify", str(tmp_path / "nowhere"), "--trust", str(public)]) == 2
    assert f"{tmp_path / 'nowhere'}: not found" in capsys.readouterr().err


def test_cli_show_without_trust_warns_unverified(made, capsys):
    locations, _, public = made
    assert cli.main(["show", str(locations[locate.ARCHIVE])]) == 0
    captured = capsys.readouterr()
    assert "WARNING: UNVERIFIED bundle" in captured.err and "--trust" in captured.err
    assert "softmax/64x256/float32/interpret" in captured.out
    assert cli.main(["show", str(locations[locate.RUN]), "--trust", str(public)]) == 0
    captured = capsys.readouterr()
    assert "UNVERIFIED" not in captured.err and "softmax/64x256/float32/interpret" in captured.out
    configs = locations[locate.FOLDER] / artifacts.CONFIGS
    configs.write_bytes(configs.read_bytes() + b"\0")
    assert cli.main(["show", str(locations[locate.FOLDER])]) == 1  # corrupt files fail even without --trust
    assert "configs.parquet" in capsys.readouterr().err
