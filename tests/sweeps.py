"""Run a real sweep from a space written inline in a test, on the session's local Ray."""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from farm import cli


def run_sweep(tmp_path: Path, signing_key: tuple[Path, Path], text: str, *extra: str) -> tuple[Path, list[dict[str, Any]]]:
    """`farm sweep` over the space `text` (2 timing samples per config); the run folder and its trials."""
    space = tmp_path / "space.yaml"
    space.write_text(textwrap.dedent(text))
    out = tmp_path / "run"
    assert cli.main(["sweep", str(space), "--out", str(out), "--key", str(signing_key[0]), "--quiet",
                     "--repetitions", "2", *extra]) == 0
    return out, pq.read_table(out / "bundle" / "trials.parquet").to_pylist()
