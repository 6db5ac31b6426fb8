#!/usr/bin/env bash
# scripts/itl-oneshot-lab.sh — batch-1 ITL at tp 4 over 1 Gbit/s per host
# (scripts/hostlab.sh): one-shot (--oneshot 8192, the default under mpirun)
# vs two-shot (--oneshot off), exact and echo, interleaved, 3 repetitions,
# into build/itl.jsonl (docs/network.md). MODEL (default random:qwen3-0.6b)
# as the first argument. Needs root and Open MPI; every run under flock
# /work/cpu.lock.
cd "$(dirname "$0")/.."
model=${1:-random:qwen3-0.6b}
: > build/itl.jsonl
for rep in 1 2 3; do
  for mode in exact echo; do
    for os in off 8192; do
      line=
      for _try in 1 2; do  # one retry: Open MPI's start-up in the lab fails now and then
        [ -n "$line" ] && break
        line=$(flock /work/cpu.lock timeout 400 scripts/hostlab.sh --hosts 4 --rate 1gbit -- \
          mpirun -np 4 bin/echo-bench forward --model "$model" --tp 4 --allreduce $mode --prefill 16 \
          --ttft-len 16 --decode-batch 1 --decode-steps 16 --iters 1 --gemm-dim 0 --copy-bytes 1M --threads 1 \
          --oneshot $os --json 2>/dev/null | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' 2>/dev/null)
      done
      echo "{\"rep\": $rep, \"os\": \"$os\", \"mode\": \"$mode\", \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"r\": ${line:-null}}" >> build/itl.jsonl
    done
  done
done
python3 - <<'PY'
import json, statistics as st
rows = [json.loads(l) for l in open("build/itl.jsonl")]
for mode in ("exact", "echo"):
    for os in ("off", "8192"):
        v = [[d for d in r["r"]["decode"] if d["batch"] == 1][0]["ms_per_step"] for r in rows
             if r["mode"] == mode and r["os"] == os and r["r"]]
        print(f"{mode} oneshot {os}: ITL ms {' / '.join(f'{x:.1f}' for x in v)}, median {st.median(v) if v else float('nan'):.1f}")
PY
