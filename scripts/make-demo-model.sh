#!/usr/bin/env bash
# Assemble the bundled demo model for `make serve`: the committed fixture
# tests/fixtures/models/realvocab (a tiny Qwen3-architecture model with random
# weights, generated deterministically by tests/fixtures/make_reference.py,
# vocabulary 151936 = the real Qwen3 one) plus the real Qwen3 tokenizer files.
# The folder holds symlinks, so it costs nothing and always matches the fixture.
#   usage: scripts/make-demo-model.sh OUT_DIR
set -euo pipefail
out=${1:?usage: $0 OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/tests/fixtures/models/realvocab
tok=$root/tests/fixtures/tokenizer/qwen3
mkdir -p "$out"
for f in "$model/config.json" "$model/generation_config.json" "$model/model.safetensors" \
         "$tok/tokenizer.json" "$tok/tokenizer_config.json"; do
  [ -f "$f" ] || { echo "make-demo-model: missing $f" >&2; exit 1; }
  ln -sfn "$f" "$out/$(basename "$f")"
done
echo "demo model ready in $out (random weights: output text is gibberish by design)"
