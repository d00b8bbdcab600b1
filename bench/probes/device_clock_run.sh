# The device clock's checks on the H200 (one device call): the serialization probe, then a tuned
# table of the few-long-rows shapes the search missed on the wall clock.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1; . bench/probes/device_clock_cases.sh
timeout 150 python3 bench/probes/serialize_probe.py "$C1" "$C4" "$C9" "$C6" 2>&1 | grep -v "^W0000\|^I0000" | tee $OUT/serialize.txt
timeout 360 python3 bench/seed_table.py --tune 100 --trials 40 --target gpu-triton --shape rms_norm_bwd:3x5120 --shape rms_norm:2x32768 --shape layer_norm:4x16384 --check all --no-compile --budget-s 330 --out $OUT/tuned > $OUT/tuned.log 2>&1; echo TABLE_RC=$?
tail -3 $OUT/tuned.log; grep -A9 "On device time" $OUT/tuned/seed_table.md; grep "winner" $OUT/tuned/seed_table.md
for f in trials.jsonl finalists.jsonl; do find $OUT/tuned -name $f -exec cp {} $OUT/tune_$f \; ; done; ls $OUT
