#!/usr/bin/env bash
# tests/mpi/labsmoke.sh MPI BIN — make test-lab-smoke (part of make test), root
# only: the compute-matched lab (scripts/hostlab.sh --host-cores) and
# --allreduce auto in it. 4 hosts standing for 8-core machines on 1 Gbit/s
# (each link shaped to 1 Gbit/s x (cores / 4) / 8), echo-bench forward under
# mpirun -np 4 on the 2-layer random tiny shape (hidden 64):
#   - the lab says what it emulates and the shaped rate;
#   - auto measures the link within 0.2x..1.6x of the shaped rate (the fit's
#     bytes one rank sends per second, counted as the two-shot's 2(N-1)/N of
#     a message: MPI_Allreduce's own algorithm and TCP on 2 busy cores
#     deliver less; above the rate the shaping failed) and, with the wire
#     that slow, picks echo for prompt-size calls;
#   - no namespace of the run is left.
# About 20 s on 2 cores; every run bounded by `timeout`.
set -u
have=$1 bin=$2
if [ "$have" != 1 ]; then echo "test-lab-smoke: skipped: no Open MPI (MPI=0)"; exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v tc >/dev/null || ! command -v mpirun >/dev/null; then
    echo "test-lab-smoke: skipped (needs root, tc and Open MPI)"
    exit 0
fi
fail=0 checks=0
ok() { checks=$((checks + 1)); }
bad() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
timeout 300 scripts/hostlab.sh --hosts 4 --rate 1gbit --host-cores 8 -- sh -c 'echo "$ECHO_HOSTLAB_NS" >'"$tmp"'/ns;
    echo "$ECHO_HOSTLAB_RATE" >'"$tmp"'/rate;
    mpirun -np 4 '"$bin"'/echo-bench forward --model random:tiny,layers=2 --tp 4 --allreduce auto \
      --prefill 64 --ttft-len 128 --decode-batch 1 --decode-steps 2 --iters 1 --gemm-dim 0 --copy-bytes 1M \
      --threads 1 --json' >"$tmp/out.json" 2>"$tmp/err"
rc=$?
if [ $rc = 0 ] && python3 - "$tmp/out.json" "$tmp/rate" <<'PY'; then ok; else bad "lab smoke: rc $rc: $(tail -5 "$tmp/err")"; fi
import json, sys
j = json.load(open(sys.argv[1]))
a = j["allreduce_auto"]
kbit = int(open(sys.argv[2]).read().strip().removesuffix("kbit"))
want = kbit * 1e3 / 8 / 1e6  # MB/s
got = a["link_large"]["mbytes_s"]
assert 0.2 * want <= got <= 1.6 * want, (got, want)
assert a["large_calls"] == "echo" and j["allreduce"] == "echo", a
assert not a["shared_memory"], a
PY
if grep -q "standing for hosts of 8 cores on 1gbit: each link shaped to" "$tmp/err"; then ok
else bad "the lab did not say what it emulates: $(head -3 "$tmp/err")"; fi
for n in $(cat "$tmp/ns" 2>/dev/null); do
    ip netns list | grep -q "^$n\b" && bad "namespace $n left"
done
[ -s "$tmp/ns" ] && ok
echo "test-lab-smoke: $checks checks passed, $([ $fail = 0 ] && echo 0 || echo some) failed"
exit $fail
