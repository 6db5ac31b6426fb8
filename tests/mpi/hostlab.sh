#!/usr/bin/env bash
# tests/mpi/hostlab.sh MPI BIN DEMO_MODEL — make test-mpi, the per-host lab
# (scripts/hostlab.sh), root only:
#   1. clean-up: no namespace and no temporary file of the lab is left after
#      a command that succeeds, one that fails (its status comes back), and a
#      SIGINT (130); bad --rate / --hosts are refused before anything is made;
#   2. placement: mpirun -np 2 puts rank i in host i's namespace, whose lab0
#      (and its switch port) are shaped with tbf; --host-cores shapes to the
#      compute-matched rate, and to today's lab at the lab's own share;
#   3. exact outputs equal: echo-generate under mpirun in 2 hosts at 1 Gbit/s
#      (exact and echo all-reduces) gives the same bits (tokens and logprobs)
#      as 2 ranks as threads without a lab; the same with the one-shot
#      all-reduce (ECHO_ONESHOT_BYTES), which leaves exact's bits unchanged;
#   3b. prefill overlap: exact's bits of a 160-token prompt as 2 micro-batches
#      in 2 hosts equal the serial pass on threads;
#   4. echo-serve under mpirun in the lab answers a few requests
#      (scripts/ttft-ab.sh --lab hostlab, exact vs echo).
# Every run is bounded by `timeout`; about a minute on 2 cores.
set -u
have=$1 bin=$2 demo=$3
lab=scripts/hostlab.sh
if [ "$have" != 1 ]; then
    echo "test-mpi hostlab: skipped: this build has no Open MPI (MPI=0)"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v tc >/dev/null || ! command -v mpirun >/dev/null; then
    echo "test-mpi hostlab: skipped (needs root, tc and Open MPI)"
    exit 0
fi
fail=0 checks=0
ok() { checks=$((checks + 1)); }
bad() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -z "${HOSTLAB_KEEP:-}" ] || trap 'echo "kept $tmp"' EXIT
# nothing of run PID is left: no namespace echo-hlPID-*, no agent directory
left() { # file holding "NS0 NS1 ..." as the command saw it
    local n
    for n in $(cat "$1" 2>/dev/null) "${2:-}"; do
        [ -n "$n" ] && ip netns list | grep -q "^$n\b" && { echo "namespace $n"; return 0; }
    done
    return 1
}
ns_of() { ip netns identify "$1" 2>/dev/null; }

# 1. success, failure, SIGINT, bad arguments
timeout 60 "$lab" --hosts 3 --rate 1gbit -- sh -c 'echo "$ECHO_HOSTLAB_NS" > '"$tmp"'/ns1;
    echo "$OMPI_MCA_plm_rsh_agent" > '"$tmp"'/agent1; tc qdisc show dev lab0 | grep -q tbf'
rc=$?
agent=$(cat "$tmp/agent1" 2>/dev/null)
if [ $rc = 0 ] && [ "$(wc -w <"$tmp/ns1")" = 3 ] && ! left "$tmp/ns1" "$(cut -d' ' -f1 "$tmp/ns1" | sed 's/-h0$/-sw/')" &&
    [ -n "$agent" ] && [ ! -e "$agent" ]; then ok
else bad "hostlab success: rc $rc, ns '$(cat "$tmp/ns1" 2>/dev/null)', agent '$agent', left: $(ip netns list)"; fi
timeout 60 "$lab" -- sh -c 'echo "$ECHO_HOSTLAB_NS" > '"$tmp"'/ns2; exit 3'
rc=$?
if [ $rc = 3 ] && [ -s "$tmp/ns2" ] && ! left "$tmp/ns2"; then ok; else bad "hostlab failing command: rc $rc (want 3)"; fi
# env --default-signal: a run that inherited SIGINT ignored still tests the trap
# (bash cannot trap a signal ignored on entry)
set -m
env --default-signal=INT "$lab" --hosts 2 --rate 2.5gbit -- sh -c 'echo "$ECHO_HOSTLAB_NS" > '"$tmp"'/ns3; sleep 60' &
pid=$!
set +m
for _ in $(seq 50); do [ -s "$tmp/ns3" ] && break; sleep 0.1; done
kill -INT "$pid"
wait "$pid"
rc=$?
if [ $rc = 130 ] && [ -s "$tmp/ns3" ] && ! left "$tmp/ns3"; then ok; else bad "hostlab SIGINT: rc $rc (want 130)"; fi
before=$(ip netns list | wc -l)
"$lab" --rate fast -- true 2>/dev/null
rc1=$?
"$lab" --hosts 0 -- true 2>/dev/null
rc2=$?
if [ $rc1 = 2 ] && [ $rc2 = 2 ] && [ "$(ip netns list | wc -l)" = "$before" ]; then ok
else bad "hostlab bad arguments: rc $rc1, $rc2 (want 2, 2)"; fi

