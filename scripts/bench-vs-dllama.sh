#!/usr/bin/env bash
# echo vs distributed-llama (and llama.cpp's RPC modes) across "hosts" of the
# per-host lab (scripts/hostlab.sh): the same random Qwen3-0.6B-shape weights,
# one process per host, each host's link shaped to RATE.
#
#   scripts/bench-vs-dllama.sh [--layers 28] [--prompt 512] [--decode 16]
#       [--hosts "2 4"] [--rates "62mbit none"] [--reps 1] [--iters 3]
#       [--systems "dllama echo llama.cpp"] [--echo-modes echo] [--overlap auto]
#       [--sm "layer tensor"] [--dllama-args "ARGS"] [--out FILE]
#   scripts/bench-vs-dllama.sh --prepare-only [--layers N]  (build and convert only)
#   scripts/bench-vs-dllama.sh --summary FILE              (the table again)
#
# distributed-llama (a peer measured beside echo, never linked into it) is
# built by this script under build/dllama/src-COMMIT from a pinned commit of
# its public repository, taken with `git archive` out of a bare git directory
# ($DLLAMA_REPO, default /work/.mirror/b4rtaz+distributed-llama/repo). Its
# converter (converter/convert-hf.py, convert-tokenizer-hf.py) runs in
# build/venv-dllama (numpy, safetensors, sentencepiece, transformers from
# PyPI; torch from build/venv-clients when that has it, else from PyPI).
#
# The weights: `echo-bench randmodel --shape qwen3-0.6b` (bf16 safetensors,
# --layers N; the Qwen3 tokenizer fixture beside it), in build/dllama/models:
# - distributed-llama: its converter's q40 file; it runs with
#   `--buffer-float-type q80` (8-bit sync), `--nthreads 1`, root in host 0
#   and one `dllama worker` in each other host (it needs 2^n nodes);
# - echo and llama.cpp: the same folder through the llama.cpp sdist's
#   convert_hf_to_gguf.py (bf16) and `llama-quantize --pure Q4_0` (every
#   matrix Q4_0, lm-head included, as distributed-llama's q40 file has it),
#   run by scripts/bench-vs-llamacpp-rpc.sh (echo under mpirun, integer
#   kernels, 1 thread per rank; llama.cpp's `-sm layer` / `-sm tensor` with
#   one ggml-rpc-server -t 1 per host) into the same --out file.
#
# Per cell (hosts, rate): prompt time of a P-token prompt, batch-1 decode
# tok/s, bytes on the wire per token. distributed-llama's `inference` mode
# evaluates the prompt in batches of 32 and then predicts: its prompt time is
# the wall time from its echo of the prompt to its first predicted token (it
# evaluates P-1 tokens, the P-th is its first prediction step: TTFT of P
# tokens); decode tok/s is the wall rate of its prediction lines after the
# first (its own timers are kept beside, *_own). A prompt of "the" and P-1
# " the" is P tokens (checked against its count). Bytes: every host's lab0
# tx during the run, less a load-only run's (1-token prompt, 1 step: the
# weights it sends its workers), over the tokens it pushed through (P-2+D);
# for echo and llama.cpp as bench-vs-llamacpp-rpc.sh does it (same
# counters). A cell distributed-llama cannot run is a row with its error.
# Each (hosts, rate, rep) holds `flock $LAB_LOCK` (default /work/lab.lock:
# one lab at a time) while it runs distributed-llama, then echo and
# llama.cpp; every lab in it also holds `flock /work/cpu.lock`.
#
# --rates: the tc rate of every host's link (62mbit: 1 Gbit/s for 8-core
# hosts when 4 lab hosts share 2 cores). --host-cores C: each rate is what
# C-core hosts have (scripts/hostlab.sh --host-cores; passed to every lab).
# Needs root, Open MPI, bin/echo-bench, the llama.cpp build (build/llamacpp;
# ggml-rpc-server is built into build/llamacpp-rpc if $LLAMACPP_BIN has none).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
commit=8d624a7b1f9acc0855d71a32519b22fe51e0bd86  # v0.16.4 + 1 commit, 2026-01-18
repo=${DLLAMA_REPO:-/work/.mirror/b4rtaz+distributed-llama/repo}
layers=28 prompt=512 decode=16 hosts="2 4" rates="62mbit none" reps=1 iters=3 host_cores=
systems="dllama echo llama.cpp" emodes=echo overlaps=auto sms="layer tensor" dargs=
out=build/vs-dllama.jsonl summary= prepare_only=0
die() { echo "bench-vs-dllama: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in --prepare-only|-h|--help) ;; --*) [ $# -ge 2 ] || die "$1 needs a value (try --help)" ;; esac
  case "$1" in
    --layers) layers=$2; shift ;;
    --prompt|--prompts) prompt=$2; shift ;;
    --decode) decode=$2; shift ;;
    --hosts) hosts=$2; shift ;;
    --rate|--rates) rates=$2; shift ;;
    --host-cores) host_cores=$2; shift ;;
    --reps) reps=$2; shift ;;
    --iters) iters=$2; shift ;;
    --systems) systems=$2; shift ;;
    --echo-modes) emodes=$2; shift ;;
    --overlap) overlaps=$2; shift ;;
    --sm) sms=$2; shift ;;
    --dllama-args) dargs=$2; shift ;;
    --out) out=$2; shift ;;
    --summary) summary=$2; shift ;;
    --prepare-only) prepare_only=1 ;;
    -h|--help) sed -n '2,50p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (try --help)" ;;
  esac
  shift
