"""`farm bundle`: merge run bundles into one signed archive (real Parquet, real signatures)."""
from __future__ import annotations

import json
import tarfile
import warnings

import pyarrow.parquet as pq
import pytest

from farm import cli
from farm.bundle import artifacts
from farm.bundle import merge as bundle
from farm.bundle.archive import extract_archive
from farm.bundle.trust import UnverifiedBundleWarning, load_trust, verify
from farm.errors import BundleError
from tests import bundles as B

OLD, NEW = "2025-01-01T00:00:00+00:00", "2025-02-01T00:00:00+00:00"


@pytest.fixture()
def key(tmp_path):
    return B.keypair(tmp_path / "keys", "ci")


@pytest.fixture()
def two_runs(tmp_path, key):
    """Two run folders: run-b retunes softmax 64x256 later and adds a matmul task."""
    private, _ = key
    run_a = [B.row("softmax", (64, 256), {"block_rows": 16}, created=OLD, run_id="run-a"),
             B.row("softmax", (128, 512), {"block_rows": 32}, created=OLD, run_id="run-a")]
    run_b = [B.row("softmax", (64, 256), {"block_rows": 64}, created=NEW, run_id="run-b"),
             B.row("matmul", (128, 128, 128), {"block_m": 64, "block_n": 64, "block_k": 32}, created=NEW,
                   run_id="run-b")]
    B.write(tmp_path / "run-a" / "bundle", run_a, private, [B.trial(r, n) for r in run_a for n in range(3)])
    B.write(tmp_path / "run-b" / "bundle", run_b, private, [B.trial(r, n) for r in run_b for n in range(2)])
    return tmp_path / "run-a", tmp_path / "run-b"


def _open(archive, tmp_path, trusted):
    folder = extract_archive(archive, tmp_path / "opened")
    verify(folder, trusted)
    return folder


def test_merge_keeps_the_newest_row_per_task_and_every_trial(tmp_path, key, two_runs):
    private, public = key
    out = tmp_path / "merged.tar.gz"
    result = bundle.merge(two_runs, out, private, load_trust([public]))
    assert (result.rows, result.trials, result.replaced) == (3, 6 + 4, 1)

    folder = _open(out, tmp_path, load_trust([public]))
    rows = {r["task_key"]: r for r in pq.read_table(folder / artifacts.CONFIGS).to_pylist()}
    assert json.loads(rows["softmax/64x256/float32/interpret"]["config"]) == {"block_rows": 64}
    assert rows["softmax/64x256/float32/interpret"]["run_id"] == "run-b"
    assert rows["softmax/128x512/float32/interpret"]["run_id"] == "run-a"
    assert "matmul/128x128x128/float32/interpret" in rows
    trials = pq.read_table(folder / artifacts.TRIALS)
    assert sorted(set(trials.column("run_id").to_pylist())) == ["run-a", "run-b"]
    manifest = json.loads((folder / artifacts.MANIFEST).read_text())
    assert manifest["run_ids"] == ["run-a", "run-b"] and len(manifest["merged_from"]) == 2


def test_configs_parquet_is_plain_parquet(tmp_path, key, two_runs):
    """Readable by pyarrow alone, with the documented columns and types."""
    private, public = key
    bundle.merge(two_runs, tmp_path / "merged.tar.gz", private, load_trust([public]))
    folder = _open(tmp_path / "merged.tar.gz", tmp_path, load_trust([public]))
    table = pq.read_table(str(folder / "configs.parquet"))
    assert table.schema.names == artifacts.CONFIG_COLUMNS.names
    assert table.schema.field("shape").type == artifacts.CONFIG_COLUMNS.field("shape").type
    assert pq.ParquetFile(str(folder / "trials.parquet")).metadata.num_rows == 10


def test_archive_holds_only_the_bundle_files_at_its_root(tmp_path, key, two_runs):
    private, public = key
    bundle.merge(two_runs, tmp_path / "merged.tgz", private, load_trust([public]))
    with tarfile.open(tmp_path / "merged.tgz") as tar:
        members = tar.getmembers()
    assert sorted(m.name for m in members) == sorted([artifacts.CONFIGS, artifacts.TRIALS, artifacts.MANIFEST,
                                                      artifacts.SIGNATURE])
    assert all(m.isfile() and m.uid == 0 and m.mode == 0o644 for m in members)


