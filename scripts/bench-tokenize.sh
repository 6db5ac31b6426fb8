#!/usr/bin/env bash
# Single-thread encode throughput of echo's tokenizer beside HF `tokenizers`
# on the same >= 10 MB text (man pages in every installed language plus
# /usr/share/doc text), in the same run.
#
#   scripts/bench-tokenize.sh [MODEL_DIR] [TEXT_FILE]
#
# MODEL_DIR defaults to the committed Qwen3 tokenizer. TEXT_FILE is built
# (12 MB) when not given. HF's numbers need `pip install tokenizers`; without
# it only echo's are printed. Two splits, identical on both sides, no special
# tokens added:
#   lines  each line (with its newline) encoded separately; HF: encode_batch
#          with TOKENIZERS_PARALLELISM=false and RAYON_NUM_THREADS=1; best of 3
#   whole  the whole file as one string; HF is very slow on a 12 MB string,
#          so it runs once (echo: best of 3)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-tests/fixtures/tokenizer/qwen3}
TEXT=${2:-}
if [ -z "$TEXT" ]; then
    TEXT=${TMPDIR:-/tmp}/echo-bench-tokenize.txt
    if [ ! -s "$TEXT" ]; then
        { find /usr/share/man -name '*.gz' | LC_ALL=C sort | xargs zcat 2>/dev/null || true
          find /usr/share/doc -type f \( -name '*.txt' -o -name 'README*' -o -name 'copyright' \) | LC_ALL=C sort |
              xargs cat 2>/dev/null || true; } |
            head -c 12000000 | iconv -f UTF-8 -t UTF-8 -c > "$TEXT" || true
    fi
fi
make -s CUDA=0 bin/echo-tokenize >/dev/null
echo "text: $TEXT ($(wc -c < "$TEXT") bytes), model: $MODEL"
OURS=$(bin/echo-tokenize --model "$MODEL" --bench "$TEXT" --repeat 3)
echo "$OURS"
if ! python3 -c 'import tokenizers' 2>/dev/null; then
    echo "hf: tokenizers not installed (pip install tokenizers) - no comparison"
    exit 0
fi
HF=$(TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 python3 - "$MODEL/tokenizer.json" "$TEXT" <<'PY'
import sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
data = open(sys.argv[2], "rb").read()
text = data.decode("utf-8")
# Cut at \n only, like echo (str.splitlines would also cut at \r, U+2028...).
lines = [l + "\n" for l in text.split("\n")]
lines[-1] = lines[-1][:-1]
if not lines[-1]:
    lines.pop()
def run(fn, reps):
    best, n = 1e30, 0
    for _ in range(reps):
        t0 = time.perf_counter()
        n = fn()
        best = min(best, time.perf_counter() - t0)
    return best, n
for name, fn, reps in (
        ("lines", lambda: sum(len(e.ids) for e in tok.encode_batch(lines, add_special_tokens=False)), 3),
        ("whole", lambda: len(tok.encode(text, add_special_tokens=False).ids), 1)):
    best, n = run(fn, reps)
    print(f"hf {name}: {len(data)} bytes, {n} tokens, {best:.3f} s, {len(data)/best/1e6:.2f} MB/s, {n/best:.0f} tokens/s")
PY
)
echo "$HF"
for mode in lines whole; do
    o=$(echo "$OURS" | grep "^echo $mode" | sed -E 's/.* ([0-9.]+) MB\/s.*/\1/')
    h=$(echo "$HF" | grep "^hf $mode" | sed -E 's/.* ([0-9.]+) MB\/s.*/\1/')
    ot=$(echo "$OURS" | grep "^echo $mode" | sed -E 's/.*, ([0-9]+) tokens,.*/\1/')
    ht=$(echo "$HF" | grep "^hf $mode" | sed -E 's/.*, ([0-9]+) tokens,.*/\1/')
    same=$([ "$ot" = "$ht" ] && echo "token counts equal" || echo "TOKEN COUNTS DIFFER: $ot vs $ht")
    awk -v m="$mode" -v o="$o" -v h="$h" -v s="$same" 'BEGIN { printf "ratio echo/hf (%s): %.2fx  (%s)\n", m, o / h, s }'
done
