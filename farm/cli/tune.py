"""The tuning commands: `farm sweep`, `farm report`, `farm retune`."""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.cli.bundles import _trust, print_winners, signing_key
from farm.cli.options import RESUME_SAFE, _run_option
from farm.errors import FarmError

if TYPE_CHECKING:
    from farm.retune.nearest import Seeds


def _quiet_optuna() -> None:
    """Optuna logs every trial at INFO; one line per trial is the sweep's own job."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _sweep_settings(args: argparse.Namespace, out: Path, runnable_only: bool = False) -> Any:
    """SweepSettings from the options `_add_run_options` defines (and Optuna's log level).
    runnable_only: leave out the tasks of targets the cluster cannot run (`farm sweep` without --target)."""
    from farm.run import placement
    from farm.run.sweep import SweepSettings

    _quiet_optuna()
    return SweepSettings(
        run_dir=out, interpret=args.interpret, emulate=args.emulate, workers=args.workers, depth=args.depth,
        compile_processes=args.compile_processes, finalists=args.finalists,
        node_labels=placement.parse_labels(args.node_label), sampler=args.sampler, seed=args.seed,
        repetitions=_run_option(args, "repetitions"), input_sets=_run_option(args, "input_sets"),
        compile_timeout_s=_run_option(args, "compile_timeout"), timing_timeout_s=_run_option(args, "timing_timeout"),
        max_attempts=_run_option(args, "max_attempts"), address=args.address, time_budget_s=args.time_budget,
        finalist_sustain_s=args.finalist_sustain or 0.0, runnable_only=runnable_only, scale_up=args.scale_up,
        scale_up_wait_s=_run_option(args, "scale_up_wait"), **_measuring(args))


def _print_preview(planned: list[Any], args: argparse.Namespace,
                   warm: Seeds | None = None) -> int:
    """`farm sweep --dry-run`: the planned tasks as their sweep would start them (nothing run);
    with --warm-start, how many configs each starts from and how many its space leaves out (`warm`:
    `farm.retune.nearest.Seeds`)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from farm.run.bounds import check_settings
    from farm.search import preview

    check_settings({"sampler": args.sampler, "emulate": args.emulate})
    shown = preview.preview(planned, interpret=args.interpret, emulate=args.emulate, sampler=args.sampler)

    def count(n: int | None) -> str:
        return "many" if n is None else str(n)

    def seeded(p: Any) -> tuple[str, ...]:
        if not args.warm_start:
            return ()
        configs = warm.configs.get(p.task.key, []) if warm else []
        outside = warm.outside.get(p.task.key, 0) if warm else 0
        return (f"{len(configs)}" + (f" ({outside} outside the space)" if outside else "") if configs else "-",)

    columns = ("task", "sampler", "trials", "valid", "fit", "pruned against", "default") + (
        ("warm start",) if args.warm_start else ())
    rows = [(task.task_key, task.sampler, f"{task.trials}{'*' if task.exhausts else ''}", count(task.valid),
             count(task.fits), task.capacity,
             " ".join(f"{k}={v}" for k, v in sorted(task.default.items())) + f" ({task.default_note})", *seeded(p))
            for task, p in zip(shown, planned)]
    if sys.stdout.isatty():
        table = Table(title="planned tasks (--dry-run: nothing runs)",
                      caption="valid: configs the space and the kernel accept; fit: of those, configs within the "
                      "memory pruned against (the others are never compiled); *: the budget covers every config "
                      "that fits" + ("; warm start: configs measured first (those outside the space beside "
                                     "the study)" if args.warm_start else ""))
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*map(escape, row))
        Console().print(table)
    else:   # piped: one tab-separated line a task, for grep and cut
        print("\t".join(columns))
        for row in rows:
            print("\t".join(row))
    empty = [t for t in shown if t.fits == 0]
    nothing = [t.task_key for t in empty if not t.default_runs]
    print(f"{len(shown)} tasks, {sum(t.trials for t in shown)} trials budgeted"
          + (f"; {len(empty)} with no config that fits, e.g. {empty[0].task_key}" if empty else "")
          + (f"; {len(nothing)} of them would run nothing, their default refused or too large too, e.g. "
             f"{nothing[0]}" if nothing else "")
          + ("; without --target a sweep tunes only the targets its cluster runs" if not args.target else ""))
    return 0


