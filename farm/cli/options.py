"""The `farm` command's arguments: the parser, the run options and their defaults."""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, NoReturn

import farm
from farm.measure.capacity import profiles as capacity_profiles
from kernels.targets import DTYPES, TARGETS

DEFAULT_KEY = ".keys/dev_ed25519.pem"
MAX_TRIALS = 1_000_000              # farm.search.spaces.MAX_TRIALS, kept here so `farm show` loads no YAML
GPU = "gpu"   # `farm lookup --target gpu`: the GPU target a deployment picks for a task
KEY_ENV = "FARM_SIGNING_KEY"        # the signing key's path, or the PEM itself (for Ray jobs)
SAMPLERS = ("tpe", "random", "grid", "pattern", "hybrid")  # farm.search.space_parts.SAMPLERS, kept here likewise
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _number(cast: type, minimum: float, *, strict: bool, expected: str, maximum: float = math.inf) -> Any:
    """An argparse type: `cast(text)` that is > minimum (strict) or >= minimum, and finite and at
    most `maximum`, else a clear error."""

    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not (value > minimum if strict else value >= minimum) or not math.isfinite(value) or value > maximum:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


_positive_int = _number(int, 0, strict=True, expected="a positive integer")
_trials = _number(int, 0, strict=True, expected=f"a positive integer of at most {MAX_TRIALS}", maximum=MAX_TRIALS)
_count = _number(int, 0, strict=False, expected="an integer >= 0")
_positive_float = _number(float, 0.0, strict=True, expected="a positive number")
_non_negative_float = _number(float, 0.0, strict=False, expected="a number >= 0")


def _race(text: str) -> float:
    """--race: 0 (off) or a factor above 1."""
    value = _non_negative_float(text)
    if 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected 0 (off) or a factor above 1, got {value}")
    return value


