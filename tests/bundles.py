"""Hand-made bundles for the deployment tests: real Parquet, real Ed25519 signatures, no sweeps."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from farm.bundle import artifacts, signing

SOFTWARE = {"python": "3.11.7", "jax": "0.10.2", "jaxlib": "0.10.2", "pallas_farm": "0.1.0"}


def keypair(folder: Path, name: str) -> tuple[Ed25519PrivateKey, Path]:
    """A new key pair under `folder`: the private key and the public key file."""
    private, public, _ = signing.generate_keypair(folder / f"{name}.pem")
    return signing.load_private_key(private), public


def row(kernel: str, shape: tuple[int, ...], config: dict[str, Any], *, dtype: str = "float32",
        target: str = "interpret", device_kind: str | None = "cpu", created: str = "2025-01-01T00:00:00+00:00",
        run_id: str = "run-a", software: dict[str, Any] | None = None, status: str = "ok",
        median_s: float = 1e-4) -> dict[str, Any]:
    """One configs.parquet row, with the fields of artifacts.CONFIG_COLUMNS."""
    task_key = f"{kernel}/{'x'.join(map(str, shape))}/{dtype}/{target}"
    return {
        "task_key": task_key, "kernel": kernel, "shape": list(shape), "dtype": dtype, "target": target,
        "device_kind": device_kind, "interpret": True, "software": json.dumps(software or SOFTWARE, sort_keys=True),
        "status": status, "config": json.dumps(config, sort_keys=True) if status == "ok" else None,
        "median_s": median_s if status == "ok" else None, "spread": 0.01, "min_s": median_s, "n_timed": 5,
        "numerics_error": 1e-7, "default_config": json.dumps({"block_rows": 1}), "default_median_s": 2 * median_s,
        "trials": 4, "outcome_counts": json.dumps({"ok": 4}), "run_id": run_id, "created": created,
    }


def trial(config_row: dict[str, Any], number: int) -> dict[str, Any]:
    """One trials.parquet row for a config row's task."""
    return {
        "task_key": config_row["task_key"], "kernel": config_row["kernel"], "shape": config_row["shape"],
        "dtype": config_row["dtype"], "target": config_row["target"], "trial": number,
        "config": config_row["config"], "outcome": "ok", "median_s": config_row["median_s"], "spread": 0.01,
        "min_s": config_row["median_s"], "n_timed": 5, "calls_per_sample": 1, "numerics_error": 1e-7,
        "compile_s": 0.1, "error": None, "worker": "w0", "device_kind": config_row["device_kind"], "attempt": 0,
        "started": config_row["created"], "finished": config_row["created"], "run_id": config_row["run_id"],
    }


def write(dest: Path, rows: list[dict[str, Any]], key: Ed25519PrivateKey, trials: list[dict[str, Any]] | None = None,
          run_ids: list[str] | None = None) -> Path:
    """A signed bundle folder at `dest` (one trial per row unless `trials` is given)."""
    trials = [trial(r, 0) for r in rows] if trials is None else trials
    return artifacts.write_bundle(dest, rows, trials, key, {"run_ids": run_ids or sorted({r["run_id"] for r in rows})})


SOFTMAX_ROWS = [
    row("softmax", (64, 256), {"block_rows": 16}),
    row("softmax", (128, 512), {"block_rows": 32}),
]
MATMUL_ROWS = [
    row("matmul", (128, 128, 128), {"block_m": 64, "block_n": 64, "block_k": 32}),
    row("matmul", (256, 128, 256), {"block_m": 128, "block_n": 64, "block_k": 64}),
]


def signed_with_trust(tmp_path: Path, name: str = "bundle") -> tuple[Path, Path, Ed25519PrivateKey, Path]:
    """A signed bundle folder of SOFTMAX_ROWS, a trust folder holding its one .pub, the private key
    and the public key file."""
    private, public = keypair(tmp_path / "keys", "ci")
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / public.name).write_bytes(public.read_bytes())
    return write(tmp_path / name, SOFTMAX_ROWS, private), trust, private, public
