#!/usr/bin/env bash
# The prepared GPU check: build with the cuda backend (and list ptxas's
# registers, shared memory and spills per kernel); compare every op on
# cuda against cpu (gpu_test_cuda_ops); the Echo all-reduce on device memory
# against the host path, bit for bit, and the codec's GB/s beside the copy
# bandwidth (gpu_test_cuda_comm); every fixture model through the engine on
# cuda vs cpu at tp 1, 2 and 4 (gpu_test_cuda_model: several ranks share the
# one GPU through the local device transport); greedy generation through the
# CLI, cuda vs cpu; then benchmark the engine on a Qwen3-8B-shaped random
# model generated in GPU memory (echo-bench forward --model random:qwen3-8b:
# the matmul peak, prefill tok/s and TFLOP/s, decode tok/s beside the
# copy-bandwidth roofline, TTFT of a 2048-token prompt), and its decode
# batches once more through CUDA graphs (--cuda-graphs), graph vs eager
# tok/s side by side); on a machine with >= 2 GPUs also Echo vs NCCL's bf16
# all-reduce (echo-bench allreduce --transport nccl).
# Made to run on a lent GPU machine (no package registry there): the Debian
# -dev packages travel as .deb files in .gpu-debs/ (tests/gpu/fetch-debs.sh)
# and are unpacked with `dpkg -x` into a private prefix; nothing is
# installed system-wide.
#
#   tests/gpu/run.sh               everything
#   tests/gpu/run.sh --build-only  unpack + build, then stop
#
# Environment: OUT (results; default /tmp/echo-gpu-out), LOGS (see below), JOBS (make -j, 16),
# GPU_BUILD (build folder, default build/gpu: a separate one, so objects built
# elsewhere with other flags are never reused), CUDA_HOME (/usr/local/cuda),
# GPU_PREFIX (where the debs are unpacked; default a fresh mktemp folder),
# GPU_CHECK_DEVICE (default cuda; "cpu" dry-runs every step of this script
# on a machine without a GPU: the op test with --self-check, generation on
# cpu twice, the benchmark on a tiny random model), FORWARD_BENCH (0 skips
# the benchmark), FWD_LAYERS (layers of the benchmark model, default 36),
# T_OPS / T_COMM / T_MODEL / T_GEN (per-step time limits in seconds: 180,
# 150, 180, 60 per generation; a step past its limit is a FAIL row saying
# so, and the next steps still run).
#
# What lands in $OUT: three files, since a device call brings back at most
# 8 (see the device tool's README):
#   rows.txt     the summary's rows as each step ends (what a cut-short run
#                leaves)
#   summary.txt  the table, written last
#   logs.tgz     every log, packed again after each row, so a run cut short
#                still brings back the logs of the steps it finished:
#                env.log build.log resources.log ops.log comm.log comm.json model.log
#                gen.log forward.log forward.json forward-graphs.json
#                allreduce.json (`tar -xzf logs.tgz`)
# The logs themselves are written to LOGS (default: a fresh mktemp folder
# outside $OUT), whose path the summary names.
# The summary table is printed last. Exit status: 0 when nothing failed
# (steps skipped for want of a GPU count as skipped, not failed), else 1.
set -euo pipefail

cd "$(dirname "$0")/../.."
BUILD_ONLY=0
[ "${1:-}" = "--build-only" ] && BUILD_ONLY=1
OUT="${OUT:-/tmp/echo-gpu-out}"
JOBS="${JOBS:-16}"
GPU_BUILD="${GPU_BUILD:-build/gpu}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
PREFIX="${GPU_PREFIX:-$(mktemp -d /tmp/echo-gpu-prefix.XXXXXX)}"
MA=x86_64-linux-gnu
DEV="${GPU_CHECK_DEVICE:-cuda}"
OPS_ARGS=()
[ "$DEV" = cpu ] && OPS_ARGS=(--self-check)
LOGS="${LOGS:-$(mktemp -d /tmp/echo-gpu-logs.XXXXXX)}"
mkdir -p "$OUT" "$PREFIX" "$LOGS"
PREFIX="$(cd "$PREFIX" && pwd)"
: >"$LOGS/env.log"
: >"$LOGS/gen.log"
rm -f "$OUT/rows.txt" "$OUT/summary.txt" "$OUT/logs.tgz" "$LOGS/build.log" "$LOGS/ops.log" "$LOGS/comm.log" \
  "$LOGS/comm.json" "$LOGS/model.log"
