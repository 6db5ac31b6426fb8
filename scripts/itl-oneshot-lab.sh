#!/usr/bin/env bash
# scripts/itl-oneshot-lab.sh — batch-1 ITL at tp 4 over 1 Gbit/s per host
# (scripts/hostlab.sh): one-shot (ECHO_ONESHOT_BYTES=8192) vs two-shot, exact
# and echo, interleaved, 3 repetitions, into build/itl.jsonl (docs/network.md).
# Needs root and Open MPI; every run under flock /work/cpu.lock.
cd "$(dirname "$0")/.."
: > build/itl.jsonl
for rep in 1 2 3; do
  for mode in exact echo; do
    for os in 0 8192; do
      line=$(flock /work/cpu.lock env ECHO_ONESHOT_BYTES=$os timeout 400 scripts/hostlab.sh --hosts 4 --rate 1gbit -- \
        mpirun -np 4 bin/echo-bench forward --model random:qwen3-0.6b --tp 4 --allreduce $mode --prefill 16 \
        --ttft-len 16 --decode-batch 1 --decode-steps 16 --iters 1 --gemm-dim 0 --copy-bytes 1M --json 2>/dev/null |
        python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))')
      echo "{\"rep\": $rep, \"os\": $os, \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"r\": $line}" >> build/itl.jsonl
    done
  done
done
