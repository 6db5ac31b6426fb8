#!/usr/bin/env bash
# TTFT A/B experiment: the same model and the same workload (same seed, so
# the same prompts and arrival times) served with --allreduce exact, then
# echo, then int4, optionally each under background traffic; writes one
# comparison table. See docs/ttft.md; over a shaped link, docs/network.md.
#
#   scripts/ttft-ab.sh --model M --tp N [--device auto|cpu|cuda] [options] [workload flags]
#
# Options (everything else is passed to `echo-bench serve` as the workload):
#   --modes exact,echo,int4    all-reduce modes, in order; the first is the baseline of the ratios;
#                              exact, bf16, int4 (the paper's codec), echo or echo-nofb, echo/echo-nofb optionally :CODEC (echo:hadamard-g32
#                              serves --allreduce echo --echo-codec hadamard-g32); a mode ending in +notail
#                              (echo+notail) runs with ECHO_TAIL=0: echo without its bf16 tail (comm/echo.h)
#   --mpirun                   ranks as processes: the server runs under `mpirun -np TP`
#                              ($MPIRUN, default mpirun; as root OMPI_ALLOW_RUN_AS_ROOT is set)
#   --link RATE                run everything (server ranks and client) inside scripts/netlab.sh
#                              with its loopback shaped to RATE (1gbit, 2.5gbit, none ...); implies
#                              --mpirun, so every byte between ranks crosses the link; needs root
#   --lab netlab|hostlab       the lab --link runs in: netlab (default; one shaped loopback shared
#                              by all ranks) or hostlab (scripts/hostlab.sh: one namespace per rank,
#                              each with its own shaped link; the client runs in rank 0's)
#   --background KIND          also measure every mode "busy": cpu-membw (memory-bandwidth hog
#                              processes) or gpu-nccl (nccl-tests all_reduce_perf looping on the
#                              same GPUs); none (default) measures quiet only
#   --bg-jobs N                cpu-membw: hog processes (default 1)
#   --out DIR                  results (default ttft-ab-YYYYmmdd-HHMMSS)
#   --serve-args "ARGS"        extra echo-serve flags (e.g. "--max-num-seqs 16 --threads 4")
#   --probe-prompts K          prefill-only probe requests per run (default 8; 0 = no probe)
#   --bench PATH --serve PATH  binaries (default bin/echo-bench, bin/echo-serve)
#   --no-plot                  skip the TTFT CDF picture
#
# Per run it saves LABEL.json (echo-bench serve result), LABEL-probe.json,
# /metrics snapshots (LABEL.before.prom, .after.prom, .probe.prom) and the
# server log; then summary.md with the table, and ttft-cdf.png.
#
# All-reduce share of prefill: after the workload, K requests of the same
# prompt length with max_tokens 1 run one at a time, so the server only
# prefills; share = (delta echo:allreduce_seconds_total / tp) / delta
# echo:request_prefill_time_seconds_sum over that probe (the counter sums
# over ranks, hence / tp). Exit status: 0 ok, 1 a run failed, 2 usage.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

model="" tp=2 device=auto modes=exact,echo,int4 background=none bg_jobs=1 out="" serve_args=""
probe=8 bench="$root/bin/echo-bench" serve="$root/bin/echo-serve" plot=1 mpi=0 link="" lab=netlab
workload=() all_args=("$@")
usage() { sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
need() { [ $# -ge 2 ] && [ -n "$2" ] || { echo "ttft-ab: $1 needs a value" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --model) need "$@"; model=$2; shift 2 ;;
    --tp) need "$@"; tp=$2; shift 2 ;;
    --device) need "$@"; device=$2; shift 2 ;;
    --modes) need "$@"; modes=$2; shift 2 ;;
    --background) need "$@"; background=$2; shift 2 ;;
    --bg-jobs) need "$@"; bg_jobs=$2; shift 2 ;;
    --out) need "$@"; out=$2; shift 2 ;;
    --serve-args) need "$@"; serve_args=$2; shift 2 ;;
    --probe-prompts) need "$@"; probe=$2; shift 2 ;;
    --bench) need "$@"; bench=$2; shift 2 ;;
    --serve) need "$@"; serve=$2; shift 2 ;;
    --no-plot) plot=0; shift ;;
    --mpirun) mpi=1; shift ;;
    --link) need "$@"; link=$2; mpi=1; shift 2 ;;
    --lab) need "$@"; lab=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    --save-result|--label|--base-url) echo "ttft-ab: $1 is set by the script" >&2; exit 2 ;;
    --) shift; workload+=("$@"); break ;;
    *) workload+=("$1"); shift ;;
  esac
