#!/usr/bin/env bash
# Echo's accuracy on a trained model: SmolLM2-135M-Instruct (fetched by
# scripts/fetch-model.sh) teacher-forced on held-out English text, the
# Python 3.11 tutorial's reST sources from Debian's python3.11-doc (PSF
# licence; installed here when missing, as root), at tp 1 (exact, the
# reference) and tp 3 for exact, int4 and echo at group sizes 32/64/128,
# with and without a size policy. Writes build/accuracy/*.json, the table
# docs/accuracy.md and the plot docs/accuracy.png.
#
#   scripts/accuracy.sh [--quick] [--threads N]
#     --quick   8 prompts, 16 greedy tokens, G = 64 only (a smoke run, ~2 min)
# The full run (50 prompts of 128 tokens, 64 greedy tokens) takes ~20 min
# on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
threads=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --threads) threads=$2; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "accuracy.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
out=build/accuracy
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
[ -n "${ECHO_BIN:-}" ] || make -s bin/echo-eval >&2
if [ $quick = 1 ]; then
  common=(--text "$out/text.txt" --prompt-len 128 --max-prompts 8 --gen-tokens 16 --threads "$threads" --json)
  groups=64; minb=0
else
  common=(--text "$out/text.txt" --prompt-len 128 --max-prompts 50 --gen-tokens 64 --threads "$threads" --json)
  groups=32,64,128; minb=0,262144
fi
echo "accuracy.sh: tp 1 (exact reference)" >&2
"$bin"/echo-eval --model "$model" --tp 1 "${common[@]}" > "$out/tp1.json"
echo "accuracy.sh: tp 3, exact + int4/echo x G {$groups} x min_bytes {$minb}" >&2
"$bin"/echo-eval --model "$model" --tp 3 --modes int4,echo --echo-group "$groups" --echo-min-bytes "$minb" \
  "${common[@]}" > "$out/tp3.json"
python3 scripts/accuracy_report.py "$out/tp1.json" "$out/tp3.json" docs/accuracy.md "$out/plot.dat"
if command -v gnuplot >/dev/null; then
  gnuplot -e "dat='$out/plot.dat'; out='docs/accuracy.png'" scripts/accuracy.gp
fi
echo "accuracy.sh: wrote docs/accuracy.md" >&2
