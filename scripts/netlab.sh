#!/usr/bin/env bash
# scripts/netlab.sh — run a command in a private network namespace whose
# loopback is shaped to a link rate, so that ranks under mpirun talk over a
# slow link instead of shared memory (docs/network.md).
#
#   scripts/netlab.sh [--rate 1gbit|2.5gbit|10gbit|none|TC_RATE] [--] COMMAND...
#
# - `ip netns add echo-lab-PID`, loopback up, and for a rate a token bucket
#   (`tc qdisc add dev lo root tbf`). No netem: no added delay. Every
#   process in the namespace shares that one shaped loopback, so the rate is
#   the total for all ranks (a bus, not a link per rank).
# - COMMAND runs inside it with Open MPI pointed at loopback TCP
#   (OMPI_MCA_btl=self,tcp, btl/oob_tcp_if_include=lo: Open MPI leaves
#   loopback out by default and would otherwise use shared memory), and
#   allowed to run as root.
# - The namespace is deleted on exit, on failure and on Ctrl-C/TERM; the
#   script exits with COMMAND's status (130/143 when interrupted).
# Needs root, `ip` and `tc` (iproute2). Traffic never leaves the namespace.
set -u

usage() {
    echo "usage: scripts/netlab.sh [--rate 1gbit|2.5gbit|10gbit|none|TC_RATE] [--] COMMAND..." >&2
    exit 2
}

rate=none
while [ $# -gt 0 ]; do
    case "$1" in
    --rate) [ $# -ge 2 ] || usage; rate=$2; shift 2 ;;
    --rate=*) rate=${1#--rate=}; shift ;;
    --) shift; break ;;
    -h | --help) usage ;;
    -*) usage ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || usage
case "$rate" in
none | [0-9]*bit | [0-9]*.[0-9]*bit) ;;
*) echo "netlab: rate '$rate' is not 'none' nor a tc rate such as 1gbit, 2.5gbit, 500mbit" >&2; exit 2 ;;
esac
if [ "$(id -u)" != 0 ]; then echo "netlab: needs root (ip netns, tc)" >&2; exit 2; fi
for t in ip tc; do
    command -v "$t" >/dev/null || { echo "netlab: '$t' not found (apt-get install iproute2)" >&2; exit 2; }
done

ns=echo-lab-$$
child=
created=0
cleanup() {
    # a command still running (we were interrupted) goes first
    if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
        kill -TERM -- "-$child" 2>/dev/null
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$child" 2>/dev/null || break; sleep 0.2; done
        kill -KILL -- "-$child" 2>/dev/null
    fi
    # only ours: a namespace of that name made by someone else stays
    [ $created = 0 ] || ip netns del "$ns" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$ns" || exit 1
created=1
ip netns exec "$ns" ip link set lo up || exit 1
if [ "$rate" != none ]; then
    # The link: jumbo frames (MTU 9000 rather than loopback's 64 KiB, so
    # packets are link-sized); a bucket of 2 ms at the rate, at least 64 KiB:
    # small enough that a message does not slip through unshaped (a 10 ms
    # bucket let 1 MiB calls through at memory speed), large enough that a
    # late timer on this loaded machine does not lose tokens. latency: how
    # long a packet may queue before tbf drops it, long enough that TCP
    # never sees a drop. TCP keeps its window between calls
    # (tcp_slow_start_after_idle=0, as on cluster hosts; per namespace).
    # NETLAB_MTU / NETLAB_BURST (bytes) override. docs/network.md checks
    # the rate with 64 MiB all-reduces.
    bps=$(awk -v r="$rate" 'BEGIN{ n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u);
        m = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : 1; printf "%d", n * m }')
    burst=$((bps / 8 / 500))
    [ "$burst" -ge 65536 ] || burst=65536
    ip netns exec "$ns" ip link set lo mtu "${NETLAB_MTU:-9000}" || exit 1
    ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_slow_start_after_idle=0 ||
        echo "netlab: warning: cannot set tcp_slow_start_after_idle=0 in the namespace" >&2
    ip netns exec "$ns" tc qdisc add dev lo root tbf rate "$rate" burst "${NETLAB_BURST:-$burst}" latency 100ms ||
        exit 1
fi

export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ECHO_NETLAB_NS=$ns ECHO_NETLAB_RATE=$rate ECHO_LAB=netlab
# In the background so that a signal reaches our trap at once (bash runs
# traps only between foreground commands), in a process group of its own
# (set -m) so that the clean-up can end all of it.
set -m
ip netns exec "$ns" "$@" &
child=$!
set +m
wait "$child"
rc=$?
child=
exit "$rc"
