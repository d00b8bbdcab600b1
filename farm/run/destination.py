"""Where a run's results go: a folder, or an fsspec URL they are copied to at the end.

`--out` is a path (a new or empty folder; absolute in a Ray job, whose working directory is
temporary) or a URL (`file://`, `gs://`, `s3://`, ... with gcsfs / s3fs installed). For a URL,
the run folder is staged locally (`artifacts/run-<time>`, so `--resume` works on it) and
copied file by file to the URL once the sweep has written its bundle; the URL must not hold
anything yet, checked before any work starts.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from datetime import datetime, timezone
from pathlib import Path

import fsspec

from farm.errors import FarmError, shorten

logger = logging.getLogger(__name__)


def default_run_dir(prefix: str = "run") -> Path:
    """artifacts/<prefix>-<UTC time>."""
    return Path("artifacts") / f"{prefix}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"


def is_url(text: str) -> bool:
    """Whether `--out` names a URL (scheme://...) rather than a path."""
    return "://" in text


@dataclasses.dataclass(frozen=True)
class Destination:
    """The local run folder and, for a URL, where it is copied at the end."""

    run_dir: Path
    url: str | None = None

    @classmethod
    def parse(cls, out: str | None, prefix: str = "run") -> Destination:
        """From `--out` (None: the default run folder); checks that nothing is there yet."""
        if out is None or not is_url(out):
            run_dir = Path(out) if out else default_run_dir(prefix)
            check_empty(run_dir)
            return cls(run_dir)
        try:
            fs, path = fsspec.core.url_to_fs(out)
        except Exception as err:  # noqa: BLE001 - an unknown scheme, a missing backend, a host that does not answer
            raise FarmError(f"--out {out}: expected a path or a URL fsspec can write ({type(err).__name__}: "
                            f"{shorten(str(err), 200)})") from None
        try:
            taken = fs.exists(path) and (not fs.isdir(path) or bool(fs.ls(path)))
        except Exception as err:  # noqa: BLE001 - a store that cannot be listed cannot be written
            raise FarmError(f"--out {out}: expected a reachable location ({type(err).__name__}: {err})") from None
        if taken:
            raise FarmError(f"--out {out}: already exists and is not empty; expected a new location")
        run_dir = default_run_dir(prefix)
        check_empty(run_dir)
        return cls(run_dir, out)

    def publish(self) -> str:
        """Copy the run folder to the URL (nothing to do for a path); returns where it now is."""
        if self.url is None:
            return str(self.run_dir)
        fs, root = fsspec.core.url_to_fs(self.url)
        root = root.rstrip("/")
        files = sorted(p for p in self.run_dir.rglob("*") if p.is_file())
        for file in files:
            target = f"{root}/{file.relative_to(self.run_dir).as_posix()}"
            fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            fs.put_file(str(file), target)
        logger.info("copied %d files of %s to %s", len(files), self.run_dir, self.url)
        return self.url


def check_empty(out: Path) -> None:
    """A run folder must be new or empty, and creatable: under a folder (not a file) this process may write."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FarmError(f"--out {out}: already exists and is not an empty folder; expected a new run folder")
    parent = out.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not out.exists() and (not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK)):
        why = "not a folder" if not parent.is_dir() else "not writable"
        raise FarmError(f"--out {out}: cannot be created ({parent} is {why}); expected a new folder in a writable "
                        f"place")
