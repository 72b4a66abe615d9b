#!/usr/bin/env bash
# Tensor parallelism on H200s: the Nano-vLLM workload offline on Qwen3-14B (dummy weights) at every TP
# size up to the GPUs present, then an online run against `python -m minisgl --tp N` for the same sizes.
#   bash minisgl/benchmark/run_h200_tp.sh [offline|online|all]      (TP_SIZES="2 4" to pick the sizes)
set -uo pipefail
# NVLink multicast can put a shared host's GPUs out of service: keep it off in everything started here
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
RESULTS=${RESULTS:-minisgl/benchmark/results/h200-tp.json}
ONLINE=${ONLINE:-minisgl/benchmark/results/h200-tp-online.json}
REPEATS=${REPEATS:-2}
MODEL=${MODEL:-Qwen3-14B}
what=${1:-all}
gpus=$(python -c 'import torch; print(torch.cuda.device_count())')
sizes=${TP_SIZES:-$(for tp in 1 2 4 8; do [ "$tp" -le "$gpus" ] && echo "$tp"; done)}
if [ "$what" = all ] || [ "$what" = offline ]; then
  for tp in $sizes; do
    date +%T
    python -m minisgl.benchmark.offline --workload nano --model "$MODEL" --dummy-weight --tp "$tp" --quiet \
      --repeats "$REPEATS" --json "$RESULTS" --tag "tp$tp"
  done
fi
if [ "$what" = all ] || [ "$what" = online ]; then
  # 256 streaming requests, Poisson at 16 req/s, prompts of 512-1024 and answers of 128-256 tokens
  for tp in $sizes; do
    date +%T
    python -m minisgl --model "$MODEL" --dummy-weight --tp "$tp" --port 1919 --log-level warning &
    server=$!
    until python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:1919/health')" 2>/dev/null; do
      kill -0 "$server" 2>/dev/null || { echo "the server (tp $tp) exited before it was ready"; exit 1; }
      sleep 2
    done
    python -m minisgl.benchmark.online --num-requests 256 --request-rate 16 --input-len 1024 --output-len 256 \
      --range-ratio 0.5 --json "$ONLINE" --tag "$MODEL tp$tp" --plot "${ONLINE%.json}-tp$tp.png"
    kill -INT "$server"
    wait "$server"
  done
fi