done

# The table: per (prompt, hosts, rate) the median over runs of each setup,
# and the ratios of the issue's bar (> 1: this is faster).
summarize() {  # JSONL
  python3 - "$1" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def setup(r):
    return r["who"] + (" overlap " + r["overlap"] if r.get("overlap") else "")
groups = []
for r in rows:
    g = (r["model"], r["prompt"], r["tp"], r["rate"])
    if g not in groups: groups.append(g)
med = lambda xs: st.median(xs) if xs else None
f0 = lambda x, f="{:.0f}": f.format(x) if x is not None else "-"
for g in groups:
    gr = [r for r in rows if (r["model"], r["prompt"], r["tp"], r["rate"]) == g]
    names = []
    for r in gr:
        if setup(r) not in names: names.append(setup(r))
    ok = {n: [r for r in gr if setup(r) == n and r.get("ttft_ms") is not None] for n in names}
    errs = {n: [r["error"] for r in gr if setup(r) == n and r.get("error")] for n in names}
    ttft = {n: med([r["ttft_ms"] for r in ok[n]]) for n in names}
    dec = {n: med([r["decode_tok_s"] for r in ok[n]]) for n in names}
    dl = [n for n in names if n.startswith("distributed-llama") and ttft[n]]
    lc = [ttft[n] for n in names if n.startswith("llama.cpp") and ttft[n]]
    best = min(lc) if lc else None
    print(f"\n{g[0]}, {g[2]} hosts, link {g[3]}, {g[1]}-token prompt (median over runs)\n")
    print("| setup | runs | prompt ms | distributed-llama / this | best llama.cpp / this | decode tok/s "
          "| this / distributed-llama decode | KB per token | load (1 min) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in names:
        rs = ok[n]
        bpt = med([r["bytes_per_token"] for r in rs if r.get("bytes_per_token") is not None])
        loads = sorted(float(r["load"]) for r in gr if setup(r) == n)
        if not rs:
            print(f"| {n} | 0 | error: {errs[n][-1] if errs[n] else '?'} | | | | | | "
                  f"{loads[0]:.1f}-{loads[-1]:.1f} |")
            continue
        d = ttft[dl[0]] / ttft[n] if dl else None
        b = best / ttft[n] if best else None
        dd = dec[n] / dec[dl[0]] if dl else None
        note = f" ({len(errs[n])} failed)" if errs[n] else ""
        print(f"| {n} | {len(rs)}{note} | {ttft[n]:.0f} | {f0(d, '{:.2f}x')} | {f0(b, '{:.2f}x')} | "
              f"{dec[n]:.2f} | {f0(dd, '{:.2f}x')} | {f0(bpt / 1e3 if bpt is not None else None, '{:.1f}')} | "
              f"{loads[0]:.1f}-{loads[-1]:.1f} |")
PY
}
if [ -n "$summary" ]; then
  [ -f "$summary" ] || die "--summary: no file '$summary'"
  summarize "$summary"
  exit 0
fi

[[ "$layers" =~ ^[1-9][0-9]*$ && "$layers" -le 28 ]] || die "--layers: 1..28"
[[ "$prompt" =~ ^[1-9][0-9]*$ && "$prompt" -ge 2 ]] || die "--prompt: a token count >= 2"
[[ "$reps" =~ ^[1-9][0-9]*$ && "$iters" =~ ^[1-9][0-9]*$ && "$decode" =~ ^[1-9][0-9]*$ ]] ||
  die "--reps, --iters, --decode: counts >= 1"
for h in $hosts; do
  case "$h" in 2|4|8) ;; *) die "--hosts: 2, 4 or 8 (distributed-llama needs 2^n nodes, echo tp >= 2), got '$h'" ;; esac
