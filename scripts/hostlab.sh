#!/usr/bin/env bash
# scripts/hostlab.sh — a lab of N "hosts" on one machine: each host is a
# network namespace with one veth into a bridge (a switch namespace), each
# host's link shaped both ways, and Open MPI set up to start one rank per
# host, so that ranks under mpirun talk like hosts with their own NICs
# (docs/network.md). scripts/netlab.sh instead shapes one shared loopback.
#
#   scripts/hostlab.sh [--hosts N] [--rate 1gbit|2.5gbit|10gbit|none|TC_RATE]
#                      [--host-cores C] [--] COMMAND...
#
# - --host-cores C: a compute-matched lab. The N hosts share this machine's
#   cores (M, `nproc`, $HOSTLAB_MACHINE_CORES overrides), so each computes
#   like a machine of M/N cores; to stand for hosts of C cores on a link of
#   R, every link is shaped to R x (M/N) / C, which keeps the ratio of wire
#   time to compute time that such hosts have (docs/network.md, "A
#   compute-matched lab"). C = M/N leaves R as it is. It prints what it
#   emulates and the shaped rate; ECHO_HOSTLAB_HOST_CORES and
#   ECHO_HOSTLAB_LINK_RATE (the rate asked for) are exported beside the rest.
# - Namespaces echo-hl<PID>-sw (the bridge) and echo-hl<PID>-h0..h<N-1>;
#   host i has interface `lab0` at 10.77.0.<i+1>/24 (MTU $HOSTLAB_MTU, 9000
#   by default), its switch port shaped too, so the rate holds each way:
#   tc tbf on the host's egress (lab0) and on its ingress (the switch
#   port's egress). No netem on this kernel: no added delay.
# - COMMAND runs in host 0 (so `mpirun` does: rank 0 runs beside it) with
#   Open MPI pointed at the lab: a hostfile of the N host addresses, one
#   slot each ($OMPI_MCA_orte_default_hostfile), an rsh agent that runs the
#   remote daemon in the namespace of the host it is given
#   ($OMPI_MCA_plm_rsh_agent), TCP over lab0 only, no binding (all hosts
#   share the machine's cores). So `mpirun -np N PROG` puts rank i on host i.
#   ECHO_HOSTLAB_HOSTS (comma-separated addresses), ECHO_HOSTLAB_NS (host
#   namespaces, space-separated), ECHO_HOSTLAB_RATE, and as netlab.sh does
#   ECHO_NETLAB_RATE (the rate) and ECHO_LAB (hostlab) are exported.
# - Everything (namespaces, their veths and bridge, the temporary agent and
#   hostfile) is deleted on exit, on failure and on Ctrl-C/TERM; the script
#   exits with COMMAND's status (130/143 when interrupted).
# Needs root, `ip` and `tc` (iproute2). Traffic never leaves the namespaces.
set -u

usage() {
    echo "usage: scripts/hostlab.sh [--hosts N] [--rate 1gbit|2.5gbit|10gbit|none|TC_RATE] [--host-cores C] [--] COMMAND..." >&2
    exit 2
}

hosts=2 rate=none host_cores=
while [ $# -gt 0 ]; do
    case "$1" in
    --rate) [ $# -ge 2 ] || usage; rate=$2; shift 2 ;;
    --rate=*) rate=${1#--rate=}; shift ;;
    --hosts) [ $# -ge 2 ] || usage; hosts=$2; shift 2 ;;
    --hosts=*) hosts=${1#--hosts=}; shift ;;
    --host-cores) [ $# -ge 2 ] || usage; host_cores=$2; shift 2 ;;
    --host-cores=*) host_cores=${1#--host-cores=}; shift ;;
    --) shift; break ;;
    -h | --help) sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) usage ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || usage
case "$rate" in
none | [0-9]*bit | [0-9]*.[0-9]*bit) ;;
*) echo "hostlab: rate '$rate' is not 'none' nor a tc rate such as 1gbit, 2.5gbit, 500mbit" >&2; exit 2 ;;
esac
case "$hosts" in
[1-9] | [1-9][0-9]) ;;
*) echo "hostlab: --hosts '$hosts' is not a count from 1 to 99" >&2; exit 2 ;;
esac
# --host-cores: the rate each link gets (before anything is made, so a bad
# value costs nothing)
link_rate=$rate
if [ -n "$host_cores" ]; then
    if ! awk -v c="$host_cores" 'BEGIN{ exit !(c ~ /^[0-9]+(\.[0-9]+)?$/ && c + 0 > 0 && c + 0 <= 4096) }'; then
        echo "hostlab: --host-cores '$host_cores' is not a core count in (0, 4096]" >&2; exit 2
    fi
    mcores=${HOSTLAB_MACHINE_CORES:-$(nproc)}
    # the shaped rate in kbit/s (tc takes integers); `none` stays none: an
    # unshaped link has no rate to scale
    share=$(awk -v m="$mcores" -v n="$hosts" 'BEGIN{ printf "%g", m / n }')
    if [ "$rate" = none ]; then
        echo "hostlab: $hosts hosts on $mcores cores ($share core(s) each) standing for hosts of $host_cores cores, link unshaped (--rate none)" >&2
    else
        kbit=$(awk -v r="$rate" -v m="$mcores" -v n="$hosts" -v c="$host_cores" 'BEGIN{ n0 = r + 0; u = tolower(r);
            sub(/^[0-9.]+/, "", u); k = u == "gbit" ? 1e6 : u == "mbit" ? 1e3 : u == "kbit" ? 1 : 1e-3;
            v = n0 * k * (m / n) / c; printf "%d", v < 8 ? 8 : v + 0.5 }')
        # the lab's own share: today's lab, the very rate asked for
        [ "$(awk -v m="$mcores" -v n="$hosts" -v c="$host_cores" 'BEGIN{ print (m / n == c) }')" = 1 ] || rate=${kbit}kbit
        echo "hostlab: $hosts hosts on $mcores cores ($share core(s) each) standing for hosts of $host_cores cores on $link_rate: each link shaped to $(awk -v k="$kbit" 'BEGIN{ printf "%.4g", k / 1e3 }') Mbit/s (tc rate $rate)" >&2
    fi
