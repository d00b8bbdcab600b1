"""The `farm` command: sweep, report, verify, show, diff, lookup, keygen, bundle, pull, retune.

`options` holds the parser, `tune` the tuning commands, `bundles` the bundle commands, `diff` the
comparison of two bundles.

User errors print one line (`error: ...`) and exit with code 2; a bundle that fails
verification exits with code 1; `farm retune` exits with code 3 when its gate blocks a rollout,
`farm lookup --require-exact` when a task has no exact tuned config, and `farm diff
--fail-on-dropped` when NEW lacks a task OLD has tuned;
SIGTERM during a `--scale-up` sweep exits with 143 once its autoscaler request is withdrawn.
"""
from __future__ import annotations

import errno
import logging
import sys

from farm.cli import bundles, diff, tune
from farm.cli.options import KEY_ENV, build_parser
from farm.errors import BundleError, FarmError

# Storage failures that are the machine's, not the farm's: one line, exit 2.
STORAGE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}

COMMANDS = {"sweep": tune.cmd_sweep, "report": tune.cmd_report, "retune": tune.cmd_retune,
            "verify": bundles.cmd_verify, "show": bundles.cmd_show, "diff": diff.cmd_diff, "lookup": bundles.cmd_lookup,
            "keygen": bundles.cmd_keygen, "bundle": bundles.cmd_bundle, "pull": bundles.cmd_pull}


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
    except OSError as err:
        if err.errno not in STORAGE_ERRORS:
            raise
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}; expected room to write the run folder (what was logged "
              f"is kept: free space, then `farm sweep --resume RUN_DIR`)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit:   # SIGTERM under --scale-up (farm.run.scaling; not imported otherwise: it loads Ray)
        scaling = sys.modules.get("farm.run.scaling")
        status = scaling.terminated_status() if scaling is not None else None
        if status is None:
            raise
        print("terminated (SIGTERM)", file=sys.stderr)
        return status


__all__ = ["KEY_ENV", "build_parser", "main"]
