#!/usr/bin/env bash
# Server tests: a real bin/echo-serve on loopback, real curl, the official
# openai client and prometheus_client's text parser (pip-installed here when
# missing; if pip cannot install them the run fails, it never skips); in full
# mode also guidellm and lm-evaluation-harness, unmodified, from one venv that
# later runs reuse ($ECHO_CLIENTS_VENV, default <build>/venv-clients next to
# the binary's bin/; created here when missing, with pinned versions).
#   usage: tests/server/run.sh [--asan] ECHO_SERVE_BINARY MODEL_DIR
# With $ECHO_SMOLLM2_GGUF (the trained model) also tests/server/test_structured.py; with the
# clients' venv also tests/server/test_reasoning.py (reasoning output, tool-call formats).
# Prints "N passed, M failed" as its last line; exit status 0 only when M = 0.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=full
if [ "${1:-}" = "--asan" ]; then mode=asan; shift; fi
bin=${1:?usage: $0 [--asan] ECHO_SERVE MODEL_DIR}
model=${2:?usage: $0 [--asan] ECHO_SERVE MODEL_DIR}
for tool in curl python3; do
  command -v "$tool" >/dev/null || { echo "test-server: '$tool' is required"; echo "0 passed, 1 failed"; exit 1; }
done
if ! python3 -c 'import openai, prometheus_client, jsonschema, pydantic' 2>/dev/null; then
  echo "test-server: installing the test clients (openai, prometheus_client, jsonschema, pydantic) with pip"
  if ! python3 -m pip install --quiet openai prometheus_client jsonschema pydantic; then
    echo "test-server: FAILED to pip-install openai, prometheus_client, jsonschema and pydantic (needed by the server tests)"
    echo "0 passed, 1 failed"
    exit 1
  fi
fi
if [ "$mode" = asan ]; then
  # Leaks are reported at exit (the harness sends SIGTERM and checks the log).
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  exec python3 "$here/test_server.py" --mode "$mode" --bin "$bin" --model "$model"
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
python3 "$here/test_server.py" --mode "$mode" --bin "$bin" --model "$model" | tee "$log"
read -r p1 _ f1 _ < <(tail -1 "$log") || { p1=0; f1=1; }

# Structured outputs and tool calls on the trained model (make test-server passes
# its GGUF; without one this part fails rather than skips).
gguf=${ECHO_SMOLLM2_GGUF:-}
if [ -n "$gguf" ] && [ -f "$gguf" ]; then
  python3 "$here/test_structured.py" --bin "$bin" --model "$gguf" | tee "$log"
  read -r ps _ fs _ < <(tail -1 "$log") || { ps=0; fs=1; }
  case "$ps$fs" in *[!0-9]*|'') ps=0; fs=1 ;; esac
else
  echo "test-server: FAILED: no trained model for the structured-output tests (set ECHO_SMOLLM2_GGUF)"
  ps=0; fs=1
fi
case "$p1$f1" in *[!0-9]*|'') p1=0; f1=1 ;; esac
p1=$((p1 + ps)); f1=$((f1 + fs))

# Speculative decoding on the trained model: --speculative ngram against none, 50 prompts
# (docs/speculative.md; tp 3 and mpirun runs: tests/server/test_spec.py --help).
if [ -n "$gguf" ] && [ -f "$gguf" ]; then
  python3 "$here/test_spec.py" --bin "$bin" --model "$gguf" | tee "$log"
  read -r ps _ fs _ < <(tail -1 "$log") || { ps=0; fs=1; }
  case "$ps$fs" in *[!0-9]*|'') ps=0; fs=1 ;; esac
  p1=$((p1 + ps)); f1=$((f1 + fs))
fi

# Third-party clients. The venv sees the system's packages (torch and
# transformers, when installed, are not downloaded again).
venv=${ECHO_CLIENTS_VENV:-$(cd "$(dirname "$bin")/.." && pwd)/venv-clients}
pins=("lm-eval[api]==0.4.13" "guidellm==0.8.1")
if ! "$venv/bin/python" -c 'import lm_eval, guidellm, tenacity' 2>/dev/null; then
  echo "test-server: creating $venv with ${pins[*]} (once; later runs reuse it)"
  if ! python3 -m venv --system-site-packages "$venv" ||
     ! "$venv/bin/python" -m pip install --progress-bar off "${pins[@]}" | grep -E "^(Collecting|Successfully)" ; then
    echo "test-server: FAILED to create the clients venv at $venv"
    echo "$p1 passed, $((f1 + 1)) failed"
    exit 1
  fi
fi
echo "== reasoning output and tool-call formats ($venv: HF tokenizers as the reference)"
"$venv/bin/python" "$here/test_reasoning.py" --bin "$bin" --model "$model" | tee "$log"
read -r pr _ fr _ < <(tail -1 "$log") || { pr=0; fr=1; }
case "$pr$fr" in *[!0-9]*|'') pr=0; fr=1 ;; esac
p1=$((p1 + pr)); f1=$((f1 + fr))
echo "== third-party clients ($venv)"
"$venv/bin/python" "$here/test_clients.py" --bin "$bin" --model "$model" --venv-bin "$venv/bin" | tee "$log"
read -r p2 _ f2 _ < <(tail -1 "$log") || { p2=0; f2=1; }
case "$p2$f2" in *[!0-9]*|'') p2=0; f2=1 ;; esac
case "$p1$f1" in *[!0-9]*|'') p1=0; f1=1 ;; esac
echo "$((p1 + p2)) passed, $((f1 + f2)) failed"
[ $((f1 + f2)) -eq 0 ]
