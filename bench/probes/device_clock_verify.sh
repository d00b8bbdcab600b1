# The farm's compile path with batched executables compiled without command buffers (one device
# call): the probe's overlaps and figures, then a tuned table of users' short rows.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1; . bench/probes/device_clock_cases.sh
timeout 150 python3 bench/probes/device_clock_probe.py $OUT/probe "$C1" "$C4" "$C5" "$C9" "$C7" 2>&1 | grep -v "^W0000\|^I0000\|^{\|Warn\|warn" | tee $OUT/probe.txt
timeout 380 python3 bench/seed_table.py --tune 90 --trials 30 --target gpu-triton --shape softmax:3x50257 --shape rms_norm:2x32768 --shape layer_norm:4x16384 --shape rms_norm_bwd:512x5120 --shape cross_entropy:8x128256 --check all --no-compile --budget-s 360 --out $OUT/tuned > $OUT/tuned.log 2>&1; echo TABLE_RC=$?
grep -A10 "On device time" $OUT/tuned/seed_table.md; grep "winner" $OUT/tuned/seed_table.md | cut -c1-250
for f in trials.jsonl finalists.jsonl; do find $OUT/tuned -name $f -exec cp {} $OUT/tune_$f \; ; done
