#!/usr/bin/env bash
# local-slurm.sh: a real single-node Slurm (munge + slurmctld + slurmd) on this machine, for the
# tests (tests/test_local_slurm.py), CI (.ci/run), and users who want to try dask-jobqueue's
# SLURMCluster on one machine before they take it to a real cluster.
#
#   jobqueue/local-slurm.sh start  STATE_DIR   install the packages if missing, start the daemons,
#                                              wait until the node is idle (idempotent)
#   jobqueue/local-slurm.sh stop   STATE_DIR   cancel all jobs, stop exactly the daemons `start` ran
#   jobqueue/local-slurm.sh status STATE_DIR   which daemons run, and sinfo (exit 3: not running)
#   jobqueue/local-slurm.sh env    STATE_DIR   print `export SLURM_CONF=STATE_DIR/slurm.conf`, for
#                                              eval "$(jobqueue/local-slurm.sh env STATE_DIR)"
#
# start and stop need root (Debian/Ubuntu: apt-get installs slurmctld slurmd slurm-client munge
# with --no-install-recommends when they are missing; the daemons run as root with SlurmUser=root).
# Jobs may be submitted by any user. Everything the script writes lives under STATE_DIR: munge key
# and socket, slurm.conf, spool, pid and log files (STATE_DIR/log/*.log). It never touches /etc
# (beyond what apt-get install itself does) unless asked: LOCAL_SLURM_LINK_ETC=1 links
# /etc/slurm/slurm.conf to STATE_DIR/slurm.conf so that plain `sinfo` works without SLURM_CONF.
# STATE_DIR must be on a filesystem that allows exec (batch scripts run from the spool) and its
# path may hold only letters, digits and . _ + / - characters. No cgroups: Slurm neither enforces
# --mem nor the CPU count here. One node, loopback when the hostname resolves to 127.x.
# Other settings: LOCAL_SLURM_TIMEOUT (seconds to wait for the node to become idle, default 60);
# LOCAL_SLURM_GPUS (default 2): GPUs the node declares, by count only (no device is bound), so
# that jobs with --gres=gpu:N are scheduled as on a GPU cluster; 0 declares none.
# LOCAL_SLURM_NETNS (default none): names of network namespaces, as jobqueue/netns-nodes.sh makes
# them ("tjn-1 tjn-2"): then `start` makes one Slurm node per namespace, named after it, at its
# address, each with a slurmd of its own running inside it (so its jobs do too), and slurmctld
# listens in the root namespace on the address that reaches them; every node declares this
# machine's CPUs and memory. `stop` and `status` find the slurmds `start` ran without it.
set -euo pipefail

PROG="local-slurm.sh"
PACKAGES=(slurmctld slurmd slurm-client munge)
CLUSTER_NAME="tianji-local"   # tests/slurm_support.py checks for it before submitting anything
TIMEOUT="${LOCAL_SLURM_TIMEOUT:-60}"
GPUS="${LOCAL_SLURM_GPUS:-2}"

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { say "error: $*"; exit 1; }
usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}

now_ms() { date +%s%3N; }

# ---------------------------------------------------------------------------- arguments
[ $# -ge 1 ] || { say "error: missing command"; usage; }
CMD="$1"
case "$CMD" in
    start|stop|status|env) ;;
    -h|--help|help) usage ;;
    *) say "error: unknown command '$CMD'"; usage ;;