# Pack the logs into $OUT/logs.tgz (written beside, then renamed, so a kill
# mid-pack leaves the previous archive whole).
pack_logs() {
  tar -czf "$OUT/.logs.tgz.new" -C "$LOGS" . 2>/dev/null && mv -f "$OUT/.logs.tgz.new" "$OUT/logs.tgz"
  return 0
}

SUMMARY=()
FAILED=0
row() { # step result detail
  SUMMARY+=("$(printf '%-34s %-6s %s' "$1" "$2" "$3")")
  # also as they come, so a run cut short by the device call's limit still
  # brings back the rows of the steps it finished
  printf '%-34s %-6s %s\n' "$1" "$2" "$3" >>"$OUT/rows.txt"
  pack_logs
  [ "$2" = FAIL ] && FAILED=1
  return 0
}
finish() {
  {
    echo
    echo "== summary (logs in $LOGS, packed in $OUT/logs.tgz)"
    printf '%-34s %-6s %s\n' step result detail
    for r in "${SUMMARY[@]}"; do echo "$r"; done
  } | tee "$OUT/summary.txt"
  pack_logs
  exit "$FAILED"
}
log_env() { echo "$*" >>"$LOGS/env.log"; }

# ---- 1. the Debian packages, unpacked into a private prefix ----
if ls .gpu-debs/*.deb >/dev/null 2>&1; then
  for f in .gpu-debs/*.deb; do dpkg -x "$f" "$PREFIX"; done
  # the .pc files say prefix=/usr: point them into the prefix
  find "$PREFIX" -name '*.pc' -print0 | xargs -0 -r sed -i -e "s|=/usr|=$PREFIX/usr|g" \
    -e "s|-I/usr/|-I$PREFIX/usr/|g" -e "s|-L/usr/|-L$PREFIX/usr/|g"
  # Fill gaps only: a library whose soname the machine already has becomes
  # a link to the machine's copy, so the carried packages (a dependency
  # closure, see fetch-debs.sh) never shadow the system's own libraries.
  # Debian 12 still ships some libraries under /lib: move them beside the rest.
  if [ -d "$PREFIX/lib/$MA" ]; then
    mkdir -p "$PREFIX/usr/lib/$MA"
    cp -a "$PREFIX/lib/$MA"/. "$PREFIX/usr/lib/$MA"/ && rm -rf "$PREFIX/lib/$MA"
  fi
  kept=0 linked=0
  ldconfig -p >"$PREFIX/ldcache.txt" 2>/dev/null || : >"$PREFIX/ldcache.txt"
  while IFS= read -r f; do
    so=$(basename "$f")
    sys=$(awk -v so="$so" '$1 == so && /x86-64/ && !found {print $NF; found = 1}' "$PREFIX/ldcache.txt")
    if [ -n "$sys" ] && [ -e "$sys" ]; then
      ln -sf "$sys" "$f"
      linked=$((linked + 1))
    else
      kept=$((kept + 1))
    fi
  done < <(find "$PREFIX/usr/lib/$MA" -maxdepth 1 -name 'lib*.so.[0-9]*' ! -name '*.so.*.*' 2>/dev/null)
  log_env "carried libraries: $kept kept (missing here), $linked linked to the system's copy"
  export CPATH="$PREFIX/usr/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$PREFIX/usr/lib/$MA${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$PREFIX/usr/lib/$MA${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_PATH="$PREFIX/usr/lib/$MA/pkgconfig:$PREFIX/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  # keep the prefix's -I/-L in pkg-config's output even though they are in
  # CPATH/LIBRARY_PATH: an explicit -L beats the system's own copies
  export PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
  command -v pkg-config >/dev/null || export PATH="$PATH:$PREFIX/usr/bin"
  row "unpack .gpu-debs" ok "$(ls -1 .gpu-debs/*.deb | wc -l) packages; $kept libraries missing here kept, $linked linked to the system's"
else
  row "unpack .gpu-debs" skip "no .gpu-debs/*.deb: using the system's packages"
fi

# ---- 2. CUDA libraries: the toolkit's, else a pip wheel's (nvidia-*) ----
# The link needs libcublasLt.so, libnccl.so and libcudart.so by these names.
cuda_lib() { # name -> 0 when the linker can find lib<name>.so
  local d
  for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" /usr/lib/$MA /usr/lib64 /usr/local/lib; do
    [ -e "$d/lib$1.so" ] && return 0
  done
  local f="" sp
  for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    f=$(find "$sp/nvidia" -name "lib$1.so*" 2>/dev/null | sort | head -1)
    [ -n "$f" ] && break
  done
  [ -z "$f" ] && return 1
  mkdir -p "$PREFIX/cudalib"
  ln -sf "$f" "$PREFIX/cudalib/lib$1.so"
  local inc
  inc="$(dirname "$(dirname "$f")")/include"
  [ -d "$inc" ] && export CPATH="${CPATH:+$CPATH:}$inc"
  export LIBRARY_PATH="$PREFIX/cudalib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$(dirname "$f"):$PREFIX/cudalib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  log_env "lib$1.so from a wheel: $f"
  return 0
}
for l in cudart cublasLt nccl; do
  cuda_lib "$l" || row "cuda library lib$l.so" FAIL "not in $CUDA_HOME/lib64 nor a pip wheel"
done

{
  echo "date: $(date -u)"
  echo "host: $(uname -a)"
  echo "CUDA_HOME=$CUDA_HOME PREFIX=$PREFIX"
  echo "CPATH=${CPATH:-}"
  echo "LIBRARY_PATH=${LIBRARY_PATH:-}"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  echo "PKG_CONFIG_PATH=${PKG_CONFIG_PATH:-}"
  echo "pkg-config: $(command -v pkg-config || echo none)"
  echo "pkg-config --cflags --libs jansson libpcre2-8 libutf8proc: $(pkg-config --cflags --libs jansson libpcre2-8 libutf8proc 2>&1 || true)"
  echo "nvcc: $("$CUDA_HOME/bin/nvcc" --version 2>&1 | tail -1 || true)"
  command -v nvidia-smi >/dev/null && nvidia-smi 2>&1 || echo "nvidia-smi: not found"
} >>"$LOGS/env.log" 2>&1

# ---- 3. build (keep going past one broken target, report what was built) ----
GEN="$GPU_BUILD/bin/echo-generate"
# Per-step limits (seconds): a hang in one step is reported as such and the
# later steps still run, inside the device call's own limit.
T_OPS="${T_OPS:-180}" T_COMM="${T_COMM:-150}" T_MODEL="${T_MODEL:-180}" T_GEN="${T_GEN:-60}"
OPS="$GPU_BUILD/tests/gpu_test_cuda_ops"
COMM="$GPU_BUILD/tests/gpu_test_cuda_comm"
MODEL="$GPU_BUILD/tests/gpu_test_cuda_model"
rm -f "$GEN" "$OPS" "$COMM" "$MODEL"
set +e
make -k -j"$JOBS" CUDA=1 CUDA_HOME="$CUDA_HOME" BUILD="$GPU_BUILD" BIN="$GPU_BUILD/bin" all "$OPS" "$COMM" "$MODEL" \
  >"$LOGS/build.log" 2>&1
brc=$?
set -e
nwarn=$(grep -c -i 'warning' "$LOGS/build.log" || true)
if [ $brc -eq 0 ]; then
  row "build (CUDA=1, -Werror)" ok "$nwarn warning lines; $GPU_BUILD"
else
  row "build (CUDA=1, -Werror)" FAIL "make exit $brc; see build.log: $(grep -m1 -E 'error|Error' "$LOGS/build.log" | cut -c1-120)"
fi
# registers, shared memory and spills per kernel, as ptxas gives them
set +e
timeout 120 make -s CUDA=1 CUDA_HOME="$CUDA_HOME" NVCC="$CUDA_HOME/bin/nvcc" check-cuda-resources \
  >"$LOGS/resources.log" 2>&1
rrc=$?
set -e
if [ $rrc -eq 0 ]; then
  row "kernel resources (ptxas)" ok "$(tail -1 "$LOGS/resources.log" | sed 's/^resources: //' | cut -c1-110)"
elif grep -q '^FAIL' "$LOGS/resources.log"; then
  row "kernel resources (ptxas)" FAIL "$(grep -m1 -A1 '^FAIL' "$LOGS/resources.log" | tail -1 | cut -c1-110)"
else
  row "kernel resources (ptxas)" FAIL "exit $rrc: $(tail -1 "$LOGS/resources.log" | cut -c1-100)"
fi
if [ $BUILD_ONLY -eq 1 ]; then
  for b in "$OPS" "$COMM" "$MODEL" "$GEN"; do
    [ -x "$b" ] && row "built $(basename "$b")" ok "" || row "built $(basename "$b")" FAIL "missing"
  done
  finish
fi

# ---- 4. every op: cuda vs cpu ----
HAVE_GPU=0
if [ -x "$OPS" ]; then
  set +e
  timeout -k 10 "$T_OPS" "$OPS" "${OPS_ARGS[@]}" --bench >"$LOGS/ops.log" 2>&1
  orc=$?
  set -e
  npass=$(grep -c ' PASS' "$LOGS/ops.log" || true)
  nfail=$(grep -c ' FAIL' "$LOGS/ops.log" || true)
  case $orc in
  0) HAVE_GPU=1; row "ops cuda vs cpu" ok "$npass passed" ;;
  77) row "ops cuda vs cpu" skip "$(head -1 "$LOGS/ops.log" | cut -c1-100)" ;;
  124 | 137) HAVE_GPU=1; row "ops cuda vs cpu" FAIL "timed out after $T_OPS s (a hang?), $npass passed; last line: $(tail -1 "$LOGS/ops.log" | cut -c1-70)" ;;
  *) HAVE_GPU=1; row "ops cuda vs cpu" FAIL "exit $orc, $npass passed, $nfail failed: $(grep -m1 ' FAIL' "$LOGS/ops.log" | cut -c1-90)" ;;
  esac
  # attention timing (--bench): "bench attention [cuda] prefill 8192 tokens, ...: X ms Y TFLOP/s"
  while IFS='|' read -r what detail; do
    row "attn $what" info "$(echo $detail)"
  done < <(grep '^bench attention' "$LOGS/ops.log" | sed -e 's/^bench attention \[[a-z]*\] //' \
    -e 's/, hq [0-9]* hkv [0-9]* hd [0-9]*//' -e 's/: */|/' | cut -c1-120)
  cat "$LOGS/ops.log"
