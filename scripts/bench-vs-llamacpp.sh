#!/usr/bin/env bash
# echo vs llama.cpp on one machine: the same model (Qwen3-0.6B shape, random
# bf16 weights), the same GGUF files (bf16 and Q8_0), the same thread counts,
# prefill of PREFILL tokens and batch-1 decode, in one run. Each repetition
# runs every (format, threads) pair with echo and llama.cpp back to back, so
# both see the same machine load; the summary gives medians and the spread.
# Format q8_0-a8 is the Q8_0 file with echo's --act-quant q8_0 (8-bit
# activations in integers, what llama.cpp always does for Q8_0); q8_0 is
# echo's exact path there (--act-quant none: the dequantized weights' bits).
# The smollm2-* formats are the trained SmolLM2-135M-Instruct that `make
# serve` serves (build/models, scripts/fetch-model.sh): smollm2-q4_1 the file
# itself with echo's default (--act-quant auto: the integer kernels),
# smollm2-q4_1-exact the same file on echo's exact path; smollm2-q4_k
# (or -q4_k_m: llama-quantize's Q4_K_M), smollm2-q5_k (or -q5_k_m: Q5_K_M),
# smollm2-q5_0, smollm2-q5_1, smollm2-q6_k and smollm2-q8_0 are copies of
# that file made by
# llama-quantize from its F32 dequantization ($QUANTIZE, default
# $LLAMACPP_DIR/build/bin/llama-quantize; below), each with echo's default;
# a -exact suffix runs any of them with --act-quant none.
# docs/bench-forward.md has the results and what the columns mean.
#
#   scripts/bench-vs-llamacpp.sh                    # everything, defaults below
#   REPS=5 THREADS="2" FORMATS=q8_0 scripts/bench-vs-llamacpp.sh
#
# Environment (defaults):
#   LLAMACPP_DIR  build/llamacpp   llama.cpp sdist, build and models are cached here
#   LLAMACPP_VERSION 0.3.36        llama-cpp-python sdist that vendors llama.cpp
#   ECHO_BENCH    bin/echo-bench
#   THREADS       "1 2"            FORMATS "bf16 q8_0 q8_0-a8" (and smollm2-q4_1, -q4_1-exact, -q4_k,
#                                  -q5_k, -q5_0, -q5_1, -q6_k, -q8_0, each also with -exact; the
#                                  Qwen3 shape's q4_k_m, q5_k_m, q6_k: llama-quantize from its bf16
#                                  file, echo's default, -exact for --act-quant none)
#   The issue-48 matrix: FORMATS="smollm2-q4_k_m smollm2-q5_k_m smollm2-q6_k smollm2-q8_0
#                                  q4_k_m q5_k_m q6_k q8_0-a8"
#   PYTHON        build/venv-clients/bin/python if there, else python3: has the gguf package
#   SMOLLM2       build/models/SmolLM2-135M-Instruct.Q4_1.gguf
#   LLAMA_BIN     $LLAMACPP_DIR/build/bin   llama-bench (and llama-quantize) already built elsewhere
#   WORK          $LLAMACPP_DIR   where the runs' scratch files and SmolLM2's copies ($WORK/models) go
#   PREFILL       512              tokens of the prefill run
#   DECODE        64               decode steps (llama-bench -n), batch 1
#   REPS          3                repetitions of the whole grid
#   LAYERS        (all 28)         fewer layers for a quick look
#   OUT           $LLAMACPP_DIR/results.jsonl   raw results, one JSON per run
#   REPACK        1                llama-bench --repack (its AMX/AVX-512 weight repacking); when a
#                                  run with 1 fails (ggml's AMX matmul crashes on some VMs) the
#                                  script says so and goes on with 0
# Needs: python3 with numpy, torch, transformers, sentencepiece (the GGUF
# converter), cmake and a C++ compiler, pip (to fetch the sdist once).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LLAMACPP_DIR=${LLAMACPP_DIR:-$ROOT/build/llamacpp}
mkdir -p "$LLAMACPP_DIR"
LLAMACPP_DIR=$(cd "$LLAMACPP_DIR" && pwd) # the runs cd into $WORK: no relative paths
LLAMACPP_VERSION=${LLAMACPP_VERSION:-0.3.36}
ECHO_BENCH=${ECHO_BENCH:-$ROOT/bin/echo-bench}
THREADS=${THREADS:-"1 2"}
FORMATS=${FORMATS:-"bf16 q8_0 q8_0-a8"}
PREFILL=${PREFILL:-512}
DECODE=${DECODE:-64}
REPS=${REPS:-3}
LAYERS=${LAYERS:-}
OUT=${OUT:-${WORK:-$LLAMACPP_DIR}/results.jsonl}
REPACK=${REPACK:-1}
SMOLLM2=${SMOLLM2:-$ROOT/build/models/SmolLM2-135M-Instruct.Q4_1.gguf}
QUANTIZE=${QUANTIZE:-${LLAMA_BIN:-$LLAMACPP_DIR/build/bin}/llama-quantize}
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    [ -x "$ROOT/build/venv-clients/bin/python" ] && PYTHON=$ROOT/build/venv-clients/bin/python
fi