done
[ -n "$model" ] || { echo "ttft-ab: --model is required" >&2; usage; }
[[ "$tp" =~ ^[1-9][0-9]*$ ]] || { echo "ttft-ab: --tp: expected a positive integer, got '$tp'" >&2; exit 2; }
[[ "$bg_jobs" =~ ^[1-9][0-9]*$ ]] || { echo "ttft-ab: --bg-jobs: expected a positive integer" >&2; exit 2; }
[[ "$probe" =~ ^[0-9]+$ ]] || { echo "ttft-ab: --probe-prompts: expected an integer >= 0" >&2; exit 2; }
case "$device" in auto|cpu|cuda) ;; *) echo "ttft-ab: --device: expected auto, cpu or cuda" >&2; exit 2 ;; esac
case "$background" in none|cpu-membw|gpu-nccl) ;;
  *) echo "ttft-ab: --background: expected none, cpu-membw or gpu-nccl, got '$background'" >&2; exit 2 ;; esac
IFS=, read -r -a mode_list <<<"$modes"
for m in "${mode_list[@]}"; do
  m=${m%+notail}
  case "${m%%:*}" in exact|bf16|echo|echo-nofb|int4) ;; *) echo "ttft-ab: --modes: unknown mode '$m'" >&2; exit 2 ;; esac
  case "$m" in exact:*|bf16:*) echo "ttft-ab: --modes: '$m': exact and bf16 take no codec" >&2; exit 2 ;; esac
done
# --link: the whole experiment again, inside the lab's namespace (the client
# too: the server's loopback port is only reachable from inside).
if [ -n "$link" ] && [ -z "${ECHO_NETLAB_RATE:-}" ]; then
  [ "$(id -u)" = 0 ] || { echo "ttft-ab: --link needs root (network namespaces)" >&2; exit 2; }
  case "$lab" in
    netlab) exec "$root/scripts/netlab.sh" --rate "$link" -- "$0" "${all_args[@]}" ;;
    hostlab) exec "$root/scripts/hostlab.sh" --hosts "$tp" --rate "$link" -- "$0" "${all_args[@]}" ;;
    *) echo "ttft-ab: --lab: expected netlab or hostlab, got '$lab'" >&2; exit 2 ;;
  esac