fi
if [ "$(id -u)" != 0 ]; then echo "hostlab: needs root (ip netns, tc)" >&2; exit 2; fi
for t in ip tc; do
    command -v "$t" >/dev/null || { echo "hostlab: '$t' not found (apt-get install iproute2)" >&2; exit 2; }
done

pre=echo-hl$$
sw=$pre-sw
made=()  # namespaces this run created, deleted in reverse
tmp=
child=
cleanup() {
    # a command still running (we were interrupted) goes first
    if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
        kill -TERM -- "-$child" 2>/dev/null
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$child" 2>/dev/null || break; sleep 0.2; done
        kill -KILL -- "-$child" 2>/dev/null
    fi
    # deleting a namespace deletes its veth end, and with it the peer; only
    # the namespaces this run made (a name taken by someone else stays)
    local i
    for ((i = ${#made[@]} - 1; i >= 0; i--)); do ip netns del "${made[i]}" 2>/dev/null; done
    [ -z "$tmp" ] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
mtu=${HOSTLAB_MTU:-9000}
if [ "$rate" != none ]; then
    # a bucket of 2 ms at the rate, at least 64 KiB (as netlab.sh, which
    # says why); latency: long enough that TCP never sees a drop
    bps=$(awk -v r="$rate" 'BEGIN{ n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u);
        m = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : 1; printf "%d", n * m }')
    burst=$((bps / 8 / 500))
    [ "$burst" -ge 65536 ] || burst=65536
    burst=${HOSTLAB_BURST:-$burst}
fi
shape() {  # namespace, device
    [ "$rate" = none ] && return 0
    in_ns "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency 100ms
}

ip netns add "$sw" || exit 1
made+=("$sw")
in_ns "$sw" ip link add br0 type bridge || exit 1
in_ns "$sw" ip link set br0 mtu "$mtu" up || exit 1
addrs=() nss=()
for ((i = 0; i < hosts; i++)); do
    ns=$pre-h$i addr=10.77.0.$((i + 1))
    ip netns add "$ns" || exit 1
    made+=("$ns")
    # both ends are created inside the namespaces: nothing in the root one
    ip link add lab0 netns "$ns" mtu "$mtu" type veth peer name p$i netns "$sw" mtu "$mtu" || exit 1
    in_ns "$sw" ip link set p$i master br0 up || exit 1
    in_ns "$ns" ip link set lo up || exit 1
    in_ns "$ns" ip addr add "$addr/24" dev lab0 || exit 1
    in_ns "$ns" ip link set lab0 up || exit 1
    # TCP keeps its window between calls, as on cluster hosts
    in_ns "$ns" sysctl -q -w net.ipv4.tcp_slow_start_after_idle=0 2>/dev/null ||
        echo "hostlab: warning: cannot set tcp_slow_start_after_idle=0 in $ns" >&2
    shape "$ns" lab0 || exit 1
    shape "$sw" p$i || exit 1
    addrs+=("$addr") nss+=("$ns")
done

# The rsh agent Open MPI runs as `AGENT [options] HOST COMMAND...`: it runs
# COMMAND (a shell line: the remote daemon) in HOST's namespace.
tmp=$(mktemp -d /tmp/echo-hostlab.XXXXXX) || exit 1
{
    echo '#!/bin/sh'
    echo '# generated by scripts/hostlab.sh: the host address -> its namespace'
    echo 'while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done'
    echo 'host=$1; shift'
    echo 'case "$host" in'
    for ((i = 0; i < hosts; i++)); do echo "${addrs[i]}) ns=${nss[i]} ;;"; done
    echo '*) echo "hostlab agent: unknown host $host" >&2; exit 255 ;;'
    echo 'esac'
    echo 'exec ip netns exec "$ns" /bin/sh -c "$*"'
} >"$tmp/agent"
chmod +x "$tmp/agent"
for a in "${addrs[@]}"; do echo "$a slots=1"; done >"$tmp/hostfile"

export OMPI_MCA_plm_rsh_agent=$tmp/agent OMPI_MCA_orte_default_hostfile=$tmp/hostfile
export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lab0 OMPI_MCA_oob_tcp_if_include=lab0
# the hosts share 2 cores: every rank yields when it waits (Open MPI does so
# by itself only when it sees a node oversubscribed; each host has 1 slot)
export OMPI_MCA_hwloc_base_binding_policy=none OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ECHO_HOSTLAB_HOSTS=$(IFS=,; echo "${addrs[*]}") ECHO_HOSTLAB_NS="${nss[*]}" ECHO_HOSTLAB_RATE=$rate
export ECHO_HOSTLAB_HOST_CORES=$host_cores ECHO_HOSTLAB_LINK_RATE=$link_rate
# what the lab scripts and echo-bench read to know they already run in a lab
export ECHO_LAB=hostlab ECHO_NETLAB_RATE=$rate
# In the background so that a signal reaches our trap at once, in a process
# group of its own (set -m) so that the clean-up can end all of it.
set -m
ip netns exec "${nss[0]}" "$@" &
child=$!
set +m
wait "$child"
rc=$?
child=
exit "$rc"