def test_equal_created_later_input_wins_and_device_kinds_stay_apart(tmp_path, key):
    private, public = key
    first = B.write(tmp_path / "a", [B.row("softmax", (64, 256), {"block_rows": 8}, created=OLD),
                                     B.row("softmax", (64, 256), {"block_rows": 4}, device_kind="NVIDIA H200",
                                           target="interpret", created=OLD)], private)
    second = B.write(tmp_path / "b", [B.row("softmax", (64, 256), {"block_rows": 2}, created=OLD)], private)
    out = tmp_path / "merged"
    result = bundle.merge([first, second], out, private, load_trust([public]))  # a folder this time
    rows = {(r["task_key"], r["device_kind"]): json.loads(r["config"])
            for r in artifacts.read_configs(out).to_pylist()}
    assert result.rows == 2
    assert rows[("softmax/64x256/float32/interpret", "cpu")] == {"block_rows": 2}
    assert rows[("softmax/64x256/float32/interpret", "NVIDIA H200")] == {"block_rows": 4}
    verify(out, load_trust([public]))


def test_one_bundle_the_key_signed_is_packed_as_it_is(tmp_path, key, two_runs):
    """A run's bundle packed to publish keeps its id and bytes (the id a retune's report names is
    the one deployments pull); signed by another key, or merged with another run, it is a new bundle."""
    private, public = key
    trusted = load_trust([public])
    run = two_runs[0] / "bundle"
    own = json.loads((run / artifacts.MANIFEST).read_text())["bundle_id"]
    packed = bundle.merge([two_runs[0]], tmp_path / "one.tar.gz", private, trusted)
    assert packed.kept and packed.bundle_id == own
    folder = _open(tmp_path / "one.tar.gz", tmp_path, trusted)
    assert all((folder / n).read_bytes() == (run / n).read_bytes() for n in artifacts.BUNDLE_FILES)
    copied = bundle.merge([run], tmp_path / "one-folder", private, trusted)
    assert copied.kept and all((tmp_path / "one-folder" / n).read_bytes() == (run / n).read_bytes()
                               for n in artifacts.BUNDLE_FILES)
    other, other_public = B.keypair(tmp_path / "keys", "other")
    resigned = bundle.merge([two_runs[0]], tmp_path / "resigned.tar.gz", other, trusted)
    assert not resigned.kept and resigned.bundle_id != own
    verify(extract_archive(tmp_path / "resigned.tar.gz", tmp_path / "r"), load_trust([other_public]))
    merged = bundle.merge(two_runs, tmp_path / "two.tar.gz", private, trusted)
    assert not merged.kept and merged.bundle_id not in (own, resigned.bundle_id)


def test_same_bundle_twice_is_merged_once(tmp_path, key, two_runs):
    private, public = key
    result = bundle.merge([two_runs[0], two_runs[0] / "bundle"], tmp_path / "m.tar.gz", private, load_trust([public]))
    assert result.trials == 6 and any("already given" in note for note in result.warnings)


def test_inputs_are_verified_first(tmp_path, key, two_runs):
    private, public = key
    other, _ = B.keypair(tmp_path / "keys", "stranger")
    stranger = B.write(tmp_path / "stranger", [B.row("softmax", (8, 128), {"block_rows": 8})], other)
    out = tmp_path / "m.tar.gz"
    with pytest.raises(BundleError, match="not trusted"):
        bundle.merge([two_runs[0], stranger], out, private, load_trust([public]))
    assert not out.exists()

    with pytest.warns(UnverifiedBundleWarning):
        result = bundle.merge([two_runs[0], stranger], out, private, load_trust([public]), allow_unsigned=True)
    assert result.rows == 3 and out.exists()

    configs = two_runs[1] / "bundle" / artifacts.CONFIGS
    configs.write_bytes(configs.read_bytes().replace(b"run-b", b"run-x"))
    with pytest.raises(BundleError, match="sha256"):
        bundle.merge(two_runs, tmp_path / "m2.tar.gz", private, load_trust([public]))


def test_cli_bundle(tmp_path, key, two_runs, capsys):
    private, public = key
    keyfile = tmp_path / "keys" / "ci.pem"
    out = tmp_path / "merged.tar.gz"
    assert cli.main(["bundle", *map(str, two_runs), "--out", str(out), "--key", str(keyfile),
                     "--trust", str(public)]) == 0
    assert "3 tasks from 2 inputs" in capsys.readouterr().out
    _open(out, tmp_path, load_trust([public]))

    assert cli.main(["bundle", str(two_runs[0]), "--out", str(out), "--key", str(keyfile)]) == 2
    assert "--trust" in capsys.readouterr().err
    assert cli.main(["bundle", str(tmp_path / "nowhere"), "--out", str(tmp_path / "other.tar.gz"), "--key",
                     str(keyfile), "--trust", str(public)]) == 2
    assert "nowhere: not found" in capsys.readouterr().err


