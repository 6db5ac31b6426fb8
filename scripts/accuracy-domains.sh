#!/usr/bin/env bash
# The multi-domain accuracy suite (issue 30): SmolLM2-135M-Instruct at tp 3,
# teacher-forced on five kinds of held-out text from pinned Debian packages
# (fetched with apt-get download, sha256-checked, unpacked with dpkg-deb
# into build/accuracy-domains/, all cached there):
#   prose      the Python 3.11 tutorial (python3.11-doc)
#   reference  the library reference's reST sources (python3.11-doc)
#   code       the standard library's .py files (libpython3.11-stdlib)
#   german     German man pages, section 1 (manpages-de), rendered by groff
#   chat       the Python FAQ as user/assistant turns (python3.11-doc),
#              rendered by SmolLM2's own chat template (echo-serve's
#              /tokenize); every token of the rendering is scored (template
#              tokens, user and assistant turns alike)
# Each domain: PROMPTS prompts of 256 tokens from the start of its text
# (255 scored each), one echo-eval run per domain against exact.
#
#   scripts/accuracy-domains.sh [--prompts K] [--modes LIST] [--codecs LIST]
#                               [--tag NAME] [--domains LIST] [--threads N]
#                               [--prepare-only] [--tp N] [--kv-cache-dtype T]
#                               [--ref-kv-cache-dtype T] [--act-quant auto|none|q8_0]
#     --prompts K    prompts per domain (default 40: 10,200 scored tokens)
#     --modes LIST   echo-eval --modes (default echo)
#     --codecs LIST  echo-eval --codecs (default: the default preset's)
#     --tag NAME     runs go to build/accuracy-domains/runs/NAME/DOMAIN.json
#                    (default main)
#     --tp N         tensor-parallel ranks (default 3; 1: no all-reduce, so only
#                    --modes exact with a --ref-kv-cache-dtype)
#     --kv-cache-dtype T, --ref-kv-cache-dtype T
#                    echo-eval's KV cache types (docs/kv-cache.md): the runs'
#                    and the exact reference's (default fp32 for both, the
#                    cache the published tables were measured with)
#     --act-quant A  echo-eval --act-quant (default auto: 8-bit activations on the
#                    GGUF's quantized matrices; none: the exact path)
# Then scripts/accuracy_domains_report.py pools the runs into docs/accuracy.md.
set -euo pipefail
cd "$(dirname "$0")/.."
prompts=40 modes=echo codecs= tag=main threads=$(nproc) prepare=0 tp=3 kvdt=fp32 refkv= actq=auto
domains=prose,reference,code,german,chat
while [ $# -gt 0 ]; do
  case "$1" in
    --prompts) prompts=$2; shift ;;
    --modes) modes=$2; shift ;;
    --codecs) codecs=$2; shift ;;
    --tag) tag=$2; shift ;;
    --domains) domains=$2; shift ;;
    --threads) threads=$2; shift ;;
    --prepare-only) prepare=1 ;;
    --tp) tp=$2; shift ;;
    --kv-cache-dtype) kvdt=$2; shift ;;
    --ref-kv-cache-dtype) refkv=$2; shift ;;
    --act-quant) actq=$2; shift ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "accuracy-domains.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
command -v groff >/dev/null || { echo "accuracy-domains.sh: needs groff (apt-get install groff-base)" >&2; exit 1; }
command -v dpkg-deb >/dev/null && command -v apt-get >/dev/null ||
  { echo "accuracy-domains.sh: needs apt-get and dpkg-deb (Debian)" >&2; exit 1; }
top=build/accuracy-domains
mkdir -p "$top/debs" "$top/root" "$top/text"
# pinned packages: name version sha256 (Debian 12 bookworm)
pkgs="python3.11-doc 3.11.2-6+deb12u9 5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be
libpython3.11-stdlib 3.11.2-6+deb12u9 10f13e000ee757f5f2d2d3569f9e30546214a0c850acd78695feae373bfa3e53
manpages-de 4.18.1-1 37d2e7ee51f22952aecec3af93647ff59194a3c74bb7a694560f49c7f7ab3978"
while read -r name ver sum; do
  got=$(ls "$top/debs/${name}_${ver//:/%3a}_"*.deb 2>/dev/null | head -1 || true)
  if [ -z "$got" ]; then
    echo "accuracy-domains.sh: fetching $name=$ver" >&2
    (cd "$top/debs" && apt-get download -q "$name=$ver" >&2) || {
      echo "accuracy-domains.sh: apt-get download $name=$ver failed (no network, or the version left the archive: pin a new one with its sha256)" >&2
      exit 1
    }
    got=$(ls "$top/debs/${name}_${ver//:/%3a}_"*.deb | head -1)
  fi
  if [ "$(sha256sum "$got" | cut -d' ' -f1)" != "$sum" ]; then
    echo "accuracy-domains.sh: $got: sha256 is not the pinned $sum" >&2
    rm -f "$got"
    exit 1
  fi
  if [ ! -f "$top/root/.$name.done" ]; then
    dpkg-deb -x "$got" "$top/root" && touch "$top/root/.$name.done"
  fi
