"""The bundle commands: `farm verify`, `show`, `lookup`, `keygen`, `bundle`, `pull`, and the winners table."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import warnings
from typing import Any

from farm.cli.options import DEFAULT_KEY, GPU, KEY_ENV
from farm.errors import FarmError
from farm.tasks import json_object


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


def cmd_lookup(args: argparse.Namespace) -> int:
    """Print the config a deployment of BUNDLE runs for each task, and the rule that chose it;
    with --require-exact, exit 3 when a task has no exact tuned config."""
    from farm.bundle import trust
    from farm.deploy.registry import DEFAULT, EXACT, GPU_TARGETS, Registry
    from farm.deploy.tuned import gpu_targets
    from farm.measure import capacity

    tasks = _lookup_tasks(args)
    onchip = None
    if args.emulate:   # a GPU's shared memory for the GPU targets, a TPU's VMEM for the tpu target
        device = capacity.profile(args.emulate)
        targets = ("tpu",) if device.memory == "vmem" else GPU_TARGETS
        onchip = {target: device.onchip_bytes for target in targets}
    trusted = trust.load_trust(args.trust) if args.trust else trust.Trust({})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trust.UnverifiedBundleWarning)
        registry = Registry.load(args.bundle, trusted, allow_unsigned=not args.trust, software_policy="accept",
                                 onchip_bytes=onchip)
    if not args.trust:
        print(f"WARNING: UNVERIFIED bundle {args.bundle}: no --trust given, so its signature was not checked",
              file=sys.stderr)
    found = []
    for task in tasks:
        if task.target == GPU:   # the GPU target a deployment picks for the task (farm.deploy.tuned)
            order = gpu_targets(task.kernel, task.shape, task.dtype, args.compute_capability,
                                f"a GPU of compute capability {args.compute_capability}")
            task = dataclasses.replace(task, target=registry.gpu_target(task.kernel, task.shape, task.dtype,
                                                                        args.device_kind, order))
        found.append((task, registry.lookup(task.kernel, task.shape, task.dtype, task.target, args.device_kind,
                                            note=False)))
    if args.json:
        for task, choice in found:
            print(json.dumps({"kernel": task.kernel, "shape": list(task.shape), "dtype": task.dtype,
                              "target": task.target, "rule": choice.rule,
                              "distance": None if choice.rule == DEFAULT else choice.distance,
                              "tuned_shape": list(choice.tuned_shape) if choice.tuned_shape else None,
                              "device_kind": choice.device_kind, "median_s": choice.median_s,
                              "config": dict(choice.config)}, sort_keys=True))
    else:
        _print_lookups(found)
    missing = [task.key for task, choice in found if choice.rule != EXACT]
    if args.require_exact and missing:
        print(f"error: {len(missing)} of {len(found)} task(s) have no exact tuned config in {args.bundle}, e.g. "
              f"{missing[0]}; tune them: farm sweep --tasks FILE (the tasks as JSON lines)", file=sys.stderr)
        return 3
    return 0


def _lookup_tasks(args: argparse.Namespace) -> list[Any]:
    """The tasks `farm lookup` was given: --tasks FILE, and --kernel at each --shape, --dtype and
    --target (GPU: the one a deployment on a GPU picks, resolved by `cmd_lookup`)."""
    from farm.deploy.registry import GPU_TARGETS
    from farm.search.spaces import load_kernel
    from farm.search.tasks_file import read_tasks
    from farm.tasks import TuningTask

    tasks = list(read_tasks(args.tasks)) if args.tasks else []
    if args.kernel is not None:
        module = load_kernel(args.kernel, "--kernel")
        if not args.shape or not args.target:
            raise FarmError(f"--kernel {args.kernel}: expected --shape ({'x'.join(module.SHAPE_NAMES)}) and "
                            f"--target ({', '.join(module.TARGETS)})")
        for shape in args.shape:
            if len(shape) != len(module.SHAPE_NAMES):
                raise FarmError(f"--shape {'x'.join(map(str, shape))}: expected {len(module.SHAPE_NAMES)} "
                                f"dimensions for {args.kernel} ({'x'.join(module.SHAPE_NAMES)})")
        for target in args.target:
            if target == GPU and any(t in module.TARGETS for t in GPU_TARGETS):
                continue
            if target not in module.TARGETS:
                raise FarmError(f"--target {target}: expected a target of {args.kernel} "
                                f"({', '.join(module.TARGETS)})")
        tasks += [TuningTask(args.kernel, shape, dtype, target) for shape in args.shape
                  for dtype in (args.dtype or ["bfloat16"]) for target in args.target]
    elif args.shape or args.dtype or args.target:
        raise FarmError("--shape, --dtype and --target: expected --kernel with them")
    if not tasks:
        raise FarmError("expected tasks: --kernel K --shape AxB --target T, or --tasks FILE")
    return list({task.key: task for task in tasks}.values())


def _print_lookups(found: list[tuple[Any, Any]]) -> None:
    """A table of each task's looked-up config and rule."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from farm.deploy.registry import NEAREST
    from farm.run.progress import format_seconds

    table = Table(title="lookups", caption="rule: exact (tuned for this task), nearest (tuned for the shape shown, "
                  "within the runtime's distance), default (the kernel's default for this shape)")
    for column in ("task", "rule", "tuned for", "median there", "config"):
        table.add_column(column)
    for task, choice in found:
        rule = choice.rule if choice.rule != NEAREST else f"{NEAREST} ({choice.distance:.2f})"
        tuned = "-" if choice.tuned_shape is None else "x".join(map(str, choice.tuned_shape))
        if choice.device_kind:
            tuned += f" on {choice.device_kind}"
        config = " ".join(f"{k}={v}" for k, v in choice.config.items()) or "-"
        table.add_row(escape(task.key), rule, escape(tuned), format_seconds(choice.median_s), escape(config))
    Console(width=200).print(table)


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


