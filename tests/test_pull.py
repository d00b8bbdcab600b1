"""`farm pull`: real HTTP on loopback, real archives; refusals leave the installed bundle intact."""
from __future__ import annotations

import http.server
import io
import json
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest

from farm import cli
from farm.bundle import artifacts, signing
from farm.bundle.archive import write_archive
from farm.bundle.trust import UnverifiedBundleWarning, load_trust
from farm.deploy import pull, runtime
from farm.errors import BundleError, FarmError
from tests import bundles as B

DAY1, DAY2, DAY3 = "2025-01-01T00:00:00+00:00", "2025-01-02T00:00:00+00:00", "2025-01-03T00:00:00+00:00"


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the test's folder; /truncated/NAME promises all of NAME but sends half; /stall/ never answers."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path.startswith("/stall/"):
            time.sleep(3)
            return
        if self.path.startswith("/truncated/"):
            data = (Path(self.directory) / self.path.removeprefix("/truncated/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        super().do_GET()


@pytest.fixture()
def served(tmp_path):
    """A real HTTP server on 127.0.0.1 serving tmp_path/www: (folder, base URL)."""
    www = tmp_path / "www"
    www.mkdir()
    handler = lambda *a, **k: _Handler(*a, directory=str(www), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture()
def keys(tmp_path):
    """Two signers, each with its own trust folder holding only its public key."""
    found = {}
    for name in ("ci", "other"):
        private, public = B.keypair(tmp_path / "keys", name)
        folder = tmp_path / f"trust-{name}"
        folder.mkdir()
        (folder / public.name).write_bytes(public.read_bytes())
        found[name] = (private, public, folder)
    return found


def _archive(tmp_path: Path, name: str, rows, private, created: str = DAY1) -> Path:
    rows = [{**r, "created": created} for r in rows]
    folder = B.write(tmp_path / "src" / name, rows, private)
    manifest = json.loads((folder / artifacts.MANIFEST).read_text())
    manifest["created"] = created  # pull orders bundles by the manifest's time: re-sign with a fixed one
    data = json.dumps(manifest, indent=2, sort_keys=True).encode()
    (folder / artifacts.MANIFEST).write_bytes(data)
    (folder / artifacts.SIGNATURE).write_bytes(signing.sign(data, private))
    out = tmp_path / "www" / f"{name}.tar.gz"
    out.parent.mkdir(exist_ok=True)
    return write_archive(folder, out)


def _installed_config(dest: Path, trust_path: Path) -> dict:
    registry = runtime.Registry.load(dest, [trust_path], spaces=())
    return dict(registry.lookup("softmax", (64, 256), "float32", "interpret").config)


@pytest.fixture()
def deployed(tmp_path, served, keys):
    """A deployment with a first bundle (block_rows 16) pulled over HTTP."""
    www, base = served
    private, _, trust = keys["ci"]
    _archive(tmp_path, "v1", B.SOFTMAX_ROWS, private, DAY1)
    dest = tmp_path / "deploy"
    result = pull.pull(f"{base}/v1.tar.gz", dest, load_trust([trust]), timeout=10)
    assert result.previous is None and result.signed
    return dest, base, trust


def _unchanged(dest: Path, before: Path, trust: Path) -> None:
    assert pull.installed(dest) == before
    assert _installed_config(dest, trust) == {"block_rows": 16}
    assert not [p for p in dest.iterdir() if p.name.startswith(".staging-")]


def test_pull_over_http_installs_and_swaps(tmp_path, deployed, keys):
    dest, base, trust = deployed
    first = pull.installed(dest)
    assert (dest / pull.CURRENT).is_symlink() and not os.path.isabs(os.readlink(dest / pull.CURRENT))
    assert _installed_config(dest, trust) == {"block_rows": 16}

    rows = [B.row("softmax", (64, 256), {"block_rows": 32})]
    _archive(tmp_path, "v2", rows, keys["ci"][0], DAY2)
    result = pull.pull(f"{base}/v2.tar.gz", dest, load_trust([trust]), timeout=10)
    assert result.previous == first and pull.installed(dest) == result.installed != first
    assert _installed_config(dest, trust) == {"block_rows": 32}
    assert first.is_dir()  # keep=2: the previous version stays for a rollback

    _archive(tmp_path, "v3", [B.row("softmax", (64, 256), {"block_rows": 64})], keys["ci"][0], DAY3)
    pull.pull(f"{base}/v3.tar.gz", dest, load_trust([trust]), timeout=10)
    assert not first.exists() and len(list((dest / pull.VERSIONS).iterdir())) == 2

    again = pull.pull(f"{base}/v3.tar.gz", dest, load_trust([trust]), timeout=10)
    assert again.reused and _installed_config(dest, trust) == {"block_rows": 64}


def test_tampered_download_is_refused(tmp_path, deployed, keys):
    dest, base, trust = deployed
    before = pull.installed(dest)
    source = tmp_path / "src" / "v1"
    configs = source / artifacts.CONFIGS
    configs.write_bytes(configs.read_bytes().replace(b"run-a", b"run-z"))
    write_archive(source, tmp_path / "www" / "tampered.tar.gz")
    with pytest.raises(BundleError, match=r"sha256 does not match.*kept the installed bundle"):
        pull.pull(f"{base}/tampered.tar.gz", dest, load_trust([trust]), timeout=10)
    _unchanged(dest, before, trust)

    manifest = source / artifacts.MANIFEST
    manifest.write_text(manifest.read_text().replace(DAY1, DAY3))
    write_archive(source, tmp_path / "www" / "tampered.tar.gz")
    with pytest.raises(BundleError, match="signature does not match"):
        pull.pull(f"{base}/tampered.tar.gz", dest, load_trust([trust]), timeout=10, allow_unsigned=True)
    _unchanged(dest, before, trust)


def test_truncated_download_is_refused(tmp_path, deployed, keys):
    dest, base, trust = deployed
    before = pull.installed(dest)
    _archive(tmp_path, "v2", B.SOFTMAX_ROWS, keys["ci"][0], DAY2)
    with pytest.raises(FarmError, match=r"download failed \(ContentLengthError.*Not enough data.*kept the installed bundle"):
        pull.pull(f"{base}/truncated/v2.tar.gz", dest, load_trust([trust]), timeout=10)
    _unchanged(dest, before, trust)

    half = tmp_path / "www" / "half.tar.gz"
    data = (tmp_path / "www" / "v2.tar.gz").read_bytes()
    half.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(BundleError, match="truncated"):
        pull.pull(f"{base}/half.tar.gz", dest, load_trust([trust]), timeout=10)
    _unchanged(dest, before, trust)


def test_stalled_and_missing_downloads_fail_in_bounded_time(deployed):
    dest, base, trust = deployed
    before = pull.installed(dest)
    start = time.monotonic()
    with pytest.raises(FarmError, match=r"download failed \(no complete answer within 0.5 s\)"):
        pull.pull(f"{base}/stall/v1.tar.gz", dest, load_trust([trust]), timeout=0.5)
    assert time.monotonic() - start < 2.5
    with pytest.raises(FarmError, match="HTTP 404.*: not found"):
        pull.pull(f"{base}/nothing-here.tar.gz", dest, load_trust([trust]), timeout=10)
    _unchanged(dest, before, trust)


def test_wrong_key_unsigned_and_allow_unsigned(tmp_path, deployed, keys):
    dest, base, trust = deployed
    before = pull.installed(dest)
    _archive(tmp_path, "foreign", [B.row("softmax", (64, 256), {"block_rows": 2})], keys["other"][0], DAY2)
    with pytest.raises(BundleError, match="not trusted.*kept the installed bundle"):
        pull.pull(f"{base}/foreign.tar.gz", dest, load_trust([trust]), timeout=10)
    _unchanged(dest, before, trust)

    source = tmp_path / "src" / "foreign"
    (source / artifacts.SIGNATURE).unlink()
    write_archive(source, tmp_path / "www" / "unsigned.tar.gz")
    with pytest.raises(BundleError, match="unsigned"):
        pull.pull(f"{base}/unsigned.tar.gz", dest, load_trust([trust]), timeout=10)
    _unchanged(dest, before, trust)

    with pytest.warns(UnverifiedBundleWarning, match="UNVERIFIED"):
        result = pull.pull(f"{base}/unsigned.tar.gz", dest, load_trust([trust]), timeout=10, allow_unsigned=True)
    assert not result.signed and "unsigned" in result.warning
    with pytest.warns(UnverifiedBundleWarning):
        registry = runtime.Registry.load(dest, [trust], allow_unsigned=True, spaces=())
    assert not registry.signed
    with pytest.raises(BundleError, match="unsigned"):
        runtime.Registry.load(dest, [trust])


def test_rotation_and_revocation(tmp_path, deployed, keys):
    dest, base, trust = deployed
    new_private, new_public, _ = keys["other"]
    _archive(tmp_path, "rotated", [B.row("softmax", (64, 256), {"block_rows": 4})], new_private, DAY2)
    with pytest.raises(BundleError, match="not trusted"):
        pull.pull(f"{base}/rotated.tar.gz", dest, load_trust([trust]), timeout=10)

    (trust / new_public.name).write_bytes(new_public.read_bytes())  # rotation: trust the new key
    pull.pull(f"{base}/rotated.tar.gz", dest, load_trust([trust]), timeout=10)
    assert _installed_config(dest, trust) == {"block_rows": 4}

    old_id = signing.key_id(signing.load_public_key(keys["ci"][1]))
    (trust / "revoked").write_text(f"# retired 2025-01-02\n{old_id}  # the old CI key\n")
    _archive(tmp_path, "old-key", [B.row("softmax", (64, 256), {"block_rows": 8})], keys["ci"][0], DAY3)
    with pytest.raises(BundleError, match=f"{old_id}, which is revoked"):
        pull.pull(f"{base}/old-key.tar.gz", dest, load_trust([trust]), timeout=10, allow_unsigned=True)
    with pytest.raises(BundleError, match="revoked"):
        runtime.Registry.load(tmp_path / "src" / "v1", [trust])
    assert _installed_config(dest, trust) == {"block_rows": 4}
    assert old_id not in signing.load_trusted_keys([trust])  # `farm verify` honours revocations too

    (trust / "revoked").unlink()  # a `.revoked` key file works the same way
    (trust / keys["ci"][1].name).rename(trust / f"{keys['ci'][1].name}.revoked")
    with pytest.raises(BundleError, match="revoked"):
        pull.pull(f"{base}/old-key.tar.gz", dest, load_trust([trust]), timeout=10)

    (trust / "revoked").write_text("not-a-key-id\n")
    with pytest.raises(FarmError, match=r"revoked: line 1: expected a key id of 16 hex digits"):
        load_trust([trust])


def test_older_bundle_is_refused_unless_allowed(tmp_path, deployed, keys):
    dest, base, trust = deployed
    _archive(tmp_path, "v3", [B.row("softmax", (64, 256), {"block_rows": 64})], keys["ci"][0], DAY3)
    pull.pull(f"{base}/v3.tar.gz", dest, load_trust([trust]), timeout=10)
    with pytest.raises(BundleError, match="older than the installed one"):
        pull.pull(f"{base}/v1.tar.gz", dest, load_trust([trust]), timeout=10)
    pull.pull(f"{base}/v1.tar.gz", dest, load_trust([trust]), timeout=10, allow_older=True)
    assert _installed_config(dest, trust) == {"block_rows": 16}


def _evil(tmp_path: Path, name: str, member: tarfile.TarInfo, payload: bytes = b"") -> Path:
    """A signed bundle archive plus one hostile member."""
    source = tmp_path / "src" / "v1"
    out = tmp_path / "www" / name
    with tarfile.open(out, "w:gz") as tar:
        for file in sorted(source.iterdir()):
            tar.add(file, arcname=file.name)
        tar.addfile(member, io.BytesIO(payload) if member.isfile() else None)
    return out


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", payload: bytes = b"") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(payload) if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize("label, member, message", [
    ("traversal", _member("../escaped", payload=b"x"), r"'\.\.' \(path traversal\)"),
    ("nested-traversal", _member("a/../../escaped", payload=b"x"), r"'\.\.' \(path traversal\)"),
    ("absolute", _member("/tmp/farm-escaped", payload=b"x"), "absolute path"),
    ("symlink", _member("configs-link", tarfile.SYMTYPE, "/etc/passwd"), "symbolic link"),
    ("hardlink", _member("configs-hard", tarfile.LNKTYPE, "configs.parquet"), "hard link"),
    ("device", _member("null", tarfile.CHRTYPE), "device"),
    ("fifo", _member("pipe", tarfile.FIFOTYPE), "device or FIFO"),
])
def test_hostile_archives_are_refused(tmp_path, deployed, label, member, message):
    dest, base, trust = deployed
    before = pull.installed(dest)
    _evil(tmp_path, f"{label}.tar.gz", member, b"x" if member.isfile() else b"")
    with pytest.raises(BundleError, match=message):
        pull.pull(f"{base}/{label}.tar.gz", dest, load_trust([trust]), timeout=10)
    _unchanged(dest, before, trust)
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/farm-escaped").exists()
    assert not (dest.parent / "escaped").exists()


def test_extra_file_in_archive_is_refused(tmp_path, deployed):
    dest, base, trust = deployed
    _evil(tmp_path, "extra.tar.gz", _member("extra.py", payload=b"x"), b"x")
    with pytest.raises(BundleError, match="unlisted files"):
        pull.pull(f"{base}/extra.tar.gz", dest, load_trust([trust]), timeout=10)


def test_local_path_file_url_and_folder(tmp_path, keys):
    private, public, trust = keys["ci"]
    archive = _archive(tmp_path, "v1", B.SOFTMAX_ROWS, private, DAY1)
    pull.pull(str(archive), tmp_path / "d1", load_trust([trust]))
    pull.pull(archive.as_uri(), tmp_path / "d2", load_trust([trust]))
    pull.pull(str(tmp_path / "src" / "v1"), tmp_path / "d3", load_trust([trust]))
    for dest in ("d1", "d2", "d3"):
        assert _installed_config(tmp_path / dest, trust) == {"block_rows": 16}


def test_unavailable_backend_says_so(tmp_path, keys):
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed")
    except ImportError:
        pass
    with pytest.raises(FarmError, match="gs://"):
        pull.pull("gs://bucket/bundle.tar.gz", tmp_path / "d", load_trust([keys["ci"][2]]))


def test_cli_pull(tmp_path, deployed, keys, capsys):
    dest, base, trust = deployed
    _archive(tmp_path, "v2", [B.row("softmax", (64, 256), {"block_rows": 32})], keys["ci"][0], DAY2)
    assert cli.main(["pull", f"{base}/v2.tar.gz", "--dest", str(dest), "--trust", str(trust)]) == 0
    captured = capsys.readouterr()   # v2 lacks one task of v1: a pull replaces, so it says so
    assert "installed" in captured.out and "WARNING: 1 tuned task(s) of the bundle it replaced" in captured.err
    assert "softmax/128x512/float32/interpret on cpu" in captured.err and "farm bundle" in captured.err
    _archive(tmp_path, "foreign", B.SOFTMAX_ROWS, keys["other"][0], DAY3)
    assert cli.main(["pull", f"{base}/foreign.tar.gz", "--dest", str(dest), "--trust", str(trust)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: verification failed:") and "kept the installed bundle" in err
    assert cli.main(["pull", f"{base}/missing.tar.gz", "--dest", str(dest), "--trust", str(trust)]) == 2
    assert "not found" in capsys.readouterr().err
    assert cli.main(["pull", f"{base}/foreign.tar.gz", "--dest", str(dest), "--allow-unsigned"]) == 0
    captured = capsys.readouterr()
    assert "WARNING: ACCEPTING AN UNVERIFIED BUNDLE" in captured.err and "UNVERIFIED" in captured.out
    assert "tuned task(s) of the bundle it replaced" not in captured.err   # it holds every task v2 had