else
  row "ops cuda vs cpu" FAIL "$OPS was not built"
fi

# ---- 4b. Echo on device memory: bit-exact vs the host path; codec GB/s ----
# A program's lines with " PASS"/" FAIL" are counted; "bench:" lines go to the summary.
gpu_prog() { # label seconds binary log [args...] -> rows
  local label=$1 limit=$2 bin=$3 log=$4
  shift 4
  if [ ! -x "$bin" ]; then
    row "$label" FAIL "$(basename "$bin") was not built"
    return 0
  fi
  set +e
  timeout -k 10 "$limit" "$bin" "$@" >"$log" 2>&1
  local rc=$?
  set -e
  local np nf
  np=$(grep -c ' PASS' "$log" || true)
  nf=$(grep -c ' FAIL' "$log" || true)
  case $rc in
  0) row "$label" ok "$np passed" ;;
  77) row "$label" skip "$(head -1 "$log" | cut -c1-100)" ;;
  124 | 137) row "$label" FAIL "timed out after $limit s (a hang?), $np passed; last line: $(tail -1 "$log" | cut -c1-70)" ;;
  *) row "$label" FAIL "exit $rc, $np passed, $nf failed: $(grep -m1 ' FAIL' "$log" | cut -c1-90)" ;;
  esac
  return 0
}
SELF=()
[ "$DEV" = cpu ] && SELF=(--self-check)
gpu_prog "echo comm device vs host (bit-exact)" "$T_COMM" "$COMM" "$LOGS/comm.log" "${SELF[@]}" --json "$LOGS/comm.json"
# "bench: KERNEL bf16 MB MB G=g T us X GB/s  copy C GB/s  P % of copy (goal >= 80 %)"
while IFS='|' read -r what detail; do row "codec $what" info "$detail"; done < <(awk '$1 == "bench:" {
  printf "%s %s MB|%s GB/s = %s %% of copy (%s GB/s; goal 80 %%)\n", $2, $4, $9, $14, $12 }' "$LOGS/comm.log" 2>/dev/null)