def signing_key(args: argparse.Namespace) -> Any:
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


def cmd_bundle(args: argparse.Namespace) -> int:
    """Merge run bundles into one signed bundle."""
    from farm.bundle import merge as bundle
    from farm.bundle import signing, trust

    warnings.simplefilter("ignore", trust.UnverifiedBundleWarning)
    trusted = _trust(args)
    key = signing_key(args)
    result = bundle.merge(args.inputs, args.out, key, trusted, allow_unsigned=args.allow_unsigned,
                          replace=args.replace)
    for note in result.warnings:
        _warn_unverified(note)
    kept = " (the input's own, as signed)" if result.kept else ""
    print(f"bundle: {result.out}, id {result.bundle_id}{kept} (signed by key {signing.key_id(key.public_key())}): "
          f"{result.rows} tasks from {len(result.inputs)} inputs ({result.replaced} older rows replaced), "
          f"{result.trials} trials")
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
    if result.dropped:
        print(f"WARNING: {len(result.dropped)} tuned task(s) of the bundle it replaced are not in this one, e.g. "
              f"{result.dropped[0]}: they now run a nearest or default config. A pull replaces the deployment's "
              f"bundle; to add tasks to it, merge first: farm bundle {result.previous} NEW --out MERGED.tar.gz",
              file=sys.stderr)
    return 0


def _number(value: Any) -> float | None:
    """A finite number as a float, else None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def print_winners(rows: list[dict[str, Any]]) -> None:
    """A readable table of each task's winner against its default.

    measured: configs a worker compiled, validated and timed (ok or failed); failed: measured
    configs that did not run correctly, by outcome; skipped: draws never measured (invalid,
    pruned), which are not failures.
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from farm.measure import outcomes
    from farm.run.progress import format_seconds

    table = Table(title="winners", caption="measured: configs timed on a worker (ok or failed); skipped: draws "
                  "never measured (invalid, pruned) or answered from an earlier measurement (cached)")
    for column in ("task", "status", "config", "median", "spread", "default", "vs default", "measured", "failed",
                   "skipped"):
        table.add_column(column)
    for row in rows:
        row = {**row, **{k: _number(row.get(k)) for k in ("median_s", "default_median_s", "spread")}}
        speedup = "-"
        if row.get("median_s") and row.get("default_median_s"):
            speedup = f"{row['default_median_s'] / row['median_s']:.2f}x"
        config = json_object(row.get("config"))
        shown = " ".join(f"{k}={v}" for k, v in config.items()) if config else (
            "(not a JSON object)" if row.get("config") and config is None else "-")
        spread = f"{row['spread'] * 100:.1f}%" if row.get("spread") is not None else "-"
        counts = {k: v for k, v in (json_object(row.get("outcome_counts")) or {}).items() if isinstance(v, int)}
        measured = sum(counts.get(o, 0) for o in outcomes.MEASURED)
        failed = ", ".join(f"{o} {counts[o]}" for o in outcomes.FAILURES if counts.get(o))
        skipped = ", ".join(f"{o} {counts[o]}" for o in (*outcomes.SKIPPED, outcomes.CACHED) if counts.get(o))
        task = str(row.get("task_key"))
        if row.get("interpret") is True and row.get("target") != "interpret":
            task += " (timed in interpret mode)"   # emulated on a CPU: no guide to the device's times
        table.add_row(escape(task), escape(str(row.get("status"))), escape(shown),
                      format_seconds(row.get("median_s")), spread, format_seconds(row.get("default_median_s")),
                      speedup, str(measured), escape(failed or "-"), escape(skipped or "-"))
    console = Console(width=200)
    console.print(table)
    console.print()