def _tree(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_an_existing_out_is_refused_and_only_a_bundle_replaced(tmp_path, key, two_runs, capsys, monkeypatch):
    """--out never removes what it did not write: a run folder (one of the inputs), a folder of other
    files, a file; an archive or bundle folder only with --replace, and it may be an input too."""
    private, public = key
    keyfile = tmp_path / "keys" / "ci.pem"
    args = ["--key", str(keyfile), "--trust", str(public)]
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "notes.txt").write_text("mine")
    space = tmp_path / "space.yaml"
    space.write_text("extends: softmax\n")
    before = {path: _tree(path) for path in (two_runs[0], notes)}
    for out in (two_runs[0], notes, space):
        for replace in ([], ["--replace"]):
            assert cli.main(["bundle", *map(str, two_runs), "--out", str(out), *args, *replace]) == 2
            assert str(out) in capsys.readouterr().err
    assert {path: _tree(path) for path in before} == before and space.read_text() == "extends: softmax\n"
    monkeypatch.chdir(notes)
    assert cli.main(["bundle", *map(str, two_runs), "--out", ".", *args, "--replace"]) == 2
    assert "not a bundle folder" in capsys.readouterr().err and _tree(notes) == before[notes]
    assert cli.main(["bundle", *map(str, two_runs), "--out", str(tmp_path / "x.zip"), *args]) == 2
    assert ".tar.gz" in capsys.readouterr().err and not (tmp_path / "x.zip").exists()

    archive, folder = tmp_path / "all.tar.gz", tmp_path / "merged"
    assert cli.main(["bundle", str(two_runs[0]), "--out", str(archive), *args]) == 0
    assert cli.main(["bundle", str(two_runs[0]), "--out", str(folder), *args]) == 0
    capsys.readouterr()
    for out in (archive, folder):
        assert cli.main(["bundle", str(two_runs[1]), "--out", str(out), *args]) == 2
        assert "--replace" in capsys.readouterr().err
        assert cli.main(["bundle", str(out), str(two_runs[1]), "--out", str(out), *args, "--replace"]) == 0
        assert "3 tasks from 2 inputs" in capsys.readouterr().out
    verify(folder, load_trust([public]))
    assert len(pq.read_table(folder / artifacts.CONFIGS)) == 3
    assert len(pq.read_table(_open(archive, tmp_path, load_trust([public])) / artifacts.CONFIGS)) == 3
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_bundle_signs_with_the_environment_key(tmp_path, key, two_runs, capsys, monkeypatch):
    """`farm bundle` takes the key as `farm sweep` does: --key, else $FARM_SIGNING_KEY (a path or the PEM)."""
    from farm.bundle import signing

    private, public = key
    other, other_public = B.keypair(tmp_path / "keys", "env")
    monkeypatch.chdir(tmp_path)  # no .keys/ here: the default key would be refused
    for value in (str(tmp_path / "keys" / "env.pem"), (tmp_path / "keys" / "env.pem").read_text()):
        monkeypatch.setenv("FARM_SIGNING_KEY", value)
        out = tmp_path / f"env{len(value)}"
        assert cli.main(["bundle", str(two_runs[0]), "--out", str(out), "--trust", str(public)]) == 0
        assert signing.key_id(other.public_key()) in capsys.readouterr().out
        verify(out, load_trust([other_public]))
    monkeypatch.setenv("FARM_SIGNING_KEY", "garbage")
    assert cli.main(["bundle", str(two_runs[0]), "--out", str(tmp_path / "g.tar.gz"), "--trust", str(public)]) == 2
    assert "garbage" in capsys.readouterr().err and not (tmp_path / "g.tar.gz").exists()