def _measuring(args: argparse.Namespace) -> dict[str, Any]:
    """--sample-budget and --race as SweepSettings fields (0 turns each off; left out: the default)."""
    given = {"sample_budget_s": args.sample_budget, "race": args.race}
    return {k: (v or None) for k, v in given.items() if v is not None}


def _sweep_spaces(args: argparse.Namespace) -> list[Any]:
    """The planned tasks of a new sweep: SPACE files, --kernel with --shape/--dtype, --tasks FILE."""
    from farm.search import plan, spaces, tasks_file

    if (args.shape or args.dtype) and not args.kernel:
        raise FarmError(f"{'--shape' if args.shape else '--dtype'}: expected --kernel too (the kernel to tune)")
    if not (args.spaces or args.kernel or args.tasks):
        raise FarmError("farm sweep: expected SPACE files, --kernel KERNEL --shape AxB, or --tasks FILE")
    loaded = spaces.load_spaces(args.spaces) if args.spaces else []
    if args.kernel:
        names = spaces.load_kernel(args.kernel, f"--kernel {args.kernel}",
                                   args.allow_kernel_module or None).SHAPE_NAMES
        for shape in args.shape or []:
            if len(shape) != len(names):
                raise FarmError(f"--shape {'x'.join(map(str, shape))}: expected {len(names)} dimensions for "
                                f"{args.kernel} ({'x'.join(names)})")
        shapes = list(dict.fromkeys(map(tuple, args.shape or [])))   # a shape given twice is one task
        dtypes = list(dict.fromkeys(args.dtype)) if args.dtype else args.dtype
        loaded.append(tasks_file.minimal_space(args.kernel, shapes, dtypes, label=f"--kernel {args.kernel}"))
    wanted: set[str] | None = None
    if args.tasks:
        listed = tasks_file.read_tasks(args.tasks)
        wanted = tasks_file.task_key_set(listed)
        loaded += tasks_file.tasks_spaces(listed, label=f"--tasks {args.tasks}")
    planned = plan.expand(loaded, args.target, args.trials)
    for space in loaded:
        for unfit in space.unfit:
            if not args.target or unfit.target in args.target:
                print(f"note: {space.path}: {unfit}; {unfit.outcome}", file=sys.stderr)
    from_file = {s.path for s in loaded if s.path.startswith("--tasks ")}
    planned = [p for p in planned if p.space.path not in from_file or p.task.key in (wanted or ())]
    if not planned:
        raise FarmError(f"no tuning tasks: none of the tasks has the target(s) {', '.join(args.target or [])}")
    return planned


def _warm_start(args: argparse.Namespace, planned: list[Any]) -> Seeds | None:
    """--warm-start BUNDLE: each task's configs to measure first (`farm.retune.nearest.Seeds`; None
    without the flag), and a note."""
    if args.trust and not args.warm_start:
        raise FarmError("--trust: expected --warm-start BUNDLE too (the keys verify that bundle)")
    if not args.warm_start:
        return None
    import warnings

    from farm.bundle import trust
    from farm.retune import nearest, planning

    trusted = trust.load_trust(args.trust) if args.trust else trust.Trust({})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trust.UnverifiedBundleWarning)
        previous = planning.load_previous(args.warm_start, trusted, allow_unsigned=not args.trust,
                                          flag="--warm-start")
    if not args.trust:
        print(f"WARNING: UNVERIFIED --warm-start {args.warm_start}: no --trust given, so its signature was not "
              f"checked (its configs are only measured first, each validated like any other)", file=sys.stderr)
    seeds = nearest.nearest_seeds(previous, planned)
    print(f"note: --warm-start {args.warm_start}: {len(seeds.configs)} of {len(planned)} tasks start from its "
          f"configs ({sum(map(len, seeds.configs.values()))} in all), each the task's own or a nearest shape's",
          file=sys.stderr)
    if seeds.outside:
        print(f"note: --warm-start {args.warm_start}: {sum(seeds.outside.values())} of these config(s), of "
              f"{len(seeds.outside)} task(s), lie outside the task's space: each is measured once beside the "
              f"study (the sampler does not learn from it), e.g. {next(iter(seeds.outside))}", file=sys.stderr)
    return seeds