class OneLineParser(argparse.ArgumentParser):
    """A parser whose usage errors are one line, as every other error of the CLI (the usage is
    one `--help` away), with exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = OneLineParser(prog="farm", description="Autotune JAX Pallas kernels on Ray.")
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
    sweep.add_argument("--trials", type=_trials, help="trials per task (overrides the spaces)")
    sweep.add_argument("--dry-run", action="store_true",
                       help="print each task's sampler, trial budget, valid configs, those that fit the memory "
                       "pruned against, and its default; start nothing, write nothing")
    sweep.add_argument("--warm-start", type=Path, metavar="BUNDLE", help="measure each task first at the configs "
                       "BUNDLE tuned for it or for its nearest shapes (up to 3): what a deployment of BUNDLE runs "
                       "there, so the winner is never slower than that")
    sweep.add_argument("--trust", action="append", type=Path, help="verify --warm-start BUNDLE against these public "
                       "keys / trust folders (repeatable; without: read unverified, with a warning)")
    sweep.add_argument("--out", metavar="RUN_DIR_OR_URL", help="run folder, new or empty (default "
                       "artifacts/run-<UTC time>), or a URL (file://, gs://, s3://) the run folder is copied to "
                       "at the end")
    _add_run_options(sweep)

    report = sub.add_parser("report", help="a run's report: winners against their defaults, best-so-far plots")
    report.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by farm sweep (a path or file://)")
    report.add_argument("--allow-kernel-module", action="store_true", help="accept a run whose kernel is a module "
                        "path (importing it runs its code); also FARM_ALLOW_KERNEL_MODULES=1")

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

    diff = sub.add_parser("diff", help="two bundles' tuned configs task by task: what pulling NEW over OLD adds, "
                          "drops and changes; exit 3 with --fail-on-dropped when NEW lacks a task OLD has tuned")
    for name in ("old", "new"):
        diff.add_argument(name, type=Path, metavar=name.upper(), help="bundle folder, run folder, `farm pull` "
                          "deployment folder or bundle archive")
    diff.add_argument("--trust", action="append", type=Path,
                      help="verify both against these keys first (without: compared with an UNVERIFIED warning)")
    diff.add_argument("--json", action="store_true", help="one JSON object a task (every task) instead of the table")
    diff.add_argument("--all", action="store_true", help="list the tasks whose config is the same too (without: "
                      "counted in the summary line only)")
    diff.add_argument("--fail-on-dropped", action="store_true", help="exit 3 when a task tuned in OLD is not tuned "
                      "in NEW (a deployment pulling NEW would run a nearest or default config for it)")

    lookup = sub.add_parser("lookup", help="the config a deployment runs for each task, and the rule that chose it "
                            "(exact, nearest, default); exit 3 with --require-exact when a task is not tuned")
    lookup.add_argument("bundle", type=Path, help="bundle folder, run folder, `farm pull` deployment folder or "
                        "bundle archive")
    lookup.add_argument("--kernel", help="the kernel of the tasks given by --shape, --dtype and --target")
    lookup.add_argument("--shape", action="append", type=_shape, metavar="AxB", help="a shape (repeatable)")
    lookup.add_argument("--dtype", action="append", choices=DTYPES, help="a dtype (repeatable; default bfloat16)")
    lookup.add_argument("--target", action="append", choices=(*TARGETS, GPU), help="a target (repeatable); gpu: "
                        "the GPU target a deployment picks for the task on a GPU of --compute-capability")
    lookup.add_argument("--compute-capability", default="9.0", metavar="X.Y", help="the GPU's CUDA compute "
                        "capability for --target gpu (default 9.0, Hopper: gpu-mosaic runs there, and gpu-triton)")
    lookup.add_argument("--tasks", type=Path, metavar="FILE", help="JSON-lines tasks ({kernel, shape, dtype, "
                        "target} a line, e.g. a deployment's recorded misses)")
    lookup.add_argument("--device-kind", help="the device kind the deployment runs on, as JAX names it (e.g. "
                        "'NVIDIA H200'): only configs tuned on it (default: any)")
    lookup.add_argument("--emulate", choices=capacity_profiles(), help="configs must fit this device's on-chip "
                        "memory (a GPU's shared memory for the GPU targets, a TPU's VMEM for tpu), as the runtime "
                        "checks on the device (default: not checked)")
    lookup.add_argument("--trust", action="append", type=Path,
                        help="verify against these keys first (without: looked up with an UNVERIFIED warning)")
    lookup.add_argument("--json", action="store_true", help="one JSON object a task instead of the table")
    lookup.add_argument("--require-exact", action="store_true",
                        help="exit 3 when a task has no exact tuned config (a deployment's coverage check)")

    keygen = sub.add_parser("keygen", help="create an Ed25519 signing key pair")
    keygen.add_argument("path", type=Path, nargs="?", default=Path(DEFAULT_KEY),
                        help=f"private key path; the public key goes to PATH.pub (default {DEFAULT_KEY})")

    bundle = sub.add_parser("bundle", help="merge the bundles of several runs into one signed bundle")
    bundle.add_argument("inputs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="run folders (their bundle/), bundle folders or bundle archives")
    bundle.add_argument("--out", type=Path, required=True,
                        help="FILE.tar.gz (or .tgz, .tar) for an archive; any other path writes a bundle folder; "
                        "an existing path is refused unless --replace (and then only an archive or a bundle folder)")
    bundle.add_argument("--replace", action="store_true",
                        help="replace the archive or bundle folder at --out (one of the inputs may be it)")
    bundle.add_argument("--key", type=Path, help=f"signing key (default: ${KEY_ENV}, a path or the PEM itself, "
                        f"else {DEFAULT_KEY})")
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
    retune.add_argument("--trials", type=_trials, help="trials per retuned task (default: a quarter of the "
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
                "max_attempts": 2, "scale_up_wait": 1800.0}
# Flags `--resume` applies; any other run flag that differs from the saved run is refused.
RESUME_SAFE = ("--workers", "--depth", "--compile-processes", "--finalists", "--finalist-sustain", "--node-label",
               "--compile-timeout", "--timing-timeout", "--max-attempts", "--sample-budget", "--race", "--time-budget",
               "--address", "--key", "--quiet", "--scale-up", "--scale-up-wait")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of every command that runs a sweep (`sweep`, `retune`)."""
    parser.add_argument("--target", action="append", choices=TARGETS, help="only these targets (repeatable)")
    parser.add_argument("--sampler", choices=SAMPLERS, help="override the spaces' samplers")
    parser.add_argument("--seed", type=int, help="override the spaces' sampler seeds")
    parser.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS when set, as in a Ray job; "
                        "else start an embedded local Ray)")
    parser.add_argument("--workers", type=_positive_int, help="workers per pool (default: one per chip, GPU or CPU)")
    parser.add_argument("--depth", type=_positive_int, help="trials in flight per worker (default: compile "
                        "processes + 2; 1 on CPU)")
    parser.add_argument("--compile-processes", type=_count, metavar="N",
                        help="compile processes per worker; 0 compiles in the worker itself (default: the worker's "
                        "share of its node's CPUs, less two, at most 16; 0 on CPU workers)")
    parser.add_argument("--node-label", action="append", metavar="KEY=VALUE", help="only nodes with this label")
    parser.add_argument("--interpret", action="store_true", help="run kernels in interpret mode on CPU")
    parser.add_argument("--emulate", choices=capacity_profiles(), help="memory capacity to prune against in "
                        "interpret mode (default: v7 for tpu, h200 for gpu targets)")
    parser.add_argument("--key", type=Path, help=f"signing key (default: ${KEY_ENV}, a path or the PEM itself, "
                        f"else {DEFAULT_KEY})")
    parser.add_argument("--repetitions", type=_positive_int, help="timing samples per config (default 10)")
    parser.add_argument("--input-sets", type=_positive_int, help="rotating input sets when timing (default 1)")
    parser.add_argument("--finalists", type=_count, metavar="N", help="best configs per task re-timed side by "
                        "side, on inputs rotated past the caches and against the roofline, before the winner is "
                        "chosen, with any others within 5%% of the best, up to twice as many (default 4 on accelerators, "
                        "0 on CPU; 0: the sweep's fastest wins)")
    parser.add_argument("--finalist-sustain", type=_non_negative_float, metavar="SECONDS",
                        help="take each finalist sample from this many seconds of its calls back to back: the "
                        "ranking under sustained load, as in a training step (a compute-bound kernel at the power "
                        "cap can rank differently than in short samples; default 0: one short sample pair)")
    parser.add_argument("--sample-budget", type=_non_negative_float, metavar="SECONDS",
                        help="seconds of timing samples per config: a slow kernel gets fewer repetitions, 3 at least "
                        "(default 0.5; 0: always --repetitions)")
    parser.add_argument("--race", type=_race, metavar="FACTOR",
                        help="stop timing a config once its first samples are FACTOR times the task's best so far "
                        "(default 1.5; 0: time every config in full)")
    parser.add_argument("--compile-timeout", type=_positive_float, help="seconds to compile a config (default 600)")
    parser.add_argument("--timing-timeout", type=_positive_float,
                        help="seconds to validate and time a config (default 300)")
    parser.add_argument("--time-budget", type=_positive_float, metavar="SECONDS",
                        help="once the workers are up, stop asking for new trials after this long (trials in "
                        "flight finish; default: no limit)")
    parser.add_argument("--scale-up", type=_positive_int, metavar="CHIPS",
                        help="first ask the Ray cluster's autoscaler for this many chips of the targets' accelerator "
                        "(TPU or GPU; on --node-label nodes), wait for them, and withdraw the request when the sweep "
                        "ends so that the hosts go once idle (default: place workers on the chips that are up)")
    parser.add_argument("--scale-up-wait", type=_non_negative_float, metavar="SECONDS",
                        help="seconds to wait for --scale-up's chips; past it, the sweep runs on those up, and "
                        "none up is an error (default 1800)")
    parser.add_argument("--max-attempts", type=_positive_int,
                        help="runs of a trial whose worker died before it is recorded worker_lost (default 2)")
    parser.add_argument("--quiet", action="store_true", help="no progress (neither the live view nor log lines)")
    parser.add_argument("--progress-every", type=_positive_float, default=5.0, metavar="SECONDS",
                        help="seconds between progress log lines off a terminal (default 5)")
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