def _rewrite_configs(folder, table, private):
    """Replace a bundle's configs table and sign its manifest again (what a hostile signer can do)."""
    from farm.bundle import signing

    pq.write_table(table, folder / artifacts.CONFIGS)
    manifest = json.loads((folder / artifacts.MANIFEST).read_text())
    manifest["files"][artifacts.CONFIGS] = {"sha256": artifacts.sha256_file(folder / artifacts.CONFIGS),
                                            "bytes": (folder / artifacts.CONFIGS).stat().st_size}
    data = json.dumps(manifest, indent=2, sort_keys=True).encode()
    (folder / artifacts.MANIFEST).write_bytes(data)
    (folder / artifacts.SIGNATURE).write_bytes(signing.sign(data, private))


def _stranger_with_bad_rows(tmp_path):
    """A bundle signed by an untrusted key (read only with --allow-unsigned) whose rows hold configs
    that are no JSON object."""
    import pyarrow as pa

    stranger, _ = B.keypair(tmp_path / "keys", "stranger")
    rows = [B.row("softmax", (rows, 128), {"block_rows": 8}) for rows in (8, 16, 32)]
    folder = B.write(tmp_path / "stranger", rows, stranger)
    table = pq.read_table(folder / artifacts.CONFIGS)
    configs = ["not json{", "[1, 2]", table.column("config")[2].as_py()]
    _rewrite_configs(folder, table.set_column(table.schema.get_field_index("config"), "config", pa.array(configs)),
                     stranger)
    return folder


def test_rows_that_are_no_tasks_are_shown_never_signed_nor_run(tmp_path, key, capsys):
    """An unverified bundle may hold anything: `farm show` prints it, `farm bundle --allow-unsigned`
    refuses to sign it, and a deployment's lookup never picks its broken rows."""
    from farm.deploy import runtime

    private, public = key
    bad = _stranger_with_bad_rows(tmp_path)
    assert cli.main(["show", str(bad)]) == 0
    assert capsys.readouterr().out.count("(not a JSON object)") == 2
    out = tmp_path / "m.tar.gz"
    assert cli.main(["bundle", str(bad), "--out", str(out), "--key", str(tmp_path / "keys" / "ci.pem"),
                     "--allow-unsigned"]) == 1
    err = capsys.readouterr().err
    assert "row 'softmax/8x128/float32/interpret': config: expected a JSON object" in err and not out.exists()
    with pytest.warns(UnverifiedBundleWarning):
        registry = runtime.Registry.load(bad, [public], allow_unsigned=True)
    for rows in (8, 16):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", runtime.TuningMissWarning)
            choice = registry.lookup("softmax", (rows, 128), "float32", "interpret")
        assert choice.rule == runtime.NEAREST and choice.tuned_shape == (32, 128)


def test_tables_are_bounded_and_typed_before_they_are_read(tmp_path, key, monkeypatch, capsys):
    """Rows are counted from the Parquet footer (650 kB of dictionary-encoded rows held 50 million
    and took 6.4 GB to read); the columns readers rely on must be there, with their types."""
    import pyarrow as pa

    from farm.bundle import locate

    private, public = key
    folder = B.write(tmp_path / "b", [B.row("softmax", (8, 128), {"block_rows": 8})] * 3, private)
    monkeypatch.setitem(locate.MAX_ROWS, artifacts.CONFIGS, 2)
    assert cli.main(["show", str(folder), "--trust", str(public)]) == 1
    assert "configs.parquet: 3 rows; expected at most 2" in capsys.readouterr().err
    monkeypatch.setitem(locate.MAX_ROWS, artifacts.CONFIGS, 10)
    table = pq.read_table(folder / artifacts.CONFIGS)
    _rewrite_configs(folder, table.set_column(table.schema.get_field_index("shape"), "shape", pa.array(["8x128"] * 3)),
                     private)   # signed by a trusted key, and still refused
    assert cli.main(["show", str(folder), "--trust", str(public)]) == 1
    assert "column shape: expected list<item: int64>, got string" in capsys.readouterr().err


def test_show_marks_device_targets_timed_in_interpret_mode(tmp_path, key, capsys):
    private, public = key
    rows = [{**B.row("softmax", (8, 128), {"block_rows": 8}, target="gpu-triton"), "interpret": True},
            {**B.row("softmax", (16, 128), {"block_rows": 8}, target="gpu-triton"), "interpret": False},
            {**B.row("softmax", (32, 128), {"block_rows": 8}), "interpret": True}]
    folder = B.write(tmp_path / "b", rows, private)
    assert cli.main(["show", str(folder), "--trust", str(public)]) == 0
    out = capsys.readouterr().out
    assert out.count("(timed in interpret mode)") == 1 and "softmax/8x128/float32/gpu-triton (timed in" in out