def _resume_settings(args: argparse.Namespace) -> tuple[list[Any], Any]:
    """The saved run's tasks and settings, with the safe flags given now applied; refuses others."""
    from farm.run import placement, runlog
    from farm.run.sweep import SweepSettings

    out = args.resume
    given = [flag for flag, value in (("SPACE", args.spaces), ("--kernel", args.kernel), ("--shape", args.shape),
                                      ("--dtype", args.dtype), ("--tasks", args.tasks), ("--trials", args.trials),
                                      ("--target", args.target), ("--out", args.out),
                                      ("--warm-start", args.warm_start)) if value]
    if given:
        raise FarmError(f"--resume {out}: expected no {', '.join(given)} (the run folder keeps its own tasks, "
                        f"budgets, warm starts and folder)")
    planned, saved = runlog.load_run(out)
    wanted = {"--interpret": ("interpret", args.interpret or None), "--emulate": ("emulate", args.emulate),
              "--sampler": ("sampler", args.sampler), "--seed": ("seed", args.seed),
              "--repetitions": ("repetitions", args.repetitions), "--input-sets": ("input_sets", args.input_sets)}
    differ = [f"{flag} (saved {saved.get(field)!r}, given {value!r})" for flag, (field, value) in wanted.items()
              if value is not None and value != saved.get(field)]
    if differ:
        raise FarmError(f"--resume {out}: {'; '.join(differ)} differ from the saved run ({runlog.SWEEP_FILE}); "
                        f"expected them unchanged or left out (may change: {', '.join(RESUME_SAFE)})")
    changed = {"workers": args.workers, "depth": args.depth, "compile_processes": args.compile_processes,
               "finalists": args.finalists, "finalist_sustain_s": args.finalist_sustain,
               "compile_timeout_s": args.compile_timeout,
               "timing_timeout_s": args.timing_timeout, "max_attempts": args.max_attempts,
               "time_budget_s": args.time_budget, "scale_up": args.scale_up, "scale_up_wait_s": args.scale_up_wait,
               "node_labels": placement.parse_labels(args.node_label) if args.node_label else None}
    _quiet_optuna()
    try:
        settings = SweepSettings(**{**saved, **{k: v for k, v in changed.items() if v is not None},
                                    **_measuring(args), "run_dir": out, "address": args.address})
    except TypeError as err:
        raise FarmError(f"--resume {out}: {runlog.SWEEP_FILE} holds settings this version does not know "
                        f"({err}); expected a run folder written by this version") from None
    except FarmError as err:  # a setting out of its bounds: saved so (an edited file), or given now
        raise FarmError(f"--resume {out}: {runlog.SWEEP_FILE} settings or flags: {err}") from None
    return planned, settings


def cmd_sweep(args: argparse.Namespace) -> int:
    """Validate everything, run (or resume) the sweep, write the signed bundle, print winners.
    Spaces and tasks are read first: a bad file is answered before Ray and JAX are imported."""
    from farm.bundle import fingerprint
    from farm.run.destination import Destination
    from farm.search import spaces

    fingerprint.override()  # a bad $FARM_FINGERPRINT_OVERRIDE is answered now, not once the sweep has measured
    if args.allow_kernel_module:  # --resume reloads the run's spaces through the same switch
        os.environ[spaces.ALLOW_KERNEL_MODULES_ENV] = "1"
    if args.resume:
        if args.dry_run:
            raise FarmError("--dry-run: expected a new sweep's SPACE files, --kernel or --tasks, not --resume")
        planned, settings = _resume_settings(args)
        destination = Destination(args.resume)
    else:
        planned = _sweep_spaces(args)
        warm = _warm_start(args, planned)
        if args.dry_run:
            return _print_preview(planned, args, warm)
        destination = Destination.parse(args.out)
        settings = dataclasses.replace(_sweep_settings(args, destination.run_dir, runnable_only=not args.target),
                                       warm_start=warm.configs if warm else {})
    key = signing_key(args)
    from farm.bundle import signing
    from farm.run.progress import SweepProgress
    from farm.run.sweep import run_sweep

    if args.quiet:
        result = run_sweep(planned, settings, key, resume=bool(args.resume))
    else:
        with SweepProgress(planned, time_budget_s=settings.time_budget_s, every_s=args.progress_every) as progress:
            result = run_sweep(planned, settings, key, resume=bool(args.resume), on_record=progress.update,
                               on_start=progress.mark_started)
    summary = result.summary
    print(f"run folder: {destination.run_dir}")
    if destination.url:
        print(f"copied to: {destination.publish()}")
    if summary.get("bundle_unchanged"):
        print(f"bundle: {result.bundle} unchanged: nothing was left to measure ({summary.get('replayed_trials')} "
              f"trials logged before)")
    else:
        print(f"bundle: {result.bundle} (signed by key {signing.key_id(key.public_key())})")
    duty = summary.get("duty_cycle") or {}
    print(f"{summary.get('measured_trials', 0)} configs measured in {summary.get('wall_s', 0):.1f} s "
          f"({summary.get('trials_per_s', 0):.2f}/s) on {len(duty)} workers; device duty cycle "
          + (", ".join(f"{v:.0%}" for v in duty.values()) or "-"))
    print_winners(result.rows)
    _print_failures(result)
    for target, reason in sorted((summary.get("left_out") or {}).items()):
        print(f"note: left out the {target} tasks: {reason} (no --target was given; name it with --target to "
              f"tune it or be told why not)", file=sys.stderr)
    print(f"report: farm report {destination.run_dir}{' --allow-kernel-module' if args.allow_kernel_module else ''}")
    return 0