cat "$LOGS/comm.log" 2>/dev/null || true

# ---- 4c. every fixture through the engine: cuda vs cpu at tp 1, 2, 4 ----
gpu_prog "models cuda vs cpu (tp 1/2/4)" "$T_MODEL" "$MODEL" "$LOGS/model.log" "${SELF[@]}"
for tp in 1 2 4; do
  w=$(awk -v tp="$tp" '$2 == "tp" && $3 == tp && / exact vs cpu / {sub("rel_err=", "", $8); if ($8 + 0 > m) m = $8 + 0} END {printf "%.2e", m}' "$LOGS/model.log" 2>/dev/null)
  [ -s "$LOGS/model.log" ] && row "  worst logits rel err, tp $tp" info "$w (limit max(2e-2, the fixture's bf16 yardstick))"
done
hf=$(grep -h 'greedy vs HF' "$LOGS/model.log" 2>/dev/null | awk '{print $1": "$7}' | paste -sd' ' | cut -c1-120)
[ -n "$hf" ] && row "  greedy tokens agreeing with HF" info "$hf"
# CUDA graphs (decode steps at tp 1): bits == eager, vs cpu, steps taken as graphs
gl=$(grep -hE ' tp 1 (graphs == eager|graphs vs cpu|graph steps)' "$LOGS/model.log" 2>/dev/null || true)
if [ -n "$gl" ]; then
  if grep -q 'skipped' <<<"$gl"; then
    row "  cuda graphs (decode, tp 1)" skip "no graphs on $DEV"
  else
    row "  cuda graphs (decode, tp 1)" info "$(grep -c 'PASS$' <<<"$gl" || true) passed, $(grep -c 'FAIL' <<<"$gl" || true) failed (bits == eager, vs cpu, steps as graphs)"
  fi
