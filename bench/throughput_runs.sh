#!/usr/bin/env bash
# The tuning-throughput runs of BENCHMARKS.md (issue 16), on a GPU host, in one go:
#   bash bench/throughput_runs.sh OUT [reference|suite1|suite2|suite300|suite_reference]...
# reference: an exhaustive (grid) sweep of three of the user space's tasks on one GPU (rms norm at
#            4096x5120 and 8192x4096, softmax at 16384x4000): every valid config measured once, the
#            table bench/search_strategies.py replays (softmax at 8192x50257 comes from an earlier grid);
# suite1 / suite2: the memory-bound suite (every memory-bound space's seed shapes, gpu-triton) plus
#            the user shapes, 60 s of measuring on one GPU / on two, default settings.
# suite300: the whole seed suite (every shipped space's GPU targets), 300 s of measuring on one GPU,
#            default settings;
# suite_reference: the same suite for 420 s with TPE and another seed, 14 compile processes, on GPU 1
#            (CUDA_VISIBLE_DEVICES=1; run it beside suite300 on a two-GPU host:
#            `bash bench/throughput_runs.sh OUT suite_reference & CUDA_VISIBLE_DEVICES=0 bash ... suite300`).
# Then `python bench/suite_convergence.py --run OUT/suite300 --reference OUT/suite_reference` re-times
# each task's winners side by side on one GPU.
# Each run leaves OUT/<name>/{run.json,trials.jsonl.gz,finalists.jsonl}.
set -euo pipefail
out=$1; shift
key=/tmp/farm-bench-key.pem
test -f $key || python3 -m farm keygen $key >/dev/null
memory_bound="softmax softmax_two_pass batch_softmax cross_entropy cross_entropy_long rms_norm rms_norm_bwd
              layer_norm welford swiglu geglu"
user="bench/spaces/user_softmax.yaml bench/spaces/user_rms_norm.yaml"
sweep() {   # name, then farm sweep arguments
  local name=$1; shift
  rm -rf /tmp/farm-bench/$name
  python3 -m farm sweep "$@" --key $key --out /tmp/farm-bench/$name --quiet | tail -3
  mkdir -p $out/$name
  cp /tmp/farm-bench/$name/run.json /tmp/farm-bench/$name/finalists.jsonl $out/$name/ 2>/dev/null || true
  gzip -c /tmp/farm-bench/$name/trials.jsonl > $out/$name/trials.jsonl.gz
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['summary']; print(sys.argv[2], {k: s[k] for k in
    ('measuring_s', 'measured_trials', 'measuring_trials_per_s', 'duty_cycle', 'compile_processes', 'workers')})" \
    /tmp/farm-bench/$name/run.json $name
}
for run in "$@"; do
  case $run in
    reference) sweep reference bench/spaces/user_rms_norm.yaml bench/spaces/reference_softmax.yaml --target gpu-triton \
                 --sampler grid --trials 2000 --workers 1 --time-budget 400 ;;
    suite1) sweep suite1 $(for k in $memory_bound; do echo search_spaces/$k.yaml; done) $user --target gpu-triton \
              --trials 2000 --time-budget 60 --workers 1 ;;
    suite2) sweep suite2 $(for k in $memory_bound; do echo search_spaces/$k.yaml; done) $user --target gpu-triton \
              --trials 2000 --time-budget 60 ;;
    suite300) sweep suite300 search_spaces/*.yaml --target gpu-triton --target gpu-mosaic --trials 5000 \
                --time-budget 300 --workers 1 ;;
    suite_reference) sweep suite_reference search_spaces/*.yaml --target gpu-triton --target gpu-mosaic --trials 5000 \
                 --sampler tpe --seed 7 --time-budget 420 --workers 1 --compile-processes 14 ;;
    *) echo "unknown run $run" >&2; exit 2 ;;
  esac
done