def _print_failures(result: Any) -> None:
    """For each task with no valid config, what most of its failed configs failed with (stderr)."""
    from farm.run.report import common_failure

    for row in result.rows:
        if row["status"] == "ok":
            continue
        failure = common_failure([r for r in result.records if r.task_key == row["task_key"]])
        if failure is not None:
            print(f"note: {row['task_key']}: no config ran correctly; {failure.count} of its {failure.failed} "
                  f"failed configs: {failure.message}", file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> int:
    """Write and print a run's report (report.md, best-so-far plots)."""
    from farm.run import report
    from farm.search import spaces

    if args.allow_kernel_module:
        os.environ[spaces.ALLOW_KERNEL_MODULES_ENV] = "1"
    run_dir = str(args.run_dir)
    if run_dir.startswith("file://"):
        run_dir = run_dir[len("file://"):]
    elif "://" in run_dir:
        raise FarmError(f"{run_dir}: expected a local run folder (a sweep with a URL --out keeps its run folder "
                        f"under artifacts/ too, and prints its path)")
    written = report.write_report(run_dir)
    print(written.markdown.read_text(), end="")
    print(f"report: {written.markdown}")
    for plot in written.plots:
        print(f"plot: {plot}")
    if written.plots_note:
        print(f"note: {written.plots_note}")
    return 0


def cmd_retune(args: argparse.Namespace) -> int:
    """Retune stale tasks warm-started from a previous bundle; write the bundle and report; 3 if the gate blocks."""
    from farm.bundle import fingerprint
    from farm.retune import planning, report, retune, rules
    from farm.run.destination import check_empty, default_run_dir
    from farm.run.progress import SweepProgress
    from farm.search import plan, spaces

    fingerprint.override()  # checked before anything runs
    loaded = spaces.load_spaces(args.spaces, allow_kernel_modules=args.allow_kernel_module or None)
    planned = plan.expand(loaded, args.target, None)
    out = args.out or default_run_dir("retune")
    check_empty(out)
    key = signing_key(args)
    previous = planning.load_previous(args.previous, _trust(args), allow_unsigned=args.allow_unsigned)
    settings = _sweep_settings(args, out, runnable_only=not args.target)   # as farm sweep: what the cluster runs
    options = rules.RetuneSettings(top=args.top, trials=args.trials, noise=args.noise,
                                   max_regression=args.max_regression, escalate=not args.no_escalate)
    shown = None if args.quiet else functools.partial(SweepProgress, every_s=args.progress_every)
    result = retune.retune(planned, previous, settings, key, options, progress=shown)
    print(result.markdown)
    print(f"run folder: {result.run_dir}\nbundle: {result.bundle}\nreport: {result.run_dir / report.REPORT_MD}, "
          f"{result.run_dir / report.REPORT_JSON}")
    if result.exit_code:
        print(f"gate: {len(result.report['blocked'])} task(s) failed or regressed beyond --max-regression "
              f"{args.max_regression}: {', '.join(result.report['blocked'])}", file=sys.stderr)
    return result.exit_code