done <<<"$pkgs"
if [ ! -f "$top/text/.done" ]; then
  python3 scripts/accuracy_domains.py "$top/root" "$top/text"
  touch "$top/text/.done"
fi
model=$(scripts/fetch-model.sh build/models)
bin=${ECHO_BIN:-bin}
[ -n "${ECHO_BIN:-}" ] || make -s bin/echo-eval bin/echo-serve bin/echo-tokenize >&2
# chat: the template's token ids, once (a tp 1 server, exact: rendering only)
if [ ! -f "$top/text/chat.ids.json" ]; then
  port=$((24000 + $$ % 20000))
  "$bin/echo-serve" --model "$model" --port $port --threads 1 --max-model-len 8192 --served-model-name m \
    >"$top/text/serve.log" 2>&1 &
  pid=$!
  trap 'kill -9 $pid 2>/dev/null || true' EXIT
  for _ in $(seq 240); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/health")" = 200 ] && break
    kill -0 $pid 2>/dev/null || { echo "accuracy-domains.sh: echo-serve died: $(tail -3 "$top/text/serve.log")" >&2; exit 1; }
    sleep 0.5
  done
  python3 - "$top/text/chat.json" "$top/text/chat.ids.json" "$port" <<'PY'
import json, sys, urllib.request
convs, out, port = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
ids = []
for msgs in convs:
    req = urllib.request.Request(f"http://localhost:{port}/tokenize", method="POST",
                                 headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": "m", "messages": msgs,
                                                  "add_generation_prompt": False}).encode())
    ids += json.load(urllib.request.urlopen(req, timeout=60))["tokens"]
json.dump(ids, open(out, "w"))
print(f"accuracy-domains.sh: chat: {len(ids)} tokens", file=sys.stderr)
PY
  kill -TERM $pid; wait $pid 2>/dev/null || true
  trap - EXIT
fi
# every domain as prompts of 256 token ids from the start of its text
for d in prose reference code german; do
  [ -f "$top/text/$d.ids.json" ] && continue
  "$bin/echo-tokenize" --model "$model" <"$top/text/$d.txt" | python3 -c '
import json, sys
json.dump([int(x) for x in sys.stdin.read().split()], open(sys.argv[1], "w"))' "$top/text/$d.ids.json"
done
[ $prepare = 1 ] && exit 0
mkdir -p "$top/runs/$tag"
for d in $(echo "$domains" | tr ',' ' '); do
  python3 - "$top/text/$d.ids.json" "$prompts" "$top/runs/$tag/$d.jsonl" <<'PY'
import json, sys
ids, k, out = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3]
if len(ids) < 256 * k:
    sys.exit(f"accuracy-domains.sh: {sys.argv[1]}: {len(ids)} tokens, fewer than {k} prompts of 256")
with open(out, "w") as f:
    for i in range(k):
        f.write(json.dumps(ids[256 * i:256 * (i + 1)]) + "\n")
PY
  echo "accuracy-domains.sh: $d: $prompts prompts, exact + $modes ${codecs:+($codecs)}" >&2
  "$bin/echo-eval" --model "$model" --tp "$tp" --prompts "$top/runs/$tag/$d.jsonl" --modes "$modes" \
    ${codecs:+--codecs "$codecs"} --kv-cache-dtype "$kvdt" --ref-kv-cache-dtype "${refkv:-$kvdt}" --act-quant "$actq" \
    --gen-tokens 1 --threads "$threads" --json >"$top/runs/$tag/$d.json"
done
echo "accuracy-domains.sh: runs in $top/runs/$tag" >&2