mkdir -p "$LLAMACPP_DIR"
WORK=${WORK:-$LLAMACPP_DIR}
mkdir -p "$WORK"
# the runs cd into LLAMACPP_DIR: relative paths are the caller's
WORK=$(cd "$WORK" && pwd)
case $OUT in /*) ;; *) mkdir -p "$(dirname "$OUT")"; OUT=$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT") ;; esac
SRC=$LLAMACPP_DIR/llama_cpp_python-$LLAMACPP_VERSION/vendor/llama.cpp
LLAMA_BIN=${LLAMA_BIN:-$LLAMACPP_DIR/build/bin}
BENCH=$LLAMA_BIN/llama-bench

# ---- llama.cpp: llama-bench from the llama-cpp-python sdist (cached) ----
if [ ! -x "$BENCH" ]; then
    if [ ! -d "$SRC" ]; then
        pip download "llama-cpp-python==$LLAMACPP_VERSION" --no-deps --no-binary :all: -d "$LLAMACPP_DIR"
        (cd "$LLAMACPP_DIR" && tar xzf "llama_cpp_python-$LLAMACPP_VERSION.tar.gz")
    fi
    cd "$LLAMACPP_DIR"
    cmake -S "$SRC" -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF \
        -DBUILD_SHARED_LIBS=OFF >cmake.log
    cmake --build build -j"$(nproc)" --target llama-bench >build.log
fi

# ---- the model: echo's random Qwen3-0.6B (bf16 safetensors), converted ----
NAME=qwen3-0.6b${LAYERS:+-l$LAYERS}
MODEL=$LLAMACPP_DIR/models/$NAME
QWEN_FORMATS=$(printf '%s\n' $FORMATS | grep -v '^smollm2-' || true)
if [ -n "$QWEN_FORMATS" ] && [ ! -f "$MODEL/config.json" ]; then
    "$ECHO_BENCH" randmodel --shape qwen3-0.6b ${LAYERS:+--layers $LAYERS} --out "$MODEL" --force
fi
# the converter wants a tokenizer; the weights are random, any Qwen3 vocabulary will do
[ -z "$QWEN_FORMATS" ] || cp -n "$ROOT/tests/fixtures/tokenizer/qwen3/tokenizer.json" "$ROOT/tests/fixtures/tokenizer/qwen3/tokenizer_config.json" \
    "$MODEL/"
qwen_convert() { # bf16 / q8_0: the converter's own output types
    [ -f "$MODEL-$1.gguf" ] && return
    PYTHONPATH=$SRC/gguf-py python3 "$SRC/convert_hf_to_gguf.py" "$MODEL" --outtype "$1" \
        --outfile "$MODEL-$1.gguf.tmp" >"$MODEL-$1.convert.log" 2>&1
    mv "$MODEL-$1.gguf.tmp" "$MODEL-$1.gguf"
}
for f in $(printf '%s\n' $QWEN_FORMATS | sed 's/-a8$//; s/-exact$//' | sort -u); do
    case $f in
    bf16 | q8_0) qwen_convert "$f" ;;
    *) # the K-quants (q4_k_m, q5_k_m, q6_k, ...): llama-quantize from the bf16 file
        [ -f "$MODEL-$f.gguf" ] && continue
        qwen_convert bf16
        "$QUANTIZE" "$MODEL-bf16.gguf" "$MODEL-$f.gguf.tmp" "$(echo "$f" | tr a-z A-Z)" >"$MODEL-$f.log" 2>&1 ||
            { tail -5 "$MODEL-$f.log" >&2; exit 1; }
        mv "$MODEL-$f.gguf.tmp" "$MODEL-$f.gguf"
        ;;
    esac
done

# ---- SmolLM2: the served file, and copies of it in other types ----
# A copy is made once (cached in $SMOL_OUT): the Q4_1 file dequantized to an
# F32 GGUF (scripts/gguf-dequantize.py, the gguf package: $PYTHON), then
# quantized to the type by llama-quantize, so every copy starts from the
# same values (those the served file holds) rather than from requantized
# blocks. SmolLM2's 576-wide rows are not whole 256-blocks, so llama-quantize
# stores those matrices in a fallback type (Q4_K_M: Q5_0, Q5_K_M: Q5_1,
# Q6_K: Q8_0): each copy's log lists the types it holds.
cd "$WORK"
SMOL_OUT=$WORK/models
smol_type() { # format -> llama-quantize type
    case $1 in
    smollm2-q4_k | smollm2-q4_k_m | smollm2-q4_k-exact | smollm2-q4_k_m-exact) echo Q4_K_M ;;
    smollm2-q5_k | smollm2-q5_k_m | smollm2-q5_k-exact | smollm2-q5_k_m-exact) echo Q5_K_M ;;
    *) echo "${1#smollm2-}" | sed 's/-exact$//' | tr a-z A-Z ;;
    esac
}
for f in $FORMATS; do
    case $f in
    smollm2-q4_1 | smollm2-q4_1-exact) ;;
    smollm2-*)
        q=$(smol_type "$f")
        dst=$SMOL_OUT/smollm2-$q.gguf
        [ -f "$dst" ] && continue
        mkdir -p "$SMOL_OUT"
        [ -x "$QUANTIZE" ] || { echo "bench-vs-llamacpp: $f needs llama-quantize ($QUANTIZE)" >&2; exit 1; }
        if [ ! -f "$SMOL_OUT/smollm2-f32.gguf" ]; then
            echo "# $f: dequantizing $SMOLLM2 to $SMOL_OUT/smollm2-f32.gguf" >&2
            "$PYTHON" "$ROOT/scripts/gguf-dequantize.py" "$SMOLLM2" "$SMOL_OUT/smollm2-f32.gguf.tmp"
            mv "$SMOL_OUT/smollm2-f32.gguf.tmp" "$SMOL_OUT/smollm2-f32.gguf"
        fi
        echo "# $f: llama-quantize $q -> $dst (log: $SMOL_OUT/smollm2-$q.log)" >&2
        "$QUANTIZE" "$SMOL_OUT/smollm2-f32.gguf" "$dst.tmp" "$q" >"$SMOL_OUT/smollm2-$q.log" 2>&1 ||
            { tail -5 "$SMOL_OUT/smollm2-$q.log" >&2; exit 1; }
        mv "$dst.tmp" "$dst"
        ;;
    esac
done
# The file and echo's --act-quant of a format.
gguf_of() {
    case $1 in
    smollm2-q4_1 | smollm2-q4_1-exact) echo "$SMOLLM2" ;;
    smollm2-*) echo "$SMOL_OUT/smollm2-$(smol_type "$1").gguf" ;;
    *) f=${1%-a8}; echo "$MODEL-${f%-exact}.gguf" ;;
    esac
}
act_of() {
    case $1 in
    *-a8) echo q8_0 ;;
    *-exact) echo none ;;
    smollm2-* | q[456]_k*) echo auto ;;
    *) echo none ;;
    esac
}

# ---- the runs ----
: >"$OUT"
echo "# $(date -u +%FT%TZ) $(uname -n): $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cpus;" \
    "llama.cpp $(cd "$SRC" && git describe --always 2>/dev/null || echo "from llama-cpp-python $LLAMACPP_VERSION")"
for rep in $(seq 1 "$REPS"); do
    for t in $THREADS; do
        for f in $FORMATS; do
            gguf=$(gguf_of "$f")
            act=$(act_of "$f")
            echo "# rep $rep: $f, $t thread(s): load $(cut -d' ' -f1 /proc/loadavg)" >&2
            "$ECHO_BENCH" forward --model "$gguf" --threads "$t" --prefill "$PREFILL" --decode-batch 1 \
                --decode-steps "$DECODE" --decode-prompt 1 --ttft-len 0 --iters 1 --gemm-dim 0 --copy-bytes 512M \
                --act-quant "$act" --json >echo.json
            if ! "$BENCH" -m "$gguf" -t "$t" -p "$PREFILL" -n "$DECODE" -r 1 --repack "$REPACK" -o json \
                >llama.json 2>llama.err; then
                [ "$REPACK" = 1 ] || { cat llama.err >&2; exit 1; }
                echo "# llama-bench --repack 1 failed; --repack 0 from now on" >&2
                REPACK=0
                "$BENCH" -m "$gguf" -t "$t" -p "$PREFILL" -n "$DECODE" -r 1 --repack 0 -o json >llama.json 2>llama.err
            fi
            python3 - "$rep" "$f" "$t" "$REPACK" >>"$OUT" <<'EOF'
import json, sys
rep, fmt, t, repack = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
e = json.load(open("echo.json"))
l = json.load(open("llama.json"))
lp = next(r["avg_ts"] for r in l if r["n_prompt"] > 0)
lg = next(r["avg_ts"] for r in l if r["n_gen"] > 0)
d = e["decode"][0]
print(json.dumps({"rep": int(rep), "format": fmt, "threads": t, "llama_repack": repack,
                  "echo_prefill": e["prefill"][0]["tokens_per_s"], "llama_prefill": lp,
                  "echo_decode": d["tokens_per_s"], "llama_decode": lg,
                  "read_gbps": e.get("read_gbps"), "fma_peak_gflops": e.get("fma_peak_gflops"),
                  "echo_roof_pct": d["roofline_pct"], "echo_fma_pct": e["prefill"][0].get("fma_peak_pct"),
                  "bytes_per_step": d["bytes_per_step"]}))
EOF
        done
    done
done

# ---- summary: medians over the repetitions, ratio spread in brackets ----
python3 - "$OUT" "$PREFILL" <<'EOF'
import json, statistics as st, sys
rows = [json.loads(x) for x in open(sys.argv[1])]
pre = sys.argv[2]
print(f"{'format':18} {'thr':>3} | {'echo pp'+pre:>11} {'llama pp'+pre:>12} {'ratio':>18} | {'echo tg':>8} "
      f"{'llama tg':>8} {'ratio':>18} | {'roof t/s':>8} {'echo %roof':>10} {'llama %roof':>11} {'echo %fma':>9}")
for fmt in dict.fromkeys(r["format"] for r in rows):
    for t in sorted({r["threads"] for r in rows if r["format"] == fmt}):
        g = [r for r in rows if r["format"] == fmt and r["threads"] == t]
        m = lambda k: st.median(r[k] for r in g)
        rp = [r["echo_prefill"] / r["llama_prefill"] for r in g]
        rd = [r["echo_decode"] / r["llama_decode"] for r in g]
        roof = [r["read_gbps"] * 1e9 / r["bytes_per_step"] for r in g]
        lroof = [100 * r["llama_decode"] / x for r, x in zip(g, roof)]
        print(f"{fmt:18} {t:>3} | {m('echo_prefill'):11.1f} {m('llama_prefill'):12.1f} "
              f"{st.median(rp):6.2f} [{min(rp):.2f}-{max(rp):.2f}] | {m('echo_decode'):8.2f} {m('llama_decode'):8.2f} "
              f"{st.median(rd):6.2f} [{min(rd):.2f}-{max(rd):.2f}] | {st.median(roof):8.2f} "
              f"{m('echo_roof_pct'):9.1f}% {st.median(lroof):10.1f}% {m('echo_fma_pct'):8.1f}%")
print(f"# {len(rows)} runs; ratio = echo / llama.cpp tokens/s (median [min-max] over repetitions); roof t/s = "
      "read bandwidth (echo-bench's streaming read, same threads) / bytes per decode step")
EOF
