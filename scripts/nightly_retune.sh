#!/usr/bin/env bash
# Nightly retuning: retune the tasks a software upgrade (or a kernel edit) made stale, warm-started
# from the deployed bundle, and publish the new bundle only when the regression gate passes.
#
#   scripts/nightly_retune.sh        # from the repository root (cron, or `ray job submit -- bash ...`)
#
# Settings (environment, defaults in brackets):
#   FARM_PREVIOUS        the bundle to compare with: a deployment (farm pull --dest), bundle or run folder, archive
#   FARM_BUNDLE_URL      or a URL to `farm pull` it from first (path, file://, http(s)://, gs://, s3://)
#   FARM_SPACES          search spaces [search_spaces/*.yaml]
#   FARM_TARGET          target to retune [tpu]; empty: every target of the spaces
#   FARM_ADDRESS         Ray address [auto: the cluster this runs on]; empty: an embedded local Ray
#   FARM_KEY             signing key [$FARM_SIGNING_KEY (a path or the PEM itself: what a Ray job passes in
#                        env_vars, since `ray job submit` leaves the git-ignored .keys/ out), else .keys/ci_ed25519.pem]
#   FARM_TRUST           trusted keys: a .pub file or a trust folder [trust/]
#   FARM_OUT_ROOT        where run folders go; keep it outside a job's temporary working dir [artifacts]
#   FARM_PUBLISH         folder the new archive is copied to when the gate passes [$FARM_OUT_ROOT/published]
#   FARM_MAX_REGRESSION  gate: new/old time above 1 + this, beyond noise, blocks [0.05]
#   FARM_EXTRA           more `farm retune` flags, e.g. "--interpret --trials 8", or "--target tpu
#                        --scale-up 8" where the TPU hosts idle at min_workers: 0 []
#   PYTHON               the Python with pallas-farm installed [python; cron's PATH may lack it: give
#                        the virtual environment's, e.g. /opt/pallas-farm/.venv/bin/python]
#
# Exit codes: 0 published (or nothing stale: then nothing is published), 3 the gate blocked (see
# RUN/retune.md), other: an error.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python}
if ! command -v "$PY" >/dev/null; then
    echo "nightly_retune: PYTHON: expected a Python with pallas-farm installed, '$PY' is not on PATH (cron's PATH" \
         "is short: set PYTHON to the virtual environment's python)" >&2
    exit 2
fi
stamp=$(date -u +%Y%m%d-%H%M%S)
root=${FARM_OUT_ROOT:-artifacts}
out="$root/retune-$stamp"
trust=${FARM_TRUST:-trust/}
keyflags=()   # --key FARM_KEY; else farm reads $FARM_SIGNING_KEY itself; else the CI key's path
if [[ -n "${FARM_KEY:-}" ]]; then
    keyflags=(--key "$FARM_KEY")
elif [[ -z "${FARM_SIGNING_KEY:-}" ]]; then
    keyflags=(--key .keys/ci_ed25519.pem)
fi
publish=${FARM_PUBLISH:-$root/published}
# Every output folder is made (or refused) now, not after a night of retuning.
if ! mkdir -p "$root" "$publish" || [[ ! -w "$publish" ]]; then
    echo "nightly_retune: FARM_OUT_ROOT ($root) and FARM_PUBLISH ($publish): expected folders this job can write" >&2
    exit 2
fi

previous=${FARM_PREVIOUS:-}
if [[ -z "$previous" ]]; then
    if [[ -z "${FARM_BUNDLE_URL:-}" ]]; then
        echo "nightly_retune: set FARM_PREVIOUS (a bundle) or FARM_BUNDLE_URL (to pull one)" >&2
        exit 2
    fi
    "$PY" -m farm pull "$FARM_BUNDLE_URL" --dest "$root/deployed" --trust "$trust"
    previous="$root/deployed"
fi

flags=()
target=${FARM_TARGET-tpu}
address=${FARM_ADDRESS-auto}
[[ -n "$target" ]] && flags+=(--target "$target")
[[ -n "$address" ]] && flags+=(--address "$address")

# shellcheck disable=SC2086  # FARM_SPACES and FARM_EXTRA are word lists
status=0
"$PY" -m farm retune ${FARM_SPACES:-search_spaces/*.yaml} --previous "$previous" --trust "$trust" \
    "${keyflags[@]}" --out "$out" --quiet --max-regression "${FARM_MAX_REGRESSION:-0.05}" "${flags[@]}" \
    ${FARM_EXTRA:-} || status=$?

case $status in
    0)
        # Nothing stale (every task carried): the deployed bundle stands; a new archive of the same
        # configs would only look newer to farm pull.
        if "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1]))["decisions"]; sys.exit(set(d) != {"carried"})' \
                "$out/retune.json"; then
            echo "nightly_retune: nothing stale; nothing published (report: $out/retune.md)"
            exit 0
        fi
        "$PY" -m farm bundle "$out" --out "$publish/kernels-$stamp.tar.gz" "${keyflags[@]}" --trust "$trust"
        echo "nightly_retune: published $publish/kernels-$stamp.tar.gz (report: $out/retune.md)"
        ;;
    3)
        echo "nightly_retune: BLOCKED: a task failed or regressed beyond the gate; nothing published (report:" \
             "$out/retune.md)" >&2
        ;;
    *)
        echo "nightly_retune: farm retune failed with exit code $status" >&2
        ;;
esac
exit $status