# 2. one rank per host, each host shaped
if timeout 120 "$lab" --hosts 2 --rate 1gbit -- sh -c 'echo "$ECHO_HOSTLAB_NS" > '"$tmp"'/ns4;
    mpirun -np 2 sh -c "echo \$OMPI_COMM_WORLD_RANK \$(ip netns identify \$\$) \$(tc qdisc show dev lab0 | grep -c tbf)"' \
    >"$tmp/place" 2>"$tmp/place.err" &&
    python3 - "$tmp/place" "$tmp/ns4" <<'PY'; then ok; else bad "hostlab placement: $(cat "$tmp/place" "$tmp/place.err")"; fi
import sys
got = sorted(l.split() for l in open(sys.argv[1]) if l.strip())
ns = open(sys.argv[2]).read().split()
assert got == [["0", ns[0], "1"], ["1", ns[1], "1"]], (got, ns)
PY
if left "$tmp/ns4"; then bad "placement run left a namespace"; fi

# 2b. --host-cores: 4 hosts on a machine of 2 cores (HOSTLAB_MACHINE_CORES,
#     so the figures do not depend on this machine) standing for 8-core hosts
#     on 1 Gbit/s are shaped to 1e9 x 0.5 / 8 = 62.5 Mbit/s; standing for
#     hosts of the lab's own share (0.5 core) the lab is today's (tc shows
#     the same qdisc as without --host-cores); a bad count is refused
qd() { # ARGS... -> host 0's tc qdisc line, rate and burst only
    HOSTLAB_MACHINE_CORES=2 timeout 60 "$lab" --hosts 4 "$@" -- tc qdisc show dev lab0 2>/dev/null |
        grep -o 'rate [^ ]* burst [^ ]*'
}
plain=$(qd --rate 1gbit) own=$(qd --rate 1gbit --host-cores 0.5) eight=$(qd --rate 1gbit --host-cores 8)
said=$(HOSTLAB_MACHINE_CORES=2 timeout 60 "$lab" --hosts 4 --rate 1gbit --host-cores 8 -- true 2>&1)
if [ -n "$plain" ] && [ "$own" = "$plain" ] && [ "${eight%% burst*}" = "rate 62500Kbit" ] &&
    [[ "$said" == *"standing for hosts of 8 cores on 1gbit"*"62.5 Mbit/s"* ]]; then ok
else bad "hostlab --host-cores: plain '$plain', own share '$own', 8 cores '$eight', said '$said'"; fi
before=$(ip netns list | wc -l)
if ! "$lab" --host-cores 0 -- true 2>/dev/null && ! "$lab" --host-cores x8 -- true 2>/dev/null &&
    [ "$(ip netns list | wc -l)" = "$before" ]; then ok; else bad "hostlab --host-cores: a bad count was taken"; fi

