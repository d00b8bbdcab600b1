"""The `farm` command: sweep, report, verify, show, keygen, bundle, pull, retune.

User errors print one line (`error: ...`) and exit with code 2; a bundle that fails
verification exits with code 1; `farm retune` exits with code 3 when its gate blocks a rollout.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import farm
from farm.errors import BundleError, FarmError
from farm.measure.capacity import profiles as capacity_profiles
from kernels.lowering import TARGETS

DEFAULT_KEY = ".keys/dev_ed25519.pem"
KEY_ENV = "FARM_SIGNING_KEY"        # the signing key's path, or the PEM itself (for Ray jobs)
DTYPES = ("float32", "bfloat16", "float16")  # farm.search.spaces.DTYPES; kept here so `farm show` loads no YAML
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _number(cast: type, minimum: float, *, strict: bool, expected: str) -> Any:
    """An argparse type: `cast(text)` that is > minimum (strict) or >= minimum, else a clear error."""

    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not (value > minimum if strict else value >= minimum):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


_positive_int = _number(int, 0, strict=True, expected="a positive integer")
_positive_float = _number(float, 0.0, strict=True, expected="a positive number")
_non_negative_float = _number(float, 0.0, strict=False, expected="a number >= 0")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(prog="farm", description="Autotune JAX Pallas kernels on Ray.")
    parser.add_argument("--version", action="version", version=f"%(prog)s (pallas-farm) {farm.__version__}")
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS,
                        help="diagnostics on stderr from this level up (default WARNING; `sweep` and `retune` "
                        "also log the farm's own INFO lines, such as progress, when stderr is not a terminal)")
    sub = parser.add_subparsers(dest="command", required=True)

    sweep = sub.add_parser("sweep", help="tune the tasks of search spaces (or of shapes, or of a tasks file) and "
                           "write a signed bundle")
    sweep.add_argument("spaces", nargs="*", metavar="SPACE", help="search space YAML files")
    sweep.add_argument("--kernel", help="tune this kernel's shipped space at --shape (and --dtype) instead of a "
                       "SPACE file")
    sweep.add_argument("--shape", action="append", type=_shape, metavar="AxB",
                       help="a shape for --kernel, e.g. 4096x50257 (repeatable; default: the shipped space's)")
    sweep.add_argument("--dtype", action="append", choices=DTYPES,
                       help="a dtype for --kernel (repeatable; default: the shipped space's dtypes)")
    sweep.add_argument("--tasks", type=Path, metavar="FILE", help="JSON-lines file of tasks a program recorded "
                       "({kernel, shape, dtype, target} per line, e.g. a deployment's misses); tunes exactly those")
    sweep.add_argument("--resume", type=Path, metavar="RUN_DIR",
                       help="continue a killed sweep: same tasks and settings, nothing measured twice (only "
                       f"{', '.join(RESUME_SAFE)} may change)")
    sweep.add_argument("--trials", type=_positive_int, help="trials per task (overrides the spaces)")
    sweep.add_argument("--out", metavar="RUN_DIR_OR_URL", help="run folder, new or empty (default "
                       "artifacts/run-<UTC time>), or a URL (file://, gs://, s3://) the run folder is copied to "
                       "at the end")
    _add_run_options(sweep)

    report = sub.add_parser("report", help="a run's report: winners against their defaults, best-so-far plots")
    report.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run folder written by farm sweep")

    verify = sub.add_parser("verify", help="check a bundle's signature and file hashes")
    verify.add_argument("bundle", type=Path, help="bundle folder, run folder, `farm pull` deployment folder or "
                        "bundle archive")
    verify.add_argument("--trust", action="append", required=True, type=Path,
                        help="trusted public key file or folder of *.pub (repeatable)")

    show = sub.add_parser("show", help="print a bundle's winners table")
    show.add_argument("bundle", type=Path, help="bundle folder, run folder, `farm pull` deployment folder or "
                      "bundle archive")
    show.add_argument("--trust", action="append", type=Path,
                      help="verify against these keys first (without: shown with an UNVERIFIED warning)")

    keygen = sub.add_parser("keygen", help="create an Ed25519 signing key pair")
    keygen.add_argument("path", type=Path, nargs="?", default=Path(DEFAULT_KEY),
                        help=f"private key path; the public key goes to PATH.pub (default {DEFAULT_KEY})")

    bundle = sub.add_parser("bundle", help="merge the bundles of several runs into one signed bundle")
    bundle.add_argument("inputs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="run folders (their bundle/), bundle folders or bundle archives")
    bundle.add_argument("--out", type=Path, required=True,
                        help="FILE.tar.gz (or .tgz, .tar) for an archive; any other path writes a bundle folder")
    bundle.add_argument("--key", type=Path, default=Path(DEFAULT_KEY), help=f"signing key (default {DEFAULT_KEY})")
    bundle.add_argument("--trust", action="append", type=Path,
                        help="verify the inputs against these public keys / trust folders (repeatable)")
    bundle.add_argument("--allow-unsigned", action="store_true",
                        help="accept inputs that are unsigned or signed by untrusted keys (with a warning)")

    pull = sub.add_parser("pull", help="download, verify and atomically install a bundle")
    pull.add_argument("url", help="bundle archive or folder: a path, file://, http(s)://, gs://, s3://")
    pull.add_argument("--dest", type=Path, required=True, help="deployment folder (DEST/current is the bundle)")
    pull.add_argument("--trust", action="append", type=Path,
                      help="trusted public key file or trust folder (*.pub, *.revoked, revoked) (repeatable)")
    pull.add_argument("--allow-unsigned", action="store_true",
                      help="install a bundle that is unsigned or signed by an untrusted key (with a warning)")
    pull.add_argument("--allow-older", action="store_true", help="install a bundle older than the installed one")
    pull.add_argument("--keep", type=_positive_int, default=2, help="versions to keep, the current one included")
    pull.add_argument("--timeout", type=_positive_float, default=60.0, help="seconds an HTTP download may take")

    retune = sub.add_parser("retune", help="retune the tasks whose software fingerprint changed since a bundle; "
                            "exit 3 when a task regressed beyond --max-regression")
    retune.add_argument("spaces", nargs="+", metavar="SPACE", help="search space YAML files")
    retune.add_argument("--previous", type=Path, required=True, metavar="BUNDLE",
                        help="the previous bundle: run folder, bundle folder or archive")
    retune.add_argument("--trust", action="append", type=Path, help="verify the previous bundle against these "
                        "public keys / trust folders (repeatable)")
    retune.add_argument("--allow-unsigned", action="store_true", help="accept an unverified previous bundle (warns)")
    retune.add_argument("--out", type=Path, help="run folder (default artifacts/retune-<UTC time>); new or empty")
    retune.add_argument("--max-regression", type=_non_negative_float, default=0.05,
                        help="gate: new / old time above 1 + this, beyond noise, exits 3 (default 0.05)")
    retune.add_argument("--noise", type=_non_negative_float, default=0.02,
                        help="relative noise floor of a measurement (default 0.02)")
    retune.add_argument("--trials", type=_positive_int, help="trials per retuned task (default: a quarter of the "
                        "space's budget, at least the warm start + 2; 1: only the previous winner); new tasks get "
                        "the space's budget")
    retune.add_argument("--no-escalate", action="store_true", help="no second pass up to the space's budget for "
                        "tasks whose previous winner broke or slowed down beyond noise")
    retune.add_argument("--top", type=_positive_int, default=3,
                        help="previous configs queued first per task: the winner and the next best (default 3)")
    _add_run_options(retune)
    return parser


# Defaults of the run options, applied after parsing so that `--resume` knows what was given.
RUN_DEFAULTS = {"repetitions": 10, "input_sets": 1, "compile_timeout": 600.0, "timing_timeout": 300.0,
                "max_attempts": 2}
# Flags `--resume` applies; any other run flag that differs from the saved run is refused.
RESUME_SAFE = ("--workers", "--depth", "--node-label", "--compile-timeout", "--timing-timeout", "--max-attempts",
               "--time-budget", "--address", "--key", "--quiet")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of every command that runs a sweep (`sweep`, `retune`)."""
    parser.add_argument("--target", action="append", choices=TARGETS, help="only these targets (repeatable)")
    parser.add_argument("--sampler", choices=("tpe", "random", "grid"), help="override the spaces' samplers")
    parser.add_argument("--seed", type=int, help="override the spaces' sampler seeds")
    parser.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS when set, as in a Ray job; "
                        "else start an embedded local Ray)")
    parser.add_argument("--workers", type=_positive_int, help="workers per pool (default: one per chip, GPU or CPU)")
    parser.add_argument("--depth", type=_positive_int, help="trials in flight per worker (default 2; 1 on CPU)")
    parser.add_argument("--node-label", action="append", metavar="KEY=VALUE", help="only nodes with this label")
    parser.add_argument("--interpret", action="store_true", help="run kernels in interpret mode on CPU")
    parser.add_argument("--emulate", choices=capacity_profiles(), help="memory capacity to prune against in "
                        "interpret mode (default: v7 for tpu, h200 for gpu targets)")
    parser.add_argument("--key", type=Path, help=f"signing key (default: ${KEY_ENV}, a path or the PEM itself, "
                        f"else {DEFAULT_KEY})")
    parser.add_argument("--repetitions", type=_positive_int, help="timing samples per config (default 10)")
    parser.add_argument("--input-sets", type=_positive_int, help="rotating input sets when timing (default 1)")
    parser.add_argument("--compile-timeout", type=_positive_float, help="seconds to compile a config (default 600)")
    parser.add_argument("--timing-timeout", type=_positive_float,
                        help="seconds to validate and time a config (default 300)")
    parser.add_argument("--time-budget", type=_positive_float, metavar="SECONDS",
                        help="once the workers are up, stop asking for new trials after this long (trials in "
                        "flight finish; default: no limit)")
    parser.add_argument("--max-attempts", type=_positive_int,
                        help="runs of a trial whose worker died before it is recorded worker_lost (default 2)")
    parser.add_argument("--quiet", action="store_true", help="no progress (neither the live view nor log lines)")
    parser.add_argument("--allow-kernel-module", action="store_true", help="accept a space's `kernel:` given as a "
                        "module path (importing it runs its code); also FARM_ALLOW_KERNEL_MODULES=1")


