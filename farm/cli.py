"""The `farm` command: sweep, verify, show, keygen.

User errors print one line (`error: ...`) and exit with code 2; a bundle that fails
verification exits with code 1.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from farm.errors import BundleError, FarmError
from kernels.lowering import TARGETS

DEFAULT_KEY = ".keys/dev_ed25519.pem"
BUNDLE_DIR = "bundle"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(prog="farm", description="Autotune JAX Pallas kernels on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)

    sweep = sub.add_parser("sweep", help="tune the tasks of search spaces and write a signed bundle")
    sweep.add_argument("spaces", nargs="+", metavar="SPACE", help="search space YAML files")
    sweep.add_argument("--target", action="append", choices=TARGETS, help="only these targets (repeatable)")
    sweep.add_argument("--trials", type=_positive_int, help="trials per task (overrides the spaces)")
    sweep.add_argument("--sampler", choices=("tpe", "random", "grid"), help="override the spaces' samplers")
    sweep.add_argument("--seed", type=int, help="override the spaces' sampler seeds")
    sweep.add_argument("--out", type=Path, help="run folder (default artifacts/run-<UTC time>); must be new or empty")
    sweep.add_argument("--address", help="Ray cluster address (default: start an embedded local Ray)")
    sweep.add_argument("--workers", type=_positive_int, help="workers per pool (default: one per accelerator or CPU)")
    sweep.add_argument("--interpret", action="store_true", help="emulate accelerator targets in interpret mode on CPU")
    sweep.add_argument("--key", type=Path, default=Path(DEFAULT_KEY), help=f"signing key (default {DEFAULT_KEY})")
    sweep.add_argument("--repetitions", type=_positive_int, default=10, help="timing samples per config")
    sweep.add_argument("--trial-timeout", type=_positive_float, default=600.0,
                       help="seconds a trial may take before its worker is replaced")
    sweep.add_argument("--quiet", action="store_true", help="no live progress table")

    verify = sub.add_parser("verify", help="check a bundle's signature and file hashes")
    verify.add_argument("bundle", type=Path)
    verify.add_argument("--trust", action="append", required=True, type=Path,
                        help="trusted public key file or folder of *.pub (repeatable)")

    show = sub.add_parser("show", help="print a bundle's winners table")
    show.add_argument("bundle", type=Path)
    show.add_argument("--trust", action="append", type=Path, help="verify against these keys first")

    keygen = sub.add_parser("keygen", help="create an Ed25519 signing key pair")
    keygen.add_argument("path", type=Path, nargs="?", default=Path(DEFAULT_KEY),
                        help=f"private key path; the public key goes to PATH.pub (default {DEFAULT_KEY})")
    return parser


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FarmError(f"--out {out}: already exists and is not an empty folder; expected a new run folder")


def cmd_sweep(args: argparse.Namespace) -> int:
    """Validate everything, run the sweep, write and verify the signed bundle, print winners."""
    from farm import artifacts, plan, signing, spaces

    loaded = spaces.load_spaces(args.spaces)
    planned = plan.expand(loaded, args.target, args.trials)
    out = args.out or Path("artifacts") / f"run-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    _check_out(out)
    key = signing.load_private_key(args.key)

    from farm import driver, select
    from farm.progress import SweepProgress

    settings = driver.SweepSettings(run_dir=out, interpret=args.interpret, workers=args.workers,
                                    sampler=args.sampler, seed=args.seed, repetitions=args.repetitions,
                                    trial_timeout_s=args.trial_timeout, address=args.address)
    if args.quiet:
        sweep = driver.Sweep(planned, settings)
        records = sweep.run()
    else:
        with SweepProgress(planned) as progress:
            sweep = driver.Sweep(planned, settings, on_record=progress.update)
            records = sweep.run()
    environment = {k: sweep.pool_info.get(pool, {}) for k, pool in sweep.task_pool.items()}
    rows = select.winner_rows(planned, records, run_id=sweep.run_id, created=artifacts.now(),
                              environment=environment)
    bundle = artifacts.write_bundle(out / BUNDLE_DIR, rows, records, key, {"run_ids": [sweep.run_id]})
    print(f"run folder: {out}")
    print(f"bundle: {bundle} (signed by key {signing.key_id(key.public_key())})")
    print_winners(rows)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Verify a bundle against trusted keys."""
    from farm import artifacts, signing

    manifest = artifacts.verify_bundle(args.bundle, signing.load_trusted_keys(args.trust))
    print(f"OK: {args.bundle} verified (bundle {manifest['bundle_id']}, signer {manifest['signer_key_id']}, "
          f"{len(manifest['files'])} files)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """Print a bundle's winners table."""
    from farm import artifacts, signing

    if args.trust:
        artifacts.verify_bundle(args.bundle, signing.load_trusted_keys(args.trust))
    elif not (args.bundle / artifacts.CONFIGS).is_file():
        raise FarmError(f"{args.bundle}: expected a bundle folder with {artifacts.CONFIGS}")
    print_winners(artifacts.read_configs(args.bundle).to_pylist())
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    """Create a key pair."""
    from farm import signing

    private, public, kid = signing.generate_keypair(args.path)
    print(f"private key: {private} (mode 0600)\npublic key: {public}\nkey id: {kid}")
    return 0


def print_winners(rows: list[dict[str, Any]]) -> None:
    """A readable table of each task's winner."""
    from rich.console import Console
    from rich.table import Table

    from farm.progress import format_seconds

    table = Table(title="winners")
    for column in ("task", "status", "config", "median", "spread", "vs default", "trials", "outcomes"):
        table.add_column(column)
    for row in rows:
        speedup = "-"
        if row.get("median_s") and row.get("default_median_s"):
            speedup = f"{row['default_median_s'] / row['median_s']:.2f}x"
        config = json.loads(row["config"]) if row.get("config") else None
        shown = " ".join(f"{k}={v}" for k, v in config.items()) if config else "-"
        spread = f"{row['spread'] * 100:.1f}%" if row.get("spread") is not None else "-"
        counts = json.loads(row.get("outcome_counts") or "{}")
        table.add_row(row["task_key"], row["status"], shown, format_seconds(row.get("median_s")), spread, speedup,
                      str(row.get("trials")), ", ".join(f"{k} {v}" for k, v in counts.items()))
    Console(width=200).print(table)


COMMANDS = {"sweep": cmd_sweep, "verify": cmd_verify, "show": cmd_show, "keygen": cmd_keygen}


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except BundleError as err:
        print(f"error: verification failed: {err}", file=sys.stderr)
        return 1
    except FarmError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