# 3. exact outputs equal between the shaped lab and ranks as threads, with
#    the two-shot and the one-shot all-reduce (ECHO_ONESHOT_BYTES, both
#    sides); exact's bits do not change with one-shot, echo's do (so the
#    variable reached the ranks)
M=tests/fixtures/models
for mode in exact echo exact:oneshot echo:oneshot; do
    os=0
    [ "${mode#*:}" = oneshot ] && os=1048576
    args=(--model "$M/gqa4-deep" --prompt-tokens 3,1,4,1,5,9,2,6,5,3,5,8,9,7 --max-tokens 8 --temperature 0
          --ignore-eos --top-logprobs 3 --json --tp 2 --allreduce "${mode%:*}" --threads 1)
    ECHO_ONESHOT_BYTES=$os timeout 120 "$bin/echo-generate" "${args[@]}" >"$tmp/threads-${mode/:/-}.json" 2>/dev/null
    ECHO_ONESHOT_BYTES=$os timeout 180 "$lab" --hosts 2 --rate 1gbit -- mpirun -np 2 "$bin/echo-generate" "${args[@]}" \
        >"$tmp/lab.json" 2>"$tmp/lab.err"
    if [ -s "$tmp/threads-${mode/:/-}.json" ] && cmp -s "$tmp/threads-${mode/:/-}.json" "$tmp/lab.json"; then ok
    else bad "$mode: 2 hosts at 1 Gbit/s differ from --tp 2 threads: $(tail -3 "$tmp/lab.err")"; fi
done
if cmp -s "$tmp/threads-exact.json" "$tmp/threads-exact-oneshot.json"; then ok
else bad "exact: the one-shot all-reduce changed the output"; fi
if ! cmp -s "$tmp/threads-echo.json" "$tmp/threads-echo-oneshot.json"; then ok
else bad "echo: ECHO_ONESHOT_BYTES had no effect"; fi

# 3b. prefill overlap (engine/overlap.h): a 160-token prompt as 2 micro-batches
#     in the lab (--overlap 2) gives exact's bits of the serial pass on
#     threads (--overlap off); echo's bits change (so the overlap ran)
P=$(python3 -c "print(','.join(str((i * 37 + 11) % 200) for i in range(160)))")
for mode in exact echo; do
    args=(--model "$M/gqa4-deep" --prompt-tokens "$P" --max-tokens 4 --temperature 0 --ignore-eos --top-logprobs 3
          --json --tp 2 --allreduce "$mode" --threads 1)
    timeout 120 "$bin/echo-generate" "${args[@]}" --overlap off >"$tmp/ov-threads-$mode.json" 2>/dev/null
    timeout 180 "$lab" --hosts 2 --rate 1gbit -- mpirun -np 2 "$bin/echo-generate" "${args[@]}" --overlap 2 \
        >"$tmp/ov-lab-$mode.json" 2>"$tmp/ov-lab.err"
    [ -s "$tmp/ov-threads-$mode.json" ] && [ -s "$tmp/ov-lab-$mode.json" ] || bad "$mode overlap: no output: $(tail -3 "$tmp/ov-lab.err")"
done
if cmp -s "$tmp/ov-threads-exact.json" "$tmp/ov-lab-exact.json"; then ok
else bad "exact: --overlap 2 in 2 hosts differs from the serial pass on threads"; fi
if [ -s "$tmp/ov-lab-echo.json" ] && ! cmp -s "$tmp/ov-threads-echo.json" "$tmp/ov-lab-echo.json"; then ok
else bad "echo: --overlap 2 had no effect in the lab"; fi

# 4. the server in the lab: a few requests per all-reduce
if timeout 300 scripts/ttft-ab.sh --link 1gbit --lab hostlab --model "$demo" --tp 2 --device cpu --modes exact,echo \
    --bench "$bin/echo-bench" --serve "$bin/echo-serve" --out "$tmp/ab" --probe-prompts 0 --no-plot \
    --num-prompts 3 --input-len 32 --output-len 4 --ignore-eos --max-concurrency 1 --no-progress \
    >"$tmp/ab.log" 2>&1 && grep -q '^| exact | 3/0 |' "$tmp/ab/summary.md" &&
    grep -q '^| echo | 3/0 |' "$tmp/ab/summary.md"; then ok
else bad "ttft-ab.sh --lab hostlab: $(tail -5 "$tmp/ab.log")"; fi
if ip netns list | grep -q '^echo-hl'; then bad "a host-lab namespace is left: $(ip netns list)"; else ok; fi
echo "test-mpi hostlab: $checks checks passed, $([ $fail = 0 ] && echo 0 || echo some) failed"
exit $fail