fi
if [ $mpi = 1 ]; then
  command -v "${MPIRUN:-mpirun}" >/dev/null || { echo "ttft-ab: --mpirun: ${MPIRUN:-mpirun} not found (make deps)" >&2; exit 1; }
  [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
for b in "$bench" "$serve"; do
  [ -x "$b" ] || { echo "ttft-ab: $b is not built (run make)" >&2; exit 1; }
done
command -v curl >/dev/null && command -v python3 >/dev/null || { echo "ttft-ab: needs curl and python3" >&2; exit 1; }
if [ "$background" = gpu-nccl ]; then
  nccl_ar=$(command -v all_reduce_perf || echo "${NCCL_TESTS_DIR:-}/build/all_reduce_perf")
  [ -x "$nccl_ar" ] || { echo "ttft-ab: --background gpu-nccl needs nccl-tests' all_reduce_perf on PATH" \
    "(or \$NCCL_TESTS_DIR/build/all_reduce_perf): https://github.com/NVIDIA/nccl-tests" >&2; exit 1; }
fi
out=${out:-ttft-ab-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out" || exit 1

srv_pid="" bg_pids=()
cleanup() {
  stop_background
  if [ -n "$srv_pid" ] && kill -0 "$srv_pid" 2>/dev/null; then kill -TERM "$srv_pid"; wait "$srv_pid" 2>/dev/null; fi
  srv_pid=""
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_server() { # mode[:codec][+notail] -> sets srv_pid, port
  local spec=${1%+notail} log="$out/serve-$1.log" launch=() codec=() tail=()
  local mode=${spec%%:*}
  [ "$mode" = "$spec" ] || codec=(--echo-codec "${spec#*:}")
  [ "$spec" = "$1" ] || tail=(env ECHO_TAIL=0)
  [ $mpi = 1 ] && launch=("${MPIRUN:-mpirun}" --oversubscribe -np "$tp")
  [ $mpi = 1 ] && [ ${#tail[@]} -gt 0 ] && launch+=(-x ECHO_TAIL=0)
  launch=("${tail[@]}" "${launch[@]}")
  # shellcheck disable=SC2086  # serve_args is a flag list on purpose
  "${launch[@]}" "$serve" --model "$model" --tp "$tp" --device "$device" --allreduce "$mode" "${codec[@]}" --port 0 \
    $serve_args >"$log" 2>&1 &
  srv_pid=$!
  local deadline=$((SECONDS + 600))
  port=""
  while [ $SECONDS -lt $deadline ]; do
    port=$(sed -n 's/.*ready on port \([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$port" ] && return 0
    kill -0 "$srv_pid" 2>/dev/null || { echo "ttft-ab: echo-serve ($mode) exited; log:" >&2; tail -20 "$log" >&2; return 1; }
    sleep 0.2
  done
  echo "ttft-ab: echo-serve ($mode) not ready after 600 s (log: $log)" >&2
  return 1
}

stop_server() {
  [ -n "$srv_pid" ] || return 0
  kill -TERM "$srv_pid" 2>/dev/null
  wait "$srv_pid" 2>/dev/null
  srv_pid=""
}

start_background() {
  case "$background" in
    cpu-membw)
      # Streams 2 x 128 MiB buffers (far beyond any last-level cache), so
      # every copy goes to DRAM: the shared memory bus the local transport's
      # all-reduce (and the rest of a CPU forward pass) runs over.
      for _ in $(seq "$bg_jobs"); do
        python3 -c 'a = bytearray(128 << 20); b = bytearray(128 << 20)
while True: b[:] = a' &
        bg_pids+=($!)
      done ;;
    gpu-nccl)
      # A concurrent NCCL all-reduce on the same GPUs (CUDA_VISIBLE_DEVICES as
      # for the server): big messages, back to back, for as long as we measure.
      ( while :; do "$nccl_ar" -b 256M -e 256M -g "$tp" -n 1000 -w 0 -c 0 >/dev/null 2>&1 || sleep 1; done ) &
      bg_pids+=($!) ;;
  esac
  sleep 1 # let the hog reach steady state before the first request
}

stop_background() {
  local p
  for p in "${bg_pids[@]}"; do
    pkill -TERM -P "$p" 2>/dev/null # the gpu-nccl loop's current all_reduce_perf
    kill -TERM "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  bg_pids=()
}

metrics() { curl -sf --max-time 30 "http://127.0.0.1:$port/metrics" >"$1" || echo "ttft-ab: cannot read /metrics" >&2; }

conditions=(quiet)
[ "$background" != none ] && conditions+=(busy)
labels=()
status=0
echo "ttft-ab: model $model, tp $tp$([ $mpi = 1 ] && echo " (processes)"), device $device, modes $modes," \
  "background $background, link ${ECHO_NETLAB_RATE:-host}, out $out" >&2
echo "ttft-ab: workload: echo-bench serve ${workload[*]}" >&2
for mode in "${mode_list[@]}"; do
  start_server "$mode" || { status=1; break; }
  for cond in "${conditions[@]}"; do
    label=$mode
    [ "$cond" = busy ] && label="$mode+busy-$background"
    [ "$cond" = busy ] && start_background
    echo "ttft-ab: == $label (port $port)" >&2
    metrics "$out/$label.before.prom"
    "$bench" serve --base-url "http://127.0.0.1:$port" "${workload[@]}" \
      --save-result "$out/$label.json" --label "$label" >"$out/$label.txt"
    rc=$?
    cat "$out/$label.txt"
    metrics "$out/$label.after.prom"
    if [ "$probe" -gt 0 ]; then
      # later flags win in getopt: same prompts' lengths, 1 output token, one at a time
      "$bench" serve --base-url "http://127.0.0.1:$port" "${workload[@]}" --num-prompts "$probe" \
        --max-concurrency 1 --request-rate inf --output-len 1 --num-warmups 0 --no-progress \
        --save-result "$out/$label-probe.json" --label "$label-probe" >/dev/null || rc=1
      metrics "$out/$label.probe.prom"
    fi
    [ "$cond" = busy ] && stop_background
    [ $rc -eq 0 ] || { echo "ttft-ab: $label: echo-bench serve failed (exit $rc)" >&2; status=1; }
    labels+=("$label")
  done
  stop_server
done

python3 - "$out" "$tp" "${mode_list[0]}" "${labels[@]}" <<'EOF' | tee "$out/summary.md"
import json, re, sys
out, tp, base, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]

def prom(path):
    vals = {}
    try:
        for line in open(path):
            m = re.match(r'^([a-zA-Z_:]+)(\{[^}]*\})?\s+(\S+)$', line.strip())
            if m:
                vals[m.group(1)] = vals.get(m.group(1), 0.0) + float(m.group(3))
    except OSError:
        pass
    return vals

def delta(a, b, name):
    return prom(b).get(name, 0.0) - prom(a).get(name, 0.0)

rows = {}
for lab in labels:
    try:
        s = json.load(open(f"{out}/{lab}.json"))["summary"]
    except (OSError, ValueError, KeyError):
        continue
    r = dict(s)
    ar = delta(f"{out}/{lab}.before.prom", f"{out}/{lab}.after.prom", "echo:allreduce_seconds_total") / tp
    r["ar_s_rank"] = ar
    pf_ar = delta(f"{out}/{lab}.after.prom", f"{out}/{lab}.probe.prom", "echo:allreduce_seconds_total") / tp
    pf = delta(f"{out}/{lab}.after.prom", f"{out}/{lab}.probe.prom", "echo:request_prefill_time_seconds_sum")
    r["ar_prefill_share"] = pf_ar / pf if pf > 0 else None
    rows[lab] = r

def f(x, fmt="{:.2f}"):
    return "n/a" if x is None else fmt.format(x)

print(f"# TTFT A/B: {out}\n")
print("| run | ok/failed | TTFT mean | p50 | p90 | p99 (ms) | ITL mean | ITL p50 (ms) | TPOT mean (ms) | E2E mean (ms) | out tok/s | req/s | AR s/rank | AR share of prefill |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for lab, r in rows.items():
    print(f"| {lab} | {r['completed']}/{r['failed']} | {f(r['mean_ttft_ms'])} | {f(r['median_ttft_ms'])} | "
          f"{f(r.get('p90_ttft_ms'))} | {f(r['p99_ttft_ms'])} | {f(r.get('mean_itl_ms'))} | {f(r.get('median_itl_ms'))} | "
          f"{f(r['mean_tpot_ms'])} | {f(r['mean_e2el_ms'])} | {f(r['output_throughput'])} | "
          f"{f(r['request_throughput'])} | {f(r['ar_s_rank'], '{:.4f}')} | "
          f"{f(None if r['ar_prefill_share'] is None else 100 * r['ar_prefill_share'], '{:.1f}%')} |")

def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b

print(f"\nRatios {base}/other (> 1: the other mode is faster for latency, < 1 for throughput):\n")
print("| condition | vs | TTFT mean | TTFT p50 | TTFT p90 | TTFT p99 | ITL mean | out tok/s |")
print("|---|---|---|---|---|---|---|---|")
for lab, r in rows.items():
    mode, _, cond = lab.partition("+")
    if mode == base:
        continue
    b = rows.get(base + ("+" + cond if cond else ""))
    if not b:
        continue
    print(f"| {cond or 'quiet'} | {mode} | {f(ratio(b['mean_ttft_ms'], r['mean_ttft_ms']))} | "
          f"{f(ratio(b['median_ttft_ms'], r['median_ttft_ms']))} | {f(ratio(b.get('p90_ttft_ms'), r.get('p90_ttft_ms')))} | "
          f"{f(ratio(b['p99_ttft_ms'], r['p99_ttft_ms']))} | {f(ratio(b.get('mean_itl_ms'), r.get('mean_itl_ms')))} | "
          f"{f(ratio(b['output_throughput'], r['output_throughput']))} |")
print("\nAR s/rank: echo:allreduce_seconds_total / tp over the workload; AR share of prefill: the same over a"
      " prefill-only probe (max_tokens 1, one request at a time) / echo:request_prefill_time_seconds_sum.")
EOF

if [ $plot -eq 1 ] && [ ${#labels[@]} -gt 0 ]; then
  files=()
  for l in "${labels[@]}"; do [ -f "$out/$l.json" ] && files+=("$out/$l.json"); done
  [ ${#files[@]} -gt 0 ] && { "$bench" plot "${files[@]}" -o "$out/ttft-cdf.png" || echo "ttft-ab: plot failed" >&2; }
fi
exit $status