def _run_option(args: argparse.Namespace, name: str) -> Any:
    """A run option's value: as given, else its default."""
    value = getattr(args, name)
    return RUN_DEFAULTS[name] if value is None else value


def _shape(text: str) -> tuple[int, ...]:
    """An argparse type: AxB (positive integers)."""
    from farm.search.tasks_file import parse_shape

    try:
        return parse_shape(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected positive integers joined by x (e.g. 4096x50257), got {text!r}")


def _quiet_optuna() -> None:
    """Optuna logs every trial at INFO; one line per trial is the sweep's own job."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _sweep_settings(args: argparse.Namespace, out: Path) -> Any:
    """SweepSettings from the options `_add_run_options` defines (and Optuna's log level)."""
    from farm.run import placement
    from farm.run.sweep import SweepSettings

    _quiet_optuna()
    return SweepSettings(
        run_dir=out, interpret=args.interpret, emulate=args.emulate, workers=args.workers, depth=args.depth,
        node_labels=placement.parse_labels(args.node_label), sampler=args.sampler, seed=args.seed,
        repetitions=_run_option(args, "repetitions"), input_sets=_run_option(args, "input_sets"),
        compile_timeout_s=_run_option(args, "compile_timeout"), timing_timeout_s=_run_option(args, "timing_timeout"),
        max_attempts=_run_option(args, "max_attempts"), address=args.address, time_budget_s=args.time_budget)


def _signing_key(args: argparse.Namespace) -> Any:
    """The private key: --key, else $FARM_SIGNING_KEY (a path, or the PEM text), else the default path."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from farm.bundle import signing

    if args.key is not None:
        return signing.load_private_key(args.key)
    value = os.environ.get(KEY_ENV, "").strip()
    if not value:
        return signing.load_private_key(DEFAULT_KEY)
    if not value.startswith("-----BEGIN"):
        return signing.load_private_key(value)
    try:
        key = serialization.load_pem_private_key(value.encode(), password=None)
    except (ValueError, TypeError) as err:
        raise FarmError(f"${KEY_ENV}: expected a PEM Ed25519 private key or a path to one ({err})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise FarmError(f"${KEY_ENV}: expected an Ed25519 private key, got {type(key).__name__}")
    return key


def _sweep_spaces(args: argparse.Namespace) -> list[Any]:
    """The planned tasks of a new sweep: SPACE files, --kernel with --shape/--dtype, --tasks FILE."""
    from farm.search import plan, spaces, tasks_file

    if (args.shape or args.dtype) and not args.kernel:
        raise FarmError(f"{'--shape' if args.shape else '--dtype'}: expected --kernel too (the kernel to tune)")
    if not (args.spaces or args.kernel or args.tasks):
        raise FarmError("farm sweep: expected SPACE files, --kernel KERNEL --shape AxB, or --tasks FILE")
    loaded = spaces.load_spaces(args.spaces) if args.spaces else []
    if args.kernel:
        import kernels

        try:
            names = kernels.load(args.kernel).SHAPE_NAMES
        except kernels.UnknownKernel as err:
            raise FarmError(f"--kernel {args.kernel}: expected a known kernel ({err})") from None
        for shape in args.shape or []:
            if len(shape) != len(names):
                raise FarmError(f"--shape {'x'.join(map(str, shape))}: expected {len(names)} dimensions for "
                                f"{args.kernel} ({'x'.join(names)})")
        loaded.append(tasks_file.minimal_space(args.kernel, args.shape or [], args.dtype, label=f"--kernel "
                                               f"{args.kernel}"))
    wanted: set[str] | None = None
    if args.tasks:
        listed = tasks_file.read_tasks(args.tasks)
        wanted = tasks_file.task_key_set(listed)
        loaded += tasks_file.tasks_spaces(listed, label=f"--tasks {args.tasks}")
    planned = plan.expand(loaded, args.target, args.trials)
    from_file = {s.path for s in loaded if s.path.startswith("--tasks ")}
    planned = [p for p in planned if p.space.path not in from_file or p.task.key in (wanted or ())]
    if not planned:
        raise FarmError(f"no tuning tasks: none of the tasks has the target(s) {', '.join(args.target or [])}")
    return planned


def _resume_settings(args: argparse.Namespace) -> tuple[list[Any], Any]:
    """The saved run's tasks and settings, with the safe flags given now applied; refuses others."""
    from farm.run import placement, runlog
    from farm.run.sweep import SweepSettings

    out = args.resume
    given = [flag for flag, value in (("SPACE", args.spaces), ("--kernel", args.kernel), ("--shape", args.shape),
                                      ("--dtype", args.dtype), ("--tasks", args.tasks), ("--trials", args.trials),
                                      ("--target", args.target), ("--out", args.out)) if value]
    if given:
        raise FarmError(f"--resume {out}: expected no {', '.join(given)} (the run folder keeps its own tasks, "
                        f"budgets and folder)")
    planned, saved = runlog.load_run(out)
    wanted = {"--interpret": ("interpret", args.interpret or None), "--emulate": ("emulate", args.emulate),
              "--sampler": ("sampler", args.sampler), "--seed": ("seed", args.seed),
              "--repetitions": ("repetitions", args.repetitions), "--input-sets": ("input_sets", args.input_sets)}
    differ = [f"{flag} (saved {saved.get(field)!r}, given {value!r})" for flag, (field, value) in wanted.items()
              if value is not None and value != saved.get(field)]
    if differ:
        raise FarmError(f"--resume {out}: {'; '.join(differ)} differ from the saved run ({runlog.SWEEP_FILE}); "
                        f"expected them unchanged or left out (may change: {', '.join(RESUME_SAFE)})")
    changed = {"workers": args.workers, "depth": args.depth, "compile_timeout_s": args.compile_timeout,
               "timing_timeout_s": args.timing_timeout, "max_attempts": args.max_attempts,
               "time_budget_s": args.time_budget,
               "node_labels": placement.parse_labels(args.node_label) if args.node_label else None}
    _quiet_optuna()
    try:
        settings = SweepSettings(**{**saved, **{k: v for k, v in changed.items() if v is not None},
                                    "run_dir": out, "address": args.address})
    except TypeError as err:
        raise FarmError(f"--resume {out}: {runlog.SWEEP_FILE} holds settings this version does not know "
                        f"({err}); expected a run folder written by this version") from None
    return planned, settings


def cmd_sweep(args: argparse.Namespace) -> int:
    """Validate everything, run (or resume) the sweep, write the signed bundle, print winners."""
    from farm.bundle import signing
    from farm.run.destination import Destination
    from farm.run.progress import SweepProgress
    from farm.run.sweep import run_sweep
    from farm.search import spaces

    if args.allow_kernel_module:  # --resume reloads the run's spaces through the same switch
        os.environ[spaces.ALLOW_KERNEL_MODULES_ENV] = "1"
    if args.resume:
        planned, settings = _resume_settings(args)
        destination = Destination(args.resume)
    else:
        planned = _sweep_spaces(args)
        destination = Destination.parse(args.out)
        settings = _sweep_settings(args, destination.run_dir)
    key = _signing_key(args)

    if args.quiet:
        result = run_sweep(planned, settings, key, resume=bool(args.resume))
    else:
        with SweepProgress(planned, time_budget_s=settings.time_budget_s) as progress:
            result = run_sweep(planned, settings, key, resume=bool(args.resume), on_record=progress.update,
                               on_start=progress.mark_started)
    summary = result.summary
    print(f"run folder: {destination.run_dir}")
    if destination.url:
        print(f"copied to: {destination.publish()}")
    print(f"bundle: {result.bundle} (signed by key {signing.key_id(key.public_key())})")
    duty = summary.get("duty_cycle") or {}
    print(f"{summary.get('measured_trials', 0)} configs measured in {summary.get('wall_s', 0):.1f} s "
          f"({summary.get('trials_per_s', 0):.2f}/s) on {len(duty)} workers; device duty cycle "
          + (", ".join(f"{v:.0%}" for v in duty.values()) or "-"))
    print_winners(result.rows)
    print(f"report: farm report {destination.run_dir}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write and print a run's report (report.md, best-so-far plots)."""
    from farm.run import report

    written = report.write_report(args.run_dir)
    print(written.markdown.read_text(), end="")
    print(f"report: {written.markdown}")
    for plot in written.plots:
        print(f"plot: {plot}")
    if written.plots_note:
        print(f"note: {written.plots_note}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Verify a bundle (folder, run folder, deployment folder or archive) against trusted keys."""
    from farm.bundle import locate, trust

    with locate.open_bundle(args.bundle, trust.load_trust(args.trust)) as opened:
        inner = f" ({opened.kind}: {opened.folder})" if opened.kind in (locate.RUN, locate.DEPLOYMENT) else ""
        print(f"OK: {args.bundle}{inner} verified (bundle {opened.bundle_id}, signer "
              f"{opened.manifest['signer_key_id']}, {len(opened.manifest['files'])} files)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """Print a bundle's winners table; without --trust, warn that its signature was not checked."""
    from farm.bundle import trust
    from farm.bundle.locate import open_bundle

    trusted = trust.load_trust(args.trust) if args.trust else trust.Trust({})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trust.UnverifiedBundleWarning)
        with open_bundle(args.bundle, trusted, allow_unsigned=not args.trust) as opened:
            if not args.trust:
                print(f"WARNING: UNVERIFIED bundle {args.bundle}: no --trust given, so its signature was not "
                      f"checked (its files match its manifest, which anyone could have written)", file=sys.stderr)
            print_winners(opened.configs().to_pylist())
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    """Create a key pair."""
    from farm.bundle import signing

    private, public, kid = signing.generate_keypair(args.path)
    print(f"private key: {private} (mode 0600)\npublic key: {public}\nkey id: {kid}")
    return 0


def _trust(args: argparse.Namespace) -> Any:
    from farm.bundle import trust

    if not args.trust and not args.allow_unsigned:
        raise FarmError("--trust: expected a public key file or trust folder (or --allow-unsigned)")
    return trust.load_trust(args.trust or [], require_keys=not args.allow_unsigned)


def _warn_unverified(message: str | None) -> None:
    if message:  # printed here instead of as a Python warning
        print(f"WARNING: {message}", file=sys.stderr)


def cmd_bundle(args: argparse.Namespace) -> int:
    """Merge run bundles into one signed bundle."""
    from farm.bundle import merge as bundle
    from farm.bundle import signing, trust

    warnings.simplefilter("ignore", trust.UnverifiedBundleWarning)
    trusted = _trust(args)
    key = signing.load_private_key(args.key)
    result = bundle.merge(args.inputs, args.out, key, trusted, allow_unsigned=args.allow_unsigned)
    for note in result.warnings:
        _warn_unverified(note)
    print(f"bundle: {result.out} (signed by key {signing.key_id(key.public_key())}): {result.rows} tasks "
          f"from {len(result.inputs)} inputs ({result.replaced} older rows replaced), {result.trials} trials")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    """Download, verify and install a bundle."""
    from farm.bundle import trust
    from farm.deploy import pull

    warnings.simplefilter("ignore", trust.UnverifiedBundleWarning)
    result = pull.pull(args.url, args.dest, _trust(args), allow_unsigned=args.allow_unsigned,
                       allow_older=args.allow_older, keep=args.keep, timeout=args.timeout)
    _warn_unverified(result.warning)
    state = "already installed; made current" if result.reused else "installed"
    print(f"OK: bundle {result.manifest.get('bundle_id')} {state}: {args.dest / pull.CURRENT} -> {result.installed} "
          f"(signer {result.manifest.get('signer_key_id')}"
          f"{'' if result.signed else ', UNVERIFIED'}; previous: {result.previous or 'none'})")
    return 0


def cmd_retune(args: argparse.Namespace) -> int:
    """Retune stale tasks warm-started from a previous bundle; write the bundle and report; 3 if the gate blocks."""
    from farm.retune import planning, report, retune, rules
    from farm.run.destination import check_empty, default_run_dir
    from farm.run.progress import SweepProgress
    from farm.search import plan, spaces

    loaded = spaces.load_spaces(args.spaces, allow_kernel_modules=args.allow_kernel_module or None)
    planned = plan.expand(loaded, args.target, None)
    out = args.out or default_run_dir("retune")
    check_empty(out)
    key = _signing_key(args)
    previous = planning.load_previous(args.previous, _trust(args), allow_unsigned=args.allow_unsigned)
    settings = _sweep_settings(args, out)
    options = rules.RetuneSettings(top=args.top, trials=args.trials, noise=args.noise,
                                   max_regression=args.max_regression, escalate=not args.no_escalate)
    result = retune.retune(planned, previous, settings, key, options, progress=None if args.quiet else SweepProgress)
    print(result.markdown)
    print(f"run folder: {result.run_dir}\nbundle: {result.bundle}\nreport: {result.run_dir / report.REPORT_MD}, "
          f"{result.run_dir / report.REPORT_JSON}")
    if result.exit_code:
        print(f"gate: {len(result.report['blocked'])} task(s) regressed beyond --max-regression "
              f"{args.max_regression}: {', '.join(result.report['blocked'])}", file=sys.stderr)
    return result.exit_code


def print_winners(rows: list[dict[str, Any]]) -> None:
    """A readable table of each task's winner against its default.

    measured: configs a worker compiled, validated and timed (ok or failed); failed: measured
    configs that did not run correctly, by outcome; skipped: draws never measured (invalid,
    pruned), which are not failures.
    """
    from rich.console import Console
    from rich.table import Table

    from farm.measure import outcomes
    from farm.run.progress import format_seconds

    table = Table(title="winners", caption="measured: configs timed on a worker (ok or failed); skipped: draws "
                  "never measured (invalid, pruned) or answered from an earlier measurement (cached)")
    for column in ("task", "status", "config", "median", "spread", "default", "vs default", "measured", "failed",
                   "skipped"):
        table.add_column(column)
    for row in rows:
        speedup = "-"
        if row.get("median_s") and row.get("default_median_s"):
            speedup = f"{row['default_median_s'] / row['median_s']:.2f}x"
        config = json.loads(row["config"]) if row.get("config") else None
        shown = " ".join(f"{k}={v}" for k, v in config.items()) if config else "-"
        spread = f"{row['spread'] * 100:.1f}%" if row.get("spread") is not None else "-"
        counts = json.loads(row.get("outcome_counts") or "{}")
        measured = sum(counts.get(o, 0) for o in outcomes.MEASURED)
        failed = ", ".join(f"{o} {counts[o]}" for o in outcomes.FAILURES if counts.get(o))
        skipped = ", ".join(f"{o} {counts[o]}" for o in (*outcomes.SKIPPED, outcomes.CACHED) if counts.get(o))
        table.add_row(row["task_key"], row["status"], shown, format_seconds(row.get("median_s")), spread,
                      format_seconds(row.get("default_median_s")), speedup, str(measured), failed or "-",
                      skipped or "-")
    console = Console(width=200)
    console.print(table)
    console.print()


COMMANDS = {"sweep": cmd_sweep, "report": cmd_report, "verify": cmd_verify, "show": cmd_show, "keygen": cmd_keygen,
            "bundle": cmd_bundle, "pull": cmd_pull, "retune": cmd_retune}


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level or "WARNING", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level is None and args.command in ("sweep", "retune"):
        logging.getLogger("farm").setLevel(logging.INFO)   # progress lines in job logs, by default
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
