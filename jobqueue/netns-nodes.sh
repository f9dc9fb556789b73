#!/usr/bin/env bash
# Several "nodes" on one machine, each with a network stack of its own: N network namespaces, each
# joined to a bridge in the root namespace by a veth pair, so every byte between two nodes (and
# between a node and the root namespace) crosses real links. Optionally each link is rate-limited
# with tc's token bucket filter (both directions; netem is not available on these machines).
#
#   jobqueue/netns-nodes.sh up N [--rate RATE]    make nodes 1..N (RATE: tc's form, e.g. 1gbit)
#   jobqueue/netns-nodes.sh down                  stop every process in them, remove them
#   jobqueue/netns-nodes.sh status                the nodes, their addresses and their links' counters
#   jobqueue/netns-nodes.sh exec K CMD...         run CMD in node K (as: ip netns exec tjn-K CMD...)
#   jobqueue/netns-nodes.sh address K             node K's address (0: the root namespace's, on the bridge)
#
# Node K is the namespace tjn-K with the address 10.77.0.(10+K)/24 on its end of the veth pair
# tjn-K-n; the other end, tjn-K-h, is a port of the bridge tjn-br (10.77.0.1/24) in the root
# namespace. Start a Dask scheduler on 10.77.0.1 and workers in the nodes (--host their address),
# and tjn-K-h's rx_bytes/tx_bytes count what node K sent/received. Needs root (CI runs as root).
# TIANJI_NETNS_PREFIX and TIANJI_NETNS_SUBNET (the first three octets) change the names and addresses.
set -euo pipefail

P=${TIANJI_NETNS_PREFIX:-tjn}
NET=${TIANJI_NETNS_SUBNET:-10.77.0}
BR=$P-br

die() { echo "netns-nodes.sh: $*" >&2; exit 2; }
nodes() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$P-[0-9]+$" | sort -t- -k2 -n || true; }
address() { if [ "$1" = 0 ]; then echo "$NET.1"; else echo "$NET.$((10 + $1))"; fi; }

limit() {  # limit DEV [NETNS] RATE: a token bucket on the device's egress
    local dev=$1 ns=$2 rate=$3
    # burst: at least rate / HZ; 1 MiB keeps gigabit rates exact with 250 Hz kernels
    if [ -n "$ns" ]; then
        ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst 1mb latency 100ms
    else
        tc qdisc replace dev "$dev" root tbf rate "$rate" burst 1mb latency 100ms
    fi
}

up() {
    local n=${1:-}
    shift || true
    local rate=""
    while [ $# -gt 0 ]; do
        case $1 in
            --rate) rate=${2:?--rate needs a value, e.g. 1gbit}; shift 2 ;;
            *) die "unknown argument $1 (up N [--rate RATE])" ;;
        esac
    done
    [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "up needs a node count from 1 to 200, got '${n}'"
    [ "$(id -u)" = 0 ] || die "needs root (network namespaces and links)"
    [ -z "$(nodes)" ] || die "nodes already up ($(nodes | tr '\n' ' ')); run down first"
    ip link add "$BR" type bridge
    ip addr add "$(address 0)/24" dev "$BR"
    ip link set "$BR" up
    for k in $(seq 1 "$n"); do
        local ns=$P-$k host=$P-$k-h node=$P-$k-n
        ip netns add "$ns"
        ip link add "$host" type veth peer name "$node"
        ip link set "$host" master "$BR"
        ip link set "$host" up
        ip link set "$node" netns "$ns"
        ip -n "$ns" addr add "$(address "$k")/24" dev "$node"
        ip -n "$ns" link set "$node" up
        ip -n "$ns" link set lo up
        if [ -n "$rate" ]; then
            limit "$host" "" "$rate"   # into the node
            limit "$node" "$ns" "$rate" # out of the node
        fi
    done
    echo "netns-nodes.sh: $n node(s) up on $BR ($(address 0)); node K at $NET.(10+K)${rate:+, links limited to $rate}"
}

down() {
    for ns in $(nodes); do
        local pids
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    # a namespace's links go with it, but the kernel may take a moment: remove the host ends now
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^$P-[0-9]+-h$" || true); do
        ip link del "$link" 2>/dev/null || true
    done
    ip link del "$BR" 2>/dev/null || true
}

status() {
    local all
    all=$(nodes)
    [ -n "$all" ] || { echo "no nodes"; return 0; }
    for ns in $all; do
        local k=${ns##*-} host=$P-${ns##*-}-h
        echo "$ns $(address "$k") rx_bytes=$(cat /sys/class/net/$host/statistics/rx_bytes) tx_bytes=$(cat /sys/class/net/$host/statistics/tx_bytes) processes=$(ip netns pids "$ns" | wc -l)"
    done
}

case ${1:-} in
    up) shift; up "$@" ;;
    down) down ;;
    status) status ;;
    exec) k=${2:?exec K CMD...}; shift 2; exec ip netns exec "$P-$k" "$@" ;;
    address) address "${2:?address K}" ;;
    *) die "usage: $0 up N [--rate RATE] | down | status | exec K CMD... | address K" ;;
esac
