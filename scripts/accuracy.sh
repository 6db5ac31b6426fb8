#!/usr/bin/env bash
# Echo's accuracy on a trained model: SmolLM2-135M-Instruct (fetched by
# scripts/fetch-model.sh) teacher-forced on held-out English text, the
# Python 3.11 tutorial's reST sources from Debian's python3.11-doc (PSF
# licence; installed here when missing, as root), at tp 1 (exact, the
# reference) and tp 3 for exact and each codec of the table (comm/echo.h)
# without (echo-nofb) and with (echo) error feedback. Writes build/accuracy/*.json,
# the table docs/accuracy.md and the Pareto plot docs/accuracy.png
# (accuracy change vs wire bits/value).
#
#   scripts/accuracy.sh [--quick] [--threads N] [--codecs LIST] [--gen-tokens K]
#                       [--more LIST]
#     --quick        8 prompts, 16 greedy tokens (a smoke run, ~3 min)
#     --codecs LIST  codec-gG list (default: int4-g32,int4-g64,hadamard-g16,
#                    hadamard-g32,hadamard-g64,hsub6-g128,out2-g128,
#                    hout2-g128,hout2-g256)
#     --more LIST    also run echo with these codecs on 3 further disjoint
#                    chunks of the text (50 prompts each), pooled in the
#                    report (default: hadamard-g32,hsub6-g128,hout2-g128)
#     --domains      instead: the multi-domain suite (five kinds of text from
#                    pinned Debian packages, scripts/accuracy-domains.sh): the
#                    default preset on 40 prompts of 256 tokens per domain, the
#                    ablation (echo-nofb, int4) on the first 8, then its
#                    section of docs/accuracy.md and docs/accuracy-domains.png
#                    (several hours on 2 shared cores)
# The full run (50 prompts of 128 tokens, 16 greedy tokens, 18 variants, then
# the further chunks) takes about an hour on 2 shared cores.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
threads=$(nproc)
codecs=int4-g32,int4-g64,hadamard-g16,hadamard-g32,hadamard-g64,hsub6-g128,out2-g128,hout2-g128,hout2-g256
more=hadamard-g32,hsub6-g128,hout2-g128
gen=16
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --threads) threads=$2; shift ;;
    --codecs) codecs=$2; shift ;;
    --gen-tokens) gen=$2; shift ;;
    --more) more=$2; shift ;;
    --domains)
      scripts/accuracy-domains.sh --prompts 40 --modes echo --tag main
      scripts/accuracy-domains.sh --prompts 8 --modes echo,echo-nofb,int4 --codecs hout2-g128 --tag ablation
      python3 scripts/accuracy_domains_report.py docs/accuracy.md build/accuracy-domains/plot.dat \
        build/accuracy-domains/runs/main build/accuracy-domains/runs/ablation
      if command -v gnuplot >/dev/null; then
        gnuplot -e "dat='build/accuracy-domains/plot.dat'; out='docs/accuracy-domains.png'" scripts/accuracy-domains.gp
      fi
      exit 0 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "accuracy.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
# ECHO_ACC_OUT=DIR: where the runs' JSON goes (default build/accuracy)
out=${ECHO_ACC_OUT:-build/accuracy}
mkdir -p "$out"
model=$(scripts/fetch-model.sh build/models)
src=/usr/share/doc/python3.11/html/_sources/tutorial
if [ ! -d "$src" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "accuracy.sh: needs Debian's python3.11-doc (the held-out text): apt-get install python3.11-doc" >&2
    exit 1
  fi
  echo "accuracy.sh: installing python3.11-doc (held-out text)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3.11-doc >&2
fi
python3 scripts/rst2text.py "$src"/*.rst.txt > "$out/text.txt"
echo "accuracy.sh: $(wc -w < "$out/text.txt") words of held-out text in $out/text.txt" >&2
# ECHO_BIN=DIR: use an existing build of the programs instead of make's bin/
bin=${ECHO_BIN:-bin}
[ -n "${ECHO_BIN:-}" ] || make -s bin/echo-eval bin/echo-bench >&2
if [ $quick = 1 ]; then
  common=(--text "$out/text.txt" --prompt-len 128 --max-prompts 8 --gen-tokens 16 --threads "$threads" --json)
else
  common=(--text "$out/text.txt" --prompt-len 128 --max-prompts 50 --gen-tokens "$gen" --threads "$threads" --json)
fi
echo "accuracy.sh: tp 1 (exact reference)" >&2
"$bin"/echo-eval --model "$model" --tp 1 "${common[@]}" > "$out/tp1.json"
echo "accuracy.sh: tp 3, exact + echo-nofb/echo x {$codecs}" >&2
"$bin"/echo-eval --model "$model" --tp 3 --modes echo-nofb,echo --codecs "$codecs" "${common[@]}" > "$out/tp3.json"
# codec throughput on this CPU (one thread, 1M values), for the report
: > "$out/codec.json"
for c in $(echo "$codecs" | tr ',' ' '); do
  "$bin"/echo-bench codec --codec "$c" --count 1M --iters 5 --json >> "$out/codec.json"
done
# the same on further chunks of the text (disjoint from the first 50 prompts)
more_args=()
if [ $quick = 0 ] && [ -n "$more" ]; then
  python3 - "$out" <<'PY'
import sys
out = sys.argv[1]
t = open(f"{out}/text.txt").read()
for k, off in enumerate((36000, 72000, 108000), start=2):
    i = t.find("\n\n", off)
    open(f"{out}/text{k}.txt", "w").write(t[i + 2:])
PY
  for k in 2 3 4; do
    echo "accuracy.sh: text chunk $k: exact + echo x {$more}" >&2
    "$bin"/echo-eval --model "$model" --tp 3 --modes echo --codecs "$more" --text "$out/text$k.txt" \
      --prompt-len 128 --max-prompts 50 --gen-tokens 4 --threads "$threads" --json > "$out/more$k.json"
    more_args+=(--more "$out/more$k.json")
  done
fi
# a Qwen3 fixture (random weights: KL only), so that nothing regresses there
"$bin"/echo-eval --model tests/fixtures/models/deep36 --tp 4 --random-prompts 8 --prompt-len 32 --gen-tokens 8 \
  --modes echo-nofb,echo --codecs "$codecs" --threads "$threads" --json > "$out/qwen3.json" 2>/dev/null || true
python3 scripts/accuracy_report.py "$out/tp1.json" "$out/tp3.json" docs/accuracy.md "$out/plot.dat" "$out/codec.json" \
  "$out/qwen3.json" "${more_args[@]}"
if command -v gnuplot >/dev/null; then
  gnuplot -e "dat='$out/plot.dat'; out='docs/accuracy.png'" scripts/accuracy.gp
fi
echo "accuracy.sh: wrote docs/accuracy.md" >&2
