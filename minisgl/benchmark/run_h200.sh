#!/usr/bin/env bash
# The GPU benchmark of docs/benchmarks-gpu.md: the Nano-vLLM workload on one H200 with dummy weights, each
# configuration in its own process, results appended to $RESULTS (JSON list).
#   bash minisgl/benchmark/run_h200.sh [0.6B|14B|hf|all]
set -uo pipefail
RESULTS=${RESULTS:-minisgl/benchmark/results/h200.json}
what=${1:-all}
# each run is a fresh process; its start-up (imports, dummy weights, KV pool, graph capture) is not in
# the measured seconds but is in the wall time, so leave each run a few minutes
# two identical single runs once differed by 7.5%, so each configuration is timed $REPEATS times (median)
REPEATS=${REPEATS:-3}
bench() { date +%T; python -m minisgl.benchmark.offline --workload nano --dummy-weight --quiet --repeats "$REPEATS" --json "$RESULTS" "$@"; }
for model in Qwen3-0.6B Qwen3-14B; do
  case "$what" in all|${model#Qwen3-}) ;; *) continue ;; esac
  bench --model "$model" --tag "default"
  MINISGL_DISABLE_OVERLAP_SCHEDULING=1 bench --model "$model" --tag "no-overlap"
  bench --model "$model" --cuda-graph-max-bs 0 --tag "no-cuda-graph"
  MINISGL_FUSED_KERNELS=0 bench --model "$model" --tag "no-fused-kernels"
  bench --model "$model" --page-size 1 --tag "page-size-1"
  bench --model "$model" --page-size 16 --tag "page-size-16"
  bench --model "$model" --page-size 256 --tag "page-size-256"
  if [ "$model" = Qwen3-0.6B ]; then MINISGL_FI_TENSOR_CORES=0 bench --model "$model" --tag "cuda-core-decode"; fi
done
if [ "$what" = all ] || [ "$what" = hf ]; then
  # HF transformers generate on the same requests: the first 64, in static batches of 64
  python -m minisgl.benchmark.offline --workload nano --engine hf --model Qwen3-0.6B --dummy-weight --hf-max-requests 64 \
    --hf-batch-size 64 --quiet --json "$RESULTS" --tag "hf-subset-64"
fi
