#!/usr/bin/env bash
# Two builds side by side in one run: this tree (base) and a copy with PATCH applied (patched),
# the same cases (bench/probes/staged_rows.sh's format) timed on each, alternating for ROUNDS
# rounds so that both see the same clocks; then the table of both (bench/probes/ab_summary.py).
# On the H200 (PYTHONPATH holding this tree, as the device commands set it):
#   git diff > /tmp/x.patch   # or any patch against this tree; then, carried as an untracked file:
#   bash bench/probes/ab_trees.sh my.patch bench/probes/staged_rows.txt $OUT/ab 2
set -euo pipefail
patch=${1:?usage: ab_trees.sh PATCH CASES OUT [ROUNDS]}
cases=${2:?usage: ab_trees.sh PATCH CASES OUT [ROUNDS]}
out=${3:?usage: ab_trees.sh PATCH CASES OUT [ROUNDS]}
rounds=${4:-2}
here=$PWD
other=$(mktemp -d)/tree
cp -r "$here" "$other"
git -C "$other" apply "$here/$patch" 2>/dev/null || (cd "$other" && patch -p1 < "$here/$patch")
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
  echo "== base, round $round"
  bash bench/probes/staged_rows.sh "$out/base$round" < "$cases"
  echo "== patched, round $round"
  (cd "$other" && PYTHONPATH=${PYTHONPATH//$here/$other} bash bench/probes/staged_rows.sh "$out/patched$round" \
    < "$here/$cases")
done
python3 bench/probes/ab_summary.py "$out"