fi
cat "$LOGS/model.log" 2>/dev/null || true

# ---- 5. greedy generation through the CLI: cuda vs cpu, and cuda vs the HF reference ----
tokens_of() { sed -n 's/.*"tokens":\[\([^]]*\)\].*/\1/p' "$1"; }
agreement() { # list_a list_b -> "k/n" and the first differing index (or -)
  local -a A B
  IFS=, read -ra A <<<"$1"
  IFS=, read -ra B <<<"$2"
  local n=${#B[@]} k=0 first=- i
  [ ${#A[@]} -gt "$n" ] && n=${#A[@]}
  for ((i = 0; i < n; i++)); do
    if [ "${A[i]:-x}" = "${B[i]:-y}" ]; then k=$((k + 1)); elif [ "$first" = - ]; then first=$i; fi
  done
  echo "$k/$n $first"
}
# One rank here: tensor parallelism on the device is checked by step 4c.
gen() { # model device prompt max out -> exit status
  timeout -k 5 "$T_GEN" "$GEN" --model "$1" --prompt-tokens "$3" --max-tokens "$4" --temperature 0 --ignore-eos --json \
    --device "$2" --tp 1 >"$5" 2>"$5.err" </dev/null
}
TMPD=$(mktemp -d /tmp/echo-gpu-gen.XXXXXX)
if [ ! -x "$GEN" ]; then
  row "generate" FAIL "$GEN was not built"
elif [ $HAVE_GPU -eq 0 ]; then
  echo "no GPU: skipped" | tee -a "$LOGS/gen.log"
  row "generate cuda vs cpu" skip "no GPU: skipped"
else
  # prompt 1,2,3, 16 greedy tokens per fixture, cpu vs cuda; one summary row
  same=0 total=0 failed="" differ=""
  for dir in tests/fixtures/models/*/; do
    [ -f "$dir/config.json" ] || continue
    m=$(basename "$dir")
    total=$((total + 1))
    okc=0 okg=0
    gen "$dir" cpu 1,2,3 16 "$TMPD/cpu.json" && okc=1
    gen "$dir" "$DEV" 1,2,3 16 "$TMPD/cuda.json" && okg=1
    {
      echo "== $m prompt 1,2,3"
      echo "cpu:  $(cat "$TMPD/cpu.json" "$TMPD/cpu.json.err")"
      echo "cuda: $(cat "$TMPD/cuda.json" "$TMPD/cuda.json.err")"
    } >>"$LOGS/gen.log"
    if [ $okc -eq 0 ] || [ $okg -eq 0 ]; then
      failed="$failed $m($([ $okc -eq 0 ] && echo cpu || echo cuda): $(cat "$TMPD"/*.err | head -1 | cut -c1-60))"
    else
      read -r ag first <<<"$(agreement "$(tokens_of "$TMPD/cuda.json")" "$(tokens_of "$TMPD/cpu.json")")"
      if [ "$first" = - ]; then same=$((same + 1)); else differ="$differ $m:$ag"; fi
    fi
  done
  if [ -n "$failed" ]; then
    row "echo-generate cuda~cpu (greedy)" FAIL "$(echo "runs failed:$failed" | cut -c1-110)"
  else
    row "echo-generate cuda~cpu (greedy)" "$([ -z "$differ" ] && echo ok || echo differ)" \
      "$same/$total fixtures identical over 16 tokens${differ:+; agreeing tokens:$differ}"
  fi
fi
rm -rf "$TMPD"

# ---- 6. engine benchmark: a Qwen3-8B-shaped random model at tp 1 ----
# docs/bench-forward.md. The weights are generated in GPU memory (--model
# random:qwen3-8b: kern_ops.random_weight, no file is written or read), so
# the whole 36-layer model costs seconds. On DEV=cpu the same steps run on
# the tiny shape.
BENCH="$GPU_BUILD/bin/echo-bench"
: >"$LOGS/forward.log"
rm -f "$LOGS/forward.json"
fwd_rows() { # forward.json label -> "step|detail" lines for row()
  python3 - "$1" "$2" <<'PY'
import json, sys
d, lab = json.load(open(sys.argv[1])), sys.argv[2]
p, dd = d["prefill"], d["decode"]
if "gemm_peak_tflops" in d:
    print(f"fwd {lab} matmul peak|{d['gemm_peak_tflops']:.1f} TFLOP/s ({d['gemm_dim']}^3 through ops->matmul)")
print(f"fwd {lab} prefill tok/s (TFLOP/s, % peak)|" + ", ".join(
    f"{r['tokens']}: {r['tokens_per_s']:.0f} ({r['tflops']:.1f}, {r.get('gemm_peak_pct', 0):.0f}%)" for r in p))
print(f"fwd {lab} decode tok/s (% roof)|" + ", ".join(f"B={r['batch']}: {r['tokens_per_s']:.0f} ({r['roofline_pct']:.0f}%)" for r in dd)
      + f"; copy {d['copy_gbps']:.0f} GB/s, {d['weight_bytes_read_per_step'] / 1e9:.2f} GB/step")
if "ttft" in d:
    print(f"fwd {lab} TTFT {d['ttft']['tokens']} tokens|{d['ttft']['ms']:.1f} ms; load {d['load_s']:.1f} s"
          + ("" if d["logits_finite"] else "; NON-FINITE LOGITS"))
PY
}
if [ "${FORWARD_BENCH:-1}" = 0 ]; then
  row "forward benchmark" skip "FORWARD_BENCH=0"
elif [ ! -x "$BENCH" ]; then
  row "forward benchmark" FAIL "$BENCH was not built"
elif [ $HAVE_GPU -eq 0 ] && [ "$DEV" != cpu ]; then
  row "forward benchmark" skip "no GPU: skipped"
else
  layers=${FWD_LAYERS:-36}
  model="random:qwen3-8b,layers=$layers" label=8b
  [ "$layers" = 36 ] || label="8b-$layers/36L"
  fwd_args=(--prefill 512,2048,8192 --decode-batch 1,16,64 --decode-steps 32 --ttft-len 2048 --iters 2)
  if [ "$DEV" = cpu ]; then
    model=random:tiny label=tiny
    fwd_args=(--prefill 16,64 --decode-batch 1,4 --decode-steps 4 --ttft-len 32 --iters 2 --copy-bytes 64M --gemm-dim 256)
  fi
  set +e
  timeout 300 "$BENCH" forward --device "$DEV" --tp 1 --model "$model" --json "${fwd_args[@]}" \
    >"$LOGS/forward.json" 2>>"$LOGS/forward.log"
  frc=$?
  set -e
  if [ $frc -ne 0 ]; then
    row "fwd $label" FAIL "exit $frc: $(tail -1 "$LOGS/forward.log" | cut -c1-100)"
  elif ! command -v python3 >/dev/null; then
    row "fwd $label" ok "no python3 to summarise: see forward.json"
  else
    while IFS='|' read -r step detail; do row "$step" ok "$detail"; done < <(fwd_rows "$LOGS/forward.json" "$label")
  fi
  cat "$LOGS/forward.json"

  # The decode batches again through CUDA graphs (recorded once per batch
  # size, then replayed). --prefill keeps the eager run's longest prompt, so
  # the table capacity (max_model_len, which sets the attention's decode
  # split) is the same in both runs; TTFT and the matmul peak are skipped.
  rm -f "$LOGS/forward-graphs.json"
  gfwd_args=(--prefill 8192 --decode-batch 1,16,64 --decode-steps 32 --ttft-len 0 --iters 1 --gemm-dim 0)
  [ "$DEV" = cpu ] && gfwd_args=(--prefill 64 --decode-batch 1,4 --decode-steps 4 --ttft-len 0 --iters 1 \
    --copy-bytes 64M --gemm-dim 0)
  set +e
  timeout 240 "$BENCH" forward --device "$DEV" --tp 1 --model "$model" --json --cuda-graphs "${gfwd_args[@]}" \
    >"$LOGS/forward-graphs.json" 2>>"$LOGS/forward.log"
  grc=$?
  set -e
  if [ $grc -ne 0 ]; then
    row "fwd $label decode graphs" FAIL "exit $grc: $(tail -1 "$LOGS/forward.log" | cut -c1-100)"
  elif [ $frc -ne 0 ] || ! command -v python3 >/dev/null; then
    row "fwd $label decode graphs" ok "see forward-graphs.json"
  else
    while IFS='|' read -r step result detail; do row "$step" "$result" "$detail"; done < <(
      python3 - "$LOGS/forward.json" "$LOGS/forward-graphs.json" "$label" <<'PY'
import json, sys
e, g, lab = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
ed = {r["batch"]: r for r in e["decode"]}
if not g.get("cuda_graphs"):
    print(f"fwd {lab} decode graphs|skip|graphs not available on {g['device']} (flag is a no-op)")
    sys.exit(0)
cells = []
for r in g["decode"]:
    b, gt = r["batch"], r["tokens_per_s"]
    et = ed[b]["tokens_per_s"] if b in ed else float("nan")
    cells.append(f"B={b}: {gt:.0f} vs {et:.0f} ({gt / et:.2f}x)")
res = "ok" if g["logits_finite"] and g.get("graph_steps", 0) > 0 else "FAIL"
print(f"fwd {lab} decode tok/s graphs vs eager|{res}|" + ", ".join(cells)
      + f"; {g.get('graph_steps', 0)} steps as graphs" + ("" if g["logits_finite"] else "; NON-FINITE LOGITS"))
PY
    )
  fi
  cat "$LOGS/forward-graphs.json"
fi

# ---- 7. Echo vs NCCL's bf16 all-reduce (needs >= 2 GPUs: rank r on GPU r) ----
# The published comparison (2.09x at 1 GB on A100). A one-GPU machine skips
# it; on more, up to 8 ranks, exact (NCCL) and echo at 1 MB .. 1 GB.
rm -f "$LOGS/allreduce.json"
ngpu=0
command -v nvidia-smi >/dev/null && ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "$DEV" = cpu ]; then
  row "allreduce nccl echo vs exact" skip "GPU_CHECK_DEVICE=cpu"
elif [ "$ngpu" -lt 2 ]; then
  row "allreduce nccl echo vs exact" skip "needs >= 2 GPUs, $ngpu visible"
else
  nr=$((ngpu > 8 ? 8 : ngpu))
  set +e
  timeout 240 "$BENCH" allreduce --transport nccl --ranks "$nr" --algo exact,echo --min-bytes 1M --max-bytes 1G \
    --iters 5 --json >"$LOGS/allreduce.json" 2>>"$LOGS/forward.log"
  arc=$?
  set -e
  if [ $arc -ne 0 ]; then
    row "allreduce nccl echo vs exact" FAIL "exit $arc: $(tail -1 "$LOGS/forward.log" | cut -c1-100)"
  else
    row "allreduce nccl echo vs exact" ok "$(python3 - "$LOGS/allreduce.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
t = {(r["algo"], r["bytes"]): r for r in rows}
cells = []
for b in sorted({r["bytes"] for r in rows}):
    if b in (1 << 20, 1 << 24, 1 << 28, 1 << 30) and ("exact", b) in t and ("echo", b) in t:
        cells.append(f"{b >> 20} MB: {t[('exact', b)]['time_us'] / t[('echo', b)]['time_us']:.2f}x")
print(f"{rows[0]['ranks']} ranks, echo speed-up over NCCL bf16: " + ", ".join(cells))
PY
)"
  fi
fi
finish