esac
[ $# -ge 2 ] && [ -n "$2" ] || { say "error: missing STATE_DIR (e.g. $PROG $CMD /tmp/tj-slurm)"; usage; }
[ $# -le 2 ] || { say "error: too many arguments"; usage; }
STATE="$(realpath -m -- "$2")"
[[ "$STATE" =~ ^[A-Za-z0-9._/+-]+$ ]] \
    || die "STATE_DIR '$STATE' may hold only letters, digits and . _ + / - (it goes into slurm.conf)"
[ "$STATE" != / ] || die "STATE_DIR must not be /"

if [ "$CMD" = start ] || [ "$CMD" = stop ]; then
    why="it installs packages and runs the daemons as root"
    [ "$CMD" = start ] || why="it stops daemons that run as root"
    [ "$(id -u)" -eq 0 ] || die "'$CMD' must be run as root ($why); try: sudo $0 $CMD $STATE"
fi

CONF="$STATE/slurm.conf"
LOG="$STATE/log"
PIDS="$STATE/pids"                       # what `start` recorded: "PID STARTTIME" per daemon
MUNGE_KEY_DIR="$STATE/munge/key"         # 0700: the key
MUNGE_RUN_DIR="$STATE/munge/run"         # 0755: the socket (munged wants o+x on its directory)
MUNGE_SOCKET="$MUNGE_RUN_DIR/munge.socket"
LOCAL_SLURM_NETNS="${LOCAL_SLURM_NETNS:-}"
read -r -a NETNS_NODES <<< "${LOCAL_SLURM_NETNS//,/ }"
SLURMDS=(slurmd)                         # the slurmd records: slurmd, or slurmd@NAMESPACE per node
if [ ${#NETNS_NODES[@]} -gt 0 ]; then
    SLURMDS=()
    for ns in "${NETNS_NODES[@]}"; do SLURMDS+=("slurmd@$ns"); done
fi
DAEMONS=(munged slurmctld "${SLURMDS[@]}")   # start order; stop goes the other way
CTLD_PORT=6819                           # slurmctld's with nodes in namespaces (6817 otherwise)
export SLURM_CONF="$CONF"

# ---------------------------------------------------------------------------- processes
# Field 22 of /proc/PID/stat (start time in clock ticks) pins a PID to one process, so a PID
# reused by something else after a crash is never killed.
proc_starttime() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"                  # fields after "(comm) "
    # shellcheck disable=SC2086
    set -- $stat                          # $1 is field 3 (state), so field 22 is $20
    [ "$1" != Z ] || return 1            # a zombie has exited
    printf '%s\n' "${20}"
}

# recorded_pid NAME: the PID start recorded for NAME, if that process still runs as NAME (a
# record slurmd@NAMESPACE is a slurmd).
recorded_pid() {
    local name="$1" pid start comm
    [ -r "$PIDS/$name" ] || return 1
    read -r pid start < "$PIDS/$name" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || return 1
    [ "$comm" = "${name%@*}" ] || return 1
    [ "$(proc_starttime "$pid" 2>/dev/null)" = "$start" ] || return 1
    printf '%s\n' "$pid"
}

running() { recorded_pid "$1" >/dev/null; }

# alive PID START: the process with this PID and start time still exists (not a zombie)
alive() { [ "$(proc_starttime "$1" 2>/dev/null)" = "$2" ]; }

# listed PID START: this process is still in the process table, possibly as a zombie
listed() {
    local stat want="$2"
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    # shellcheck disable=SC2086
    set -- $stat
    [ "${20}" = "$want" ]
}

# stop_daemons NAME...: SIGTERM each recorded, still-running daemon, wait for all to exit
# (SIGKILL after 30 s), forget their PIDs.
stop_daemons() {
    local name pid start waited=()
    for name in "$@"; do
        if pid="$(recorded_pid "$name")"; then
            read -r _ start < "$PIDS/$name"
            kill -TERM "$pid" 2>/dev/null || true
            waited+=("$name:$pid:$start")
        fi
    done
    local deadline=$(( $(now_ms) + 30000 )) item left
    while :; do
        left=()
        for item in "${waited[@]+"${waited[@]}"}"; do
            IFS=: read -r name pid start <<< "$item"
            alive "$pid" "$start" && left+=("$item")
        done
        [ ${#left[@]} -gt 0 ] || break
        if [ "$(now_ms)" -ge "$deadline" ]; then
            for item in "${left[@]}"; do
                IFS=: read -r name pid start <<< "$item"
                say "$name (pid $pid) did not exit within 30 s of SIGTERM: SIGKILL"
                kill -KILL "$pid" 2>/dev/null || true
            done
            sleep 0.5
            break
        fi
        sleep 0.1
    done
    # An exited daemon is a zombie until init reaps it (it is not our child): give init up to
    # 5 s, so that `ps` right after stop shows nothing.
    deadline=$(( $(now_ms) + 5000 ))
    for item in "${waited[@]+"${waited[@]}"}"; do
        IFS=: read -r name pid start <<< "$item"
        while listed "$pid" "$start" && [ "$(now_ms)" -lt "$deadline" ]; do sleep 0.05; done
    done
    for name in "$@"; do rm -f "$PIDS/$name"; done
}

# slurmstepd processes of this Slurm (they carry our SLURM_CONF in their environment) that
# outlived their job; normally none.
stray_stepds() {
    local p
    for p in /proc/[0-9]*; do
        [ "$(cat "$p/comm" 2>/dev/null)" = slurmstepd ] || continue
        { tr '\0' '\n' < "$p/environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$CONF" || continue
        printf '%s\n' "${p#/proc/}"
    done
}

# the nodes' states, one word when they agree (idle), else the distinct states joined by commas
node_state() { { sinfo -h -N -o '%T' 2>/dev/null || true; } | sort -u | paste -sd, -; }

port_busy() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# the slurmd records a start left (whatever LOCAL_SLURM_NETNS is now)
recorded_slurmds() {
    local f
    for f in "$PIDS"/slurmd "$PIDS"/slurmd@*; do [ -e "$f" ] && basename "$f"; done
    return 0
}

# netns_address NAMESPACE: its first global IPv4 address
netns_address() {
    ip netns exec "$1" ip -4 -o addr show scope global 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}'
}

# ctld_address: where slurmctld listens: 127.0.0.1, or with nodes in namespaces the root
# namespace's address on the way to the first one
ctld_address() {
    if [ ${#NETNS_NODES[@]} -eq 0 ]; then echo 127.0.0.1; return; fi
    local addr
    addr="$(netns_address "${NETNS_NODES[0]}")"
    [ -n "$addr" ] || die "network namespace ${NETNS_NODES[0]} has no IPv4 address (make the nodes with jobqueue/netns-nodes.sh up N)"
    ip -4 route get "$addr" | awk '{for (i = 1; i < NF; i++) if ($i == "src") {print $(i + 1); exit}}'
}

# ---------------------------------------------------------------------------- install
install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get to install them"
    say "installing ${missing[*]} (apt-get, --no-install-recommends)"
    # Without systemd, the packages' postinst would start the system-wide daemons through
    # invoke-rc.d; a policy-rc.d that exits 101 forbids that. Create one only if there is none.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# temporary, from %s: no service starts during apt-get install\nexit 101\n' \
            "$PROG" > "$policy"
        chmod 0755 "$policy"
        made_policy=1
    fi
    local rc=0 aptlog="$LOG/apt.log"
    {
        apt-get -o DPkg::Lock::Timeout=300 update &&
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y \
            --no-install-recommends "${PACKAGES[@]}"
    } > "$aptlog" 2>&1 < /dev/null || rc=$?
    [ "$made_policy" -eq 0 ] || rm -f "$policy"
    if [ "$rc" -ne 0 ]; then
        tail -n 20 "$aptlog" >&2
        die "apt-get install ${PACKAGES[*]} failed (exit $rc); full output in $aptlog"
    fi
    say "installed (apt-get output in $aptlog)"
}

# ---------------------------------------------------------------------------- slurm.conf
write_conf() {
    local host="$1" ctld="$2" hw addr loopback=0
    # CPUs, sockets, cores, threads and RealMemory as slurmd itself sees them.
    hw="$(SLURM_CONF=/dev/null slurmd -C 2>/dev/null | head -n1)" || true
    [[ "$hw" == NodeName=* ]] || die "slurmd -C gave no node line (got: '$hw')"
    hw="${hw#NodeName=* }"
    # Slurm binds to what gethostname() resolves to; loopback-only flags work only when that is 127.x.
    addr="$(getent ahostsv4 "$host" 2>/dev/null | awk 'NR==1 {print $1}')" || true
    [[ "$addr" == 127.* ]] && loopback=1
    local tmp="$CONF.tmp" node_suffix=""
    # several slurmds share this filesystem: each its own spool, pid and log file (%n: its node)
    [ ${#NETNS_NODES[@]} -eq 0 ] || node_suffix="-%n"
    cat > "$tmp" <<EOF
# Written by jobqueue/local-slurm.sh; rewritten on every cold start. Single node, no database.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$host($ctld)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d$node_suffix
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd$node_suffix.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd$node_suffix.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups: Slurm does not enforce --mem or the CPU count
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# without DefMemPerCPU a job without --mem takes all of the node's memory and jobs serialize
DefMemPerCPU=1024
# reject impossible jobs at sbatch time instead of leaving them PENDING forever
EnforcePartLimits=ALL
AccountingStorageType=accounting_storage/none
# jobcomp/filetxt makes \`sacct -c\` work without slurmdbd (plain sacct does not)
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.txt
SchedulerType=sched/backfill
ReturnToService=2
KillWait=5
InactiveLimit=0
EOF
    if [ ${#NETNS_NODES[@]} -gt 0 ]; then
        # slurmctld listens on every address (NoCtldInAddrAny binds to what the hostname resolves
        # to, not to the bridge), on a port of its own so that a single-node Slurm can run beside
        # it; each slurmd listens in a network stack of its own
        echo "SlurmctldPort=$CTLD_PORT" >> "$tmp"
    elif [ "$loopback" -eq 1 ]; then
        echo "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" >> "$tmp"
    else
        echo "# $host resolves to '${addr:-nothing}', not 127.x: the daemons listen on all addresses" >> "$tmp"
    fi
    local gres=""
    [[ "$GPUS" =~ ^[0-9]+$ ]] || die "LOCAL_SLURM_GPUS must be a count of GPUs, got '$GPUS'"
    rm -f "$STATE/gres.conf" "$STATE"/fake-gpu*
    if [ "$GPUS" -gt 0 ]; then
        # Slurm counts a GPU per device file; plain files stand in for them (no cgroups here, so
        # nothing is bound): jobs asking for GPUs are scheduled as on a GPU node
        echo "GresTypes=gpu" >> "$tmp"
        gres="Gres=gpu:$GPUS"
        local k
        for k in $(seq 0 $((GPUS - 1))); do : > "$STATE/fake-gpu$k"; done
        echo "AutoDetect=off" > "$STATE/gres.conf"
    fi
    local names=() node node_addr
    if [ ${#NETNS_NODES[@]} -eq 0 ]; then
        echo "NodeName=$host NodeAddr=127.0.0.1 $hw $gres State=UNKNOWN" >> "$tmp"
        names=("$host")
    else
        for node in "${NETNS_NODES[@]}"; do
            node_addr="$(netns_address "$node")"
            [ -n "$node_addr" ] || die "network namespace $node has no IPv4 address (is it one of jobqueue/netns-nodes.sh's?)"
            echo "NodeName=$node NodeAddr=$node_addr $hw $gres State=UNKNOWN" >> "$tmp"
            names+=("$node")
        done
    fi
    if [ "$GPUS" -gt 0 ]; then
        for node in "${names[@]}"; do
            printf "NodeName=%s Name=gpu File=%s/fake-gpu[0-%d]\n" "$node" "$STATE" $((GPUS - 1)) >> "$STATE/gres.conf"
        done
    fi
    local joined
    joined="$(IFS=,; echo "${names[*]}")"
    echo "PartitionName=debug Nodes=$joined Default=YES MaxTime=INFINITE State=UP" >> "$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$CONF"
}

# ---------------------------------------------------------------------------- start
# launch NAME CMD...: run a daemon in its foreground mode, detached into its own session, stdio
# to its log; record "PID STARTTIME". setsid does not fork here (a background job of a
# non-interactive shell is no process-group leader), so $! is the daemon itself; checked below.
launch() {
    local name="$1" pid start comm; shift
    setsid "$@" </dev/null >>"$LOG/$name.stdout.log" 2>&1 &
    pid=$!
    local deadline=$(( $(now_ms) + 3000 ))
    while :; do   # the forked shell execs setsid, which execs the daemon
        comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || comm=""
        start="$(proc_starttime "$pid")" || start=""
        [ -n "$start" ] || break
        [ "$comm" != "${name%@*}" ] || break
        [ "$(now_ms)" -lt "$deadline" ] || break
        sleep 0.02
    done
    if [ -z "$start" ]; then
        fail_start "$name exited right after start"
    elif [ "$comm" != "${name%@*}" ]; then
        fail_start "pid $pid of $name runs '$comm', not ${name%@*}"
    fi
    echo "$pid $start" > "$PIDS/$name"
}

fail_start() {
    say "error: $1"
    local d f
    for d in "${DAEMONS[@]}"; do   # the daemon's log, or its stdout/stderr when it wrote none
        f="$LOG/$d.log"
        [[ "$d" != slurmd@* ]] || f="$LOG/slurmd-${d#slurmd@}.log"
        [ -s "$f" ] || f="$LOG/$d.stdout.log"
        [ -s "$f" ] || continue
        say "---- last lines of $f"
        tail -n 12 "$f" >&2
    done
    say "logs: $LOG/{munged,slurmctld,slurmd*}.log and $LOG/*.stdout.log; stopping what was started"
    # shellcheck disable=SC2046
    stop_daemons $(recorded_slurmds) slurmctld munged
    exit 1
}

cmd_start() {
    local t0 host d all=1
    t0="$(now_ms)"
    for d in "${DAEMONS[@]}"; do running "$d" || all=0; done
    if [ "$all" -eq 1 ]; then
        local st; st="$(node_state)"
        if [[ "$st" =~ ^(idle|mixed|allocated|completing)$ ]]; then
            say "already running ($STATE); nodes $st"
            return 0
        fi
        say "daemons run but the node is '${st:-not answering}': restarting"
    fi
    for d in "${DAEMONS[@]}"; do
        if running "$d"; then
            say "some daemons run, others do not: stopping the rest for a cold start"
            # shellcheck disable=SC2046
            stop_daemons $(recorded_slurmds) slurmctld munged
            break
        fi
    done

    mkdir -p "$LOG"
    install_packages
    local p ctld ports=(6817 6818)
    ctld="$(ctld_address)"
    [ -n "$ctld" ] || die "no address of this machine reaches ${NETNS_NODES[0]}"
    [ ${#NETNS_NODES[@]} -eq 0 ] || ports=("$CTLD_PORT")   # the slurmds listen in their namespaces
    for p in "${ports[@]}"; do
        port_busy "$ctld" "$p" && die "port $p on $ctld is in use: is another Slurm running? (stop it first)"
    done

    mkdir -p "$STATE"
    chmod 0755 "$STATE"   # munged wants its socket directory reachable by all users
    mkdir -p "$LOG" "$PIDS" "$STATE/run" "$MUNGE_KEY_DIR" "$MUNGE_RUN_DIR"
    chmod 0755 "$LOG" "$STATE/run" "$STATE/munge" "$MUNGE_RUN_DIR"
    chmod 0700 "$MUNGE_KEY_DIR" "$PIDS"
    # a cold start forgets old jobs: fresh spool (job ids restart at 1)
    rm -rf "$STATE/spool"
    mkdir -p "$STATE/spool/ctld" "$STATE/spool/d"
    chmod 0755 "$STATE/spool" "$STATE/spool/ctld" "$STATE/spool/d"
    for p in "${NETNS_NODES[@]+"${NETNS_NODES[@]}"}"; do
        ip netns exec "$p" true 2>/dev/null || die "LOCAL_SLURM_NETNS names $p, which is no network namespace (jobqueue/netns-nodes.sh up N makes them)"
        mkdir -p "$STATE/spool/d-$p"
        chmod 0755 "$STATE/spool/d-$p"
    done
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock" "$STATE"/run/*.pid

    # batch scripts are executed from the spool, so the filesystem must allow exec
    local probe="$STATE/spool/d/.exec-probe"
    printf '#!/bin/sh\nexit 0\n' > "$probe"; chmod 0755 "$probe"
    "$probe" 2>/dev/null || die "$STATE is on a filesystem mounted noexec; pick another STATE_DIR"
    rm -f "$probe"

    # the munge key is kept across restarts
    if [ ! -s "$MUNGE_KEY_DIR/munge.key" ]; then
        (umask 077; head -c 1024 /dev/urandom > "$MUNGE_KEY_DIR/munge.key")
    fi
    chmod 0400 "$MUNGE_KEY_DIR/munge.key"

    host="$(hostname -s)"
    [ -n "$host" ] || die "hostname -s is empty"
    write_conf "$host" "$ctld"

    launch munged munged -F --key-file="$MUNGE_KEY_DIR/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$STATE/run/munged.pid" --log-file="$LOG/munged.log" \
        --seed-file="$STATE/munge/munged.seed"
    local deadline=$(( $(now_ms) + 10000 ))
    until munge -S "$MUNGE_SOCKET" -n 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; do
        running munged || fail_start "munged exited"
        [ "$(now_ms)" -lt "$deadline" ] || fail_start "munged does not answer on $MUNGE_SOCKET after 10 s"
        sleep 0.05
    done

    launch slurmctld slurmctld -D -i -f "$CONF"
    if [ ${#NETNS_NODES[@]} -eq 0 ]; then
        launch slurmd slurmd -D -N "$host" -f "$CONF"
    else
        for p in "${NETNS_NODES[@]}"; do
            # nsenter, not ip netns exec: that mounts a sysfs of the namespace over /sys, which hides
            # /sys/fs/cgroup from slurmd
            launch "slurmd@$p" nsenter --net="/var/run/netns/$p" slurmd -D -N "$p" -f "$CONF"
        done
    fi

    deadline=$(( $(now_ms) + TIMEOUT * 1000 ))
    local state=""
    while :; do
        state="$(node_state)"
        [ "$state" = idle ] && break
        for d in "${DAEMONS[@]}"; do running "$d" || fail_start "$d exited"; done
        [ "$(now_ms)" -lt "$deadline" ] \
            || fail_start "nodes not idle after ${TIMEOUT} s (sinfo says '${state:-nothing}')"
        sleep 0.1
    done

    if [ "${LOCAL_SLURM_LINK_ETC:-0}" = 1 ]; then
        mkdir -p /etc/slurm
        if [ -L /etc/slurm/slurm.conf ] || [ ! -e /etc/slurm/slurm.conf ]; then
            ln -sfn "$CONF" /etc/slurm/slurm.conf
            say "linked /etc/slurm/slurm.conf -> $CONF"
        else
            say "warning: /etc/slurm/slurm.conf is a real file; left it alone (use SLURM_CONF)"
        fi
    fi
    local t1; t1="$(now_ms)"
    say "started in $(( (t1 - t0) / 1000 )).$(printf '%03d' $(( (t1 - t0) % 1000 ))) s: $(sinfo -h -N -o %N | paste -sd' ' -) idle ($STATE)"
    say "use it with: eval \"\$($0 env $STATE)\""
}

# ---------------------------------------------------------------------------- stop
# the daemons a start left, slurmds included whatever LOCAL_SLURM_NETNS is now
started_daemons() {
    local slurmds
    slurmds="$(recorded_slurmds)"
    # shellcheck disable=SC2086
    printf '%s\n' munged slurmctld ${slurmds:-"${SLURMDS[@]}"}
}

cmd_stop() {
    local any=0 d ids pids p
    for d in $(started_daemons); do running "$d" && any=1; done
    if [ "$any" -eq 0 ]; then
        rm -f "$PIDS"/* 2>/dev/null || true
        say "not running ($STATE)"
        return 0
    fi
    if running slurmctld && running munged; then
        ids="$(squeue -h -o '%A' 2>/dev/null || true)"
        if [ -n "$ids" ]; then
            say "cancelling jobs: $(echo $ids)"
            # shellcheck disable=SC2086
            scancel $ids 2>/dev/null || true
            local deadline=$(( $(now_ms) + 30000 ))
            while [ -n "$(squeue -h -o '%A' 2>/dev/null || true)" ] && [ "$(now_ms)" -lt "$deadline" ]; do
                sleep 0.2
            done
            [ -z "$(squeue -h -o '%A' 2>/dev/null || true)" ] || say "warning: jobs still listed after 30 s"
        fi
    fi
    # shellcheck disable=SC2046
    stop_daemons $(recorded_slurmds) slurmctld
    stop_daemons munged
    pids="$(stray_stepds)"
    if [ -n "$pids" ]; then
        say "killing leftover slurmstepd of this Slurm: $(echo $pids)"
        for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
    fi
    if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$CONF" ]; then
        rm -f /etc/slurm/slurm.conf
        say "removed the link /etc/slurm/slurm.conf"
    fi
    say "stopped ($STATE)"
}

# ---------------------------------------------------------------------------- status, env
cmd_status() {
    local d pid all=1
    for d in $(started_daemons); do
        if pid="$(recorded_pid "$d")"; then
            printf '%-16s running (pid %s)\n' "$d:" "$pid"
        else
            printf '%-16s not running\n' "$d:"
            all=0
        fi
    done
    printf 'SLURM_CONF=%s\n' "$CONF"
    if running slurmctld && command -v sinfo >/dev/null; then
        sinfo || all=0
    fi
    [ "$all" -eq 1 ] || return 3
}

cmd_env() {
    [ -f "$CONF" ] || die "no $CONF: run '$0 start $STATE' first"
    printf 'export SLURM_CONF=%s\n' "$CONF"
}

"cmd_$CMD"
