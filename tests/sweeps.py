"""Run a real sweep from a space written inline in a test, on the session's local Ray.

`space` writes a test's small search space; `run_sweep` sweeps it.
"""
from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from farm import cli


def space(kernel: str, shapes: Sequence[Sequence[int]], *, trials: int, target: str = "interpret",
          sampler: str | None = "grid", constraints: Sequence[str] = (), **values: Sequence[Any]) -> str:
    """The YAML of a float32 search space of `kernel` on one target, each knob a list of `values`.

    >>> print(space("matmul", [[64, 64, 64]], trials=2, block_m=[32, 64]), end="")
    kernel: matmul
    dtypes: [float32]
    shapes: [[64, 64, 64]]
    targets: [interpret]
    params:
      block_m: {values: [32, 64]}
    sampler: grid
    trials: 2
    """
    lines = [f"kernel: {kernel}", "dtypes: [float32]", f"shapes: {json.dumps([list(s) for s in shapes])}",
             f"targets: [{target}]", "params:"]
    lines += [f"  {knob}: {{values: {json.dumps(list(v))}}}" for knob, v in values.items()]
    if constraints:
        lines += ["constraints:", *(f"  - {c}" for c in constraints)]
    if sampler:
        lines.append(f"sampler: {sampler}")
    return "\n".join([*lines, f"trials: {trials}", ""])


def run_sweep(tmp_path: Path, signing_key: tuple[Path, Path], text: str, *extra: str) -> tuple[Path, list[dict[str, Any]]]:
    """`farm sweep` over the space `text` (2 timing samples per config); the run folder and its trials."""
    space = tmp_path / "space.yaml"
    space.write_text(textwrap.dedent(text))
    out = tmp_path / "run"
    assert cli.main(["sweep", str(space), "--out", str(out), "--key", str(signing_key[0]), "--quiet",
                     "--repetitions", "2", *extra]) == 0
    return out, pq.read_table(out / "bundle" / "trials.parquet").to_pylist()
