# The device clock through JAX's public profiler API (start_trace / stop_trace into a temporary
# folder, ProfileData.from_file): the probe on two cases, one device call.
bash .whl/install.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1; . bench/probes/device_clock_cases.sh
timeout 120 python3 bench/probes/device_clock_probe.py $OUT/probe "$C1" "$C4" 2>&1 | grep -v "^W0000\|^I0000\|Warn\|warn" | tee $OUT/probe.txt