done
for r in $rates; do
  [[ "$r" == none || "$r" =~ ^[0-9]+(\.[0-9]+)?[kmg]?bit$ ]] || die "--rates: 'none' or a tc rate such as 62mbit, got '$r'"
done
for s in $systems; do
  case "$s" in dllama|echo|llama.cpp) ;; *) die "--systems: dllama, echo, llama.cpp; got '$s'" ;; esac
done
hc=()
if [ -n "$host_cores" ]; then
  # compute-matched cells (scripts/hostlab.sh --host-cores C): every link
  # shaped to RATE x (this machine's cores / hosts) / C, for every system
  [[ "$host_cores" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--host-cores: one core count, got '$host_cores'"
  hc=(--host-cores "$host_cores")
fi

# ---- distributed-llama: the pinned commit out of the mirror, built ----
dsrc=build/dllama/src-$commit
dbin=$dsrc/dllama
if [ ! -x "$dbin" ]; then
  git -C "$repo" cat-file -e "$commit^{commit}" 2>/dev/null || die "no distributed-llama commit $commit in '$repo'.
  Get the public repository b4rtaz/distributed-llama (GitHub) as a bare git directory, e.g.
  'git clone --bare <its URL> DIR', and point DLLAMA_REPO=DIR at it (default $repo)."
  rm -rf "$dsrc.tmp" && mkdir -p "$dsrc.tmp"
  git -C "$repo" archive "$commit" | tar -x -C "$dsrc.tmp"
  echo "bench-vs-dllama: building distributed-llama $commit (log: $dsrc/build.log)" >&2
  make -C "$dsrc.tmp" -j1 dllama >"$dsrc.tmp/build.log" 2>&1 || { tail -5 "$dsrc.tmp/build.log" >&2; die "distributed-llama build failed"; }
  rm -rf "$dsrc" && mv "$dsrc.tmp" "$dsrc"
fi

# ---- its converter's venv ----
venv=build/venv-dllama
if [ ! -f "$venv/.done" ]; then
  echo "bench-vs-dllama: making $venv (its converter: numpy safetensors sentencepiece transformers torch)" >&2
  rm -rf "$venv" && python3 -m venv "$venv"
  "$venv/bin/pip" install -q numpy safetensors sentencepiece transformers
  # torch is GBs from PyPI: reuse a venv that has it (a .pth appends its
  # site-packages after this venv's own) before installing it
  tsite=$(build/venv-clients/bin/python -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null) || tsite=
  if [ -n "$tsite" ] && [ "$("$venv/bin/python" -c 'import sys; print(sys.version_info[:2])')" = \
       "$(build/venv-clients/bin/python -c 'import sys; print(sys.version_info[:2])')" ]; then
    echo "$tsite" >"$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')/zz-torch-from-venv-clients.pth"
  else
    "$venv/bin/pip" install -q torch
  fi
  "$venv/bin/python" -c 'import numpy, safetensors, sentencepiece, torch, transformers' || die "$venv: an import fails"
  touch "$venv/.done"
fi

# ---- the weights ----
lsrc=${LLAMACPP_SRC:-build/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp}
quant=${LLAMACPP_QUANTIZE:-build/llamacpp/build/bin/llama-quantize}
name=qwen3-0.6b$([ "$layers" = 28 ] || echo "-l$layers")
mdir=build/dllama/models
hf=$mdir/$name
dmodel=$mdir/dllama_model_${name}_q40.m dtok=$mdir/dllama_tokenizer_qwen3.t gguf=$mdir/$name-q4_0.gguf
mkdir -p "$mdir"
if [ ! -f "$hf/model.safetensors" ]; then
  [ -x bin/echo-bench ] || die "bin/echo-bench not built (make)"
  bin/echo-bench randmodel --shape qwen3-0.6b --layers "$layers" --out "$hf" --force >&2
fi
cp tests/fixtures/tokenizer/qwen3/tokenizer.json tests/fixtures/tokenizer/qwen3/tokenizer_config.json "$hf/"
if [ ! -f "$dmodel" ] || [ ! -f "$dtok" ]; then
  echo "bench-vs-dllama: distributed-llama's converter -> $dmodel (log: $dmodel.log)" >&2
  (cd "$mdir" && "$root/$venv/bin/python" "$root/$dsrc/converter/convert-hf.py" "$root/$hf" q40 "$name" &&
    "$root/$venv/bin/python" "$root/$dsrc/converter/convert-tokenizer-hf.py" "$root/$hf" qwen3) >"$dmodel.log" 2>&1 ||
    { tail -5 "$dmodel.log" >&2; rm -f "$dmodel"; die "distributed-llama's converter failed"; }
fi
if [ ! -f "$gguf" ]; then
  [ -x "$quant" ] && [ -f "$lsrc/convert_hf_to_gguf.py" ] || die "needs the llama.cpp build (build/llamacpp: $lsrc, $quant)"
  echo "bench-vs-dllama: convert_hf_to_gguf (bf16) + llama-quantize --pure Q4_0 -> $gguf" >&2
  PYTHONPATH=$lsrc/gguf-py "$venv/bin/python" "$lsrc/convert_hf_to_gguf.py" "$hf" --outtype bf16 --outfile "$mdir/$name-bf16.gguf.tmp" \
    >"$gguf.log" 2>&1 || { tail -5 "$gguf.log" >&2; die "convert_hf_to_gguf failed"; }
  "$quant" --pure "$mdir/$name-bf16.gguf.tmp" "$gguf.tmp" Q4_0 >>"$gguf.log" 2>&1 ||
    { tail -5 "$gguf.log" >&2; die "llama-quantize failed"; }
  rm -f "$mdir/$name-bf16.gguf.tmp" && mv "$gguf.tmp" "$gguf"
fi

# ---- llama.cpp's rpc server (the shared build has llama-bench only) ----
lbin=${LLAMACPP_BIN:-build/llamacpp-rpc/bin}
if [[ " $systems " == *" llama.cpp "* ]] && [ ! -x "$lbin/ggml-rpc-server" ]; then
  [ -z "${LLAMACPP_BIN:-}" ] || die "LLAMACPP_BIN=$lbin has no ggml-rpc-server"
  grep -q '^GGML_RPC:BOOL=ON' build/llamacpp/build/CMakeCache.txt 2>/dev/null ||
    die "build/llamacpp's llama-bench is built without GGML_RPC"
  echo "bench-vs-dllama: building ggml-rpc-server into build/llamacpp-rpc (log: build/llamacpp-rpc/build.log)" >&2
  mkdir -p build/llamacpp-rpc/bin
  cmake -S "$lsrc" -B build/llamacpp-rpc/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_RPC=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF >build/llamacpp-rpc/cmake.log 2>&1 &&
    cmake --build build/llamacpp-rpc/build -j1 --target ggml-rpc-server >build/llamacpp-rpc/build.log 2>&1 ||
    die "ggml-rpc-server build failed (build/llamacpp-rpc/*.log)"
  ln -sf "$root/build/llamacpp-rpc/build/bin/ggml-rpc-server" "$root/build/llamacpp/build/bin/llama-bench" build/llamacpp-rpc/bin/
fi
[ "$prepare_only" = 1 ] && { echo "bench-vs-dllama: ready: $dbin, $dmodel, $gguf" >&2; exit 0; }

# ---- the distributed-llama cell (runs inside the lab, host 0) ----
mkdir -p "$(dirname "$out")"
cat >build/.dllama-cell.sh <<'EOF'
#!/usr/bin/env bash
# BIN MODEL TOKENIZER PROMPT STEPS LOGDIR [ARGS...]: workers in hosts 1.., the
# root here; prints the root's lines, each after its arrival time, then "TX <bytes>".
set -u
bin=$1 model=$2 tok=$3 prompt=$4 steps=$5 logs=$6; shift 6
tx() { local t=0 ns; for ns in $ECHO_HOSTLAB_NS; do
  t=$((t + $(ip netns exec "$ns" cat /sys/class/net/lab0/statistics/tx_bytes))); done; echo $t; }
pids=() workers=() i=0
for ns in $ECHO_HOSTLAB_NS; do
  if [ $i -gt 0 ]; then
    ip netns exec "$ns" "$bin" worker --port 9999 --nthreads 1 "$@" >"$logs/worker$i.log" 2>&1 &
    pids+=($!) workers+=("10.77.0.$((i + 1)):9999")
  fi
  i=$((i + 1))
done
for _ in $(seq 50); do  # workers listening (10 s at most)
  ok=1 i=0
  for ns in $ECHO_HOSTLAB_NS; do
    [ $i -gt 0 ] && ! ip netns exec "$ns" sh -c "ss -ltn | grep -q ':9999 '" && ok=0
    i=$((i + 1))
  done
  [ $ok = 1 ] && break; sleep 0.2
done
t0=$(tx)
timeout 900 stdbuf -oL "$bin" inference --model "$model" --tokenizer "$tok" --buffer-float-type q80 --nthreads 1 \
  --max-seq-len $((steps + 8)) --temperature 0 --seed 1 --steps "$steps" --prompt "$prompt" \
  ${workers[0]:+--workers "${workers[@]}"} "$@" 2>&1 |
  while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done
rc=${PIPESTATUS[0]}
t1=$(tx)
for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
wait 2>/dev/null
echo "TX $((t1 - t0))"
exit $rc
EOF
chmod +x build/.dllama-cell.sh
loadf=$out.load.json
[ -f "$loadf" ] || echo '{}' >"$loadf"
logs=build/dllama/logs && mkdir -p "$logs"
# the labs' namespace names and addresses are fixed: one lab at a time
# across everything that makes labs here ($LAB_LOCK), then the CPU lock
lablock=${LAB_LOCK:-/work/lab.lock}
exec {labfd}>>"$lablock"
text() { local i; printf 'the'; for ((i = 1; i < $1; i++)); do printf ' the'; done; }  # N tokens

# dllama_run H RATE P STEPS: one lab under the CPU lock; the cell's output.
dllama_run() {
  local h=$1 rate=$2 p=$3 steps=$4
  echo "== $(date -u +%FT%TZ) dllama $h hosts rate $rate prompt $p steps $steps" >>"$out.err"
  # shellcheck disable=SC2086 # --dllama-args is a list of flags
  flock /work/cpu.lock timeout 1200 scripts/hostlab.sh --hosts "$h" --rate "$rate" "${hc[@]}" -- \
    build/.dllama-cell.sh "$root/$dbin" "$root/$dmodel" "$root/$dtok" "$(text "$p")" "$steps" "$root/$logs" $dargs 2>>"$out.err"
}
# The bytes distributed-llama sends to load the model on its workers (+ 1 token).
dllama_upload() {  # hosts
  local key="$dmodel|$1|$commit|$dargs" res
  res=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' "$loadf" "$key")
  if [ -z "$res" ]; then
    echo "bench-vs-dllama: distributed-llama, $1 hosts: bytes of the weight upload (load-only run)" >&2
    res=$(dllama_run "$1" none 1 1 | sed -n 's/^TX //p') || return 1
    [ -n "$res" ] || return 1
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d[sys.argv[2]] = int(sys.argv[3])
json.dump(d, open(sys.argv[1], "w"), indent=1)' "$loadf" "$key" "$res"
  fi
  echo "$res"
}

dllama_cell() {  # hosts rate rep
  local h=$1 rate=$2 rep=$3 up res rc=0
  up=$(dllama_upload "$h") || up=
  echo "bench-vs-dllama: rep $rep, $h hosts, $rate, P $prompt, distributed-llama (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  res=$(dllama_run "$h" "$rate" "$prompt" $((prompt - 1 + decode))) || rc=$?
  printf '%s\n' "$res" >"$logs/root-$h-$rate-$rep.log"
  python3 - "$logs/root-$h-$rate-$rep.log" "$gguf" "$dmodel" "$rate" "$h" "$rep" "$prompt" "$decode" "$up" "$rc" \
    "$commit" >>"$out" <<'PY' && tail -1 "$out" >&2
import json, re, sys
log, gguf, dmodel, rate, h, rep, P, D, up, rc, commit = sys.argv[1:]
P, D, rc = int(P), int(D), int(rc)
txt = open(log).read()
row = {"model": gguf, "weights": dmodel, "who": "distributed-llama q40/q80", "overlap": None, "rate": rate,
       "tp": int(h), "rep": int(rep), "prompt": P, "decode": D, "iters": 1, "commit": commit,
       "load": open("/proc/loadavg").read().split()[0], "ttft_ms": None}
lines = []  # (time, text)
tx = None
for l in txt.splitlines():
    if l.startswith("TX "): tx = int(l[3:]); continue
    t, _, s = l.partition(" ")
    try: lines.append((float(t), s))
    except ValueError: pass
try:
    i0 = next(i for i, (_, s) in enumerate(lines) if s.startswith("the the") or s == "the")
    preds = [(t, s) for t, s in lines[i0:] if s.startswith("\U0001f536")]
    ev = re.search(r"Evaluation\s+nBatches: *\d+\s+nTokens: *(\d+)\s+tokens/s: *[\d.]+ \(([\d.]+) ms/tok\)",
                   "\n".join(s for _, s in lines))
    pr = re.search(r"Prediction\s+nTokens: *(\d+)\s+tokens/s: *([\d.]+)", "\n".join(s for _, s in lines))
    if rc != 0 or not preds or not ev or not pr:
        raise ValueError(f"exit {rc}")
    if int(ev.group(1)) != P - 1:
        raise ValueError(f"its prompt was {int(ev.group(1)) + 1} tokens, not {P}")
    first = re.search(r"Pred *(\d+) ms Sync *(\d+) ms", preds[0][1])
    row["ttft_ms"] = (preds[0][0] - lines[i0][0]) * 1e3
    row["ttft_own_ms"] = int(ev.group(1)) * float(ev.group(2)) + int(first.group(1)) + int(first.group(2))
    row["decode_tok_s"] = (len(preds) - 1) / (preds[-1][0] - preds[0][0]) if len(preds) > 1 else None
    row["decode_own_tok_s"] = float(pr.group(2))
    row["pred_tokens"] = int(pr.group(1))
    tokens = P - 1 + int(pr.group(1))
    row.update(tx_bytes=tx, upload_bytes=int(up) if up else None, tokens=tokens)
    # the load-only run pushed 1 token through as well
    row["bytes_per_token"] = (tx - int(up)) / (tokens - 1) if up and tx is not None else None
except (StopIteration, ValueError) as e:
    err = [s for _, s in lines if re.search(r"error|terminate|what\(\)|Killed|fault|cannot|failed", s, re.I)]
    row["error"] = (err[-1] if err else (lines[-1][1] if lines else "no output")) + f" ({e or 'no prompt line'})"
print(json.dumps(row))
PY
}

for rep in $(seq "$reps"); do
  for h in $hosts; do
    for rate in $rates; do
      # one hold of the lab lock for the whole cell: its systems side by side
      echo "bench-vs-dllama: rep $rep, $h hosts, $rate: waiting for $lablock" >&2
      flock "$labfd"
      [[ " $systems " == *" dllama "* ]] && { dllama_cell "$h" "$rate" "$rep" || echo "  no result parsed" >&2; }
      e=$([[ " $systems " == *" echo "* ]] && echo "$emodes" || true)
      s=$([[ " $systems " == *" llama.cpp "* ]] && echo "$sms" || true)
      [ -n "${e// }${s// }" ] || { flock -u "$labfd"; continue; }
      # echo and llama.cpp: the existing side by side, same file, same counters
      LLAMACPP_BIN=$lbin scripts/bench-vs-llamacpp-rpc.sh --model "$gguf" --tp "$h" --rates "$rate" \
        --prompts "$prompt" --decode "$decode" --iters "$iters" --echo-modes "$e" --overlap "$overlaps" \
        --sm "$s" "${hc[@]}" --out "$out" >/dev/null || echo "  bench-vs-llamacpp-rpc.sh failed (see $out.err)" >&2
      flock -u "$labfd"
    done
  done
done
summarize "$out"
