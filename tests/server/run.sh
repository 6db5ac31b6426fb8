#!/usr/bin/env bash
# Server tests: a real bin/echo-serve on loopback, real curl, the official
# openai client and prometheus_client's text parser (pip-installed here when
# missing; if pip cannot install them the run fails, it never skips).
#   usage: tests/server/run.sh [--asan] ECHO_SERVE_BINARY MODEL_DIR
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
if ! python3 -c 'import openai, prometheus_client' 2>/dev/null; then
  echo "test-server: installing the test clients (openai, prometheus_client) with pip"
  if ! python3 -m pip install --quiet openai prometheus_client; then
    echo "test-server: FAILED to pip-install openai and prometheus_client (needed by the server tests)"
    echo "0 passed, 1 failed"
    exit 1
  fi
fi
if [ "$mode" = asan ]; then
  # Leaks are reported at exit (the harness sends SIGTERM and checks the log).
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fi
exec python3 "$here/test_server.py" --mode "$mode" --bin "$bin" --model "$model"
