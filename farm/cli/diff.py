"""`farm diff OLD NEW`: what a deployment of OLD gains, loses and changes by pulling NEW."""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from typing import Any

from farm.bundle.compare import ADDED, DROPPED, NEW_CONFIG, SAME_CONFIG, TaskChange, compare, counts


def cmd_diff(args: argparse.Namespace) -> int:
    """Compare two bundles' tuned configs task by task; with --fail-on-dropped, exit 3 when NEW
    lacks a task OLD has tuned (a deployment pulling NEW would run a nearest or default config)."""
    from farm.bundle import trust
    from farm.bundle.locate import open_bundle

    trusted = trust.load_trust(args.trust) if args.trust else trust.Trust({})
    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        warnings.simplefilter("ignore", trust.UnverifiedBundleWarning)
        old, new = (stack.enter_context(open_bundle(path, trusted, allow_unsigned=not args.trust))
                    for path in (args.old, args.new))
        changes = compare(old.configs().to_pylist(), new.configs().to_pylist())
    if not args.trust:
        print(f"WARNING: UNVERIFIED bundles {args.old} and {args.new}: no --trust given, so their signatures were "
              f"not checked", file=sys.stderr)
    if args.json:
        for change in changes:
            print(json.dumps(_json_row(change), sort_keys=True))
    else:
        shown = changes if args.all else [c for c in changes if c.change != SAME_CONFIG]
        if shown:
            _print_table(shown)
        print(summary(changes) + ("" if args.all or len(shown) == len(changes) else
                                  f"; the {len(changes) - len(shown)} same config(s) are listed with --all"))
    dropped = [c.task for c in changes if c.change == DROPPED]
    if args.fail_on_dropped and dropped:
        print(f"error: {len(dropped)} task(s) tuned in {args.old} are not tuned in {args.new}, e.g. {dropped[0]}; "
              f"to keep them, merge first: farm bundle {args.old} {args.new} --out MERGED.tar.gz", file=sys.stderr)
        return 3
    return 0


def summary(changes: list[TaskChange]) -> str:
    """One line: how many tasks each kind of change holds, and of the tasks whose recorded medians
    compare, how many NEW's ran faster or slower beyond their spreads."""
    by_kind = ", ".join(f"{n} {kind}" for kind, n in counts(changes).items())
    compared = [c for c in changes if c.ratio is not None]
    moved = [c for c in compared if not c.within_noise]
    faster = sum(c.ratio > 1 for c in moved)   # type: ignore[operator]
    return (f"{len(changes)} task(s) tuned in either bundle: {by_kind}; of the {len(compared)} whose recorded "
            f"medians compare, NEW's ran faster at {faster} and slower at {len(moved) - faster} beyond their "
            f"spreads (two runs' records, not a side-by-side measurement)")


def _knobs(config: dict[str, Any] | None) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(config.items())) if config else "-"


def _config_change(change: TaskChange) -> str:
    """NEW's config for an added task, OLD's for a dropped one, and for a new config the knobs that
    changed (old -> new)."""
    if change.change == ADDED:
        return _knobs(change.new.config)   # type: ignore[union-attr]
    if change.change != NEW_CONFIG:
        return _knobs((change.old or change.new).config)   # type: ignore[union-attr]
    old, new = change.old.config, change.new.config   # type: ignore[union-attr]
    return " ".join(f"{k}={old.get(k, '-')}->{new.get(k, '-')}" for k in sorted(old.keys() | new.keys())
                    if old.get(k) != new.get(k))


def _print_table(changes: list[TaskChange]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from farm.run.progress import format_seconds

    table = Table(title="NEW against OLD", caption="old / new: OLD's recorded median over NEW's (above 1: NEW's "
                  "config ran faster in its run); ~ within the two medians' spreads")
    for column in ("task", "change", "config", "old median", "new median", "old / new", "note"):
        table.add_column(column)
    for change in changes:
        ratio = change.ratio
        shown = "-" if ratio is None else f"{'~' if change.within_noise else ''}{ratio:.2f}x"
        notes = [n for n in (change.incomparable, change.software_changed and "software changed") if n]
        table.add_row(escape(change.task), change.change, escape(_config_change(change)),
                      format_seconds(change.old and change.old.median_s),
                      format_seconds(change.new and change.new.median_s), shown, escape("; ".join(notes) or "-"))
    Console(width=200).print(table)


def _json_row(change: TaskChange) -> dict[str, Any]:
    return {"task": change.task, "change": change.change,
            "old_config": change.old and change.old.config, "new_config": change.new and change.new.config,
            "old_median_s": change.old and change.old.median_s, "new_median_s": change.new and change.new.median_s,
            "ratio": change.ratio, "within_noise": change.within_noise, "incomparable": change.incomparable,
            "software_changed": change.software_changed}
