#!/usr/bin/env bash
# Pong PPO and DQN trained side by side on one machine, each on its own set of cores, in the
# background (each run in a session of its own, so it outlives the shell that started it).
# Made for the 16-core + GPU machine, where one time budget has to serve both runs:
#
#   benchmarks/pong_race.sh start DIR SECONDS [PPO_CORES] [DQN_CORES]   (defaults 0-10 and 11-15)
#   benchmarks/pong_race.sh status DIR      one progress line per run, and whether it still runs
#   benchmarks/pong_race.sh wait DIR S      wait up to S seconds for both runs to end
#   benchmarks/pong_race.sh stop DIR        SIGTERM: each run stops and writes its results
#
# Each run stops at a 100-episode mean return of 18 (the bar) or after SECONDS. Results land in
# DIR/ppo and DIR/dqn (metrics.nc, episodes.nc, rewritten every 30 s), logs in DIR/*.log.
# Extra --set overrides for both runs can be passed in RACE_SET, e.g. RACE_SET="seed=1", and
# RACE_CONFIG=_small picks configs/pong_{ppo,dqn}_small.yaml (a smoke test on a small machine).
set -euo pipefail

cmd=${1:?usage: pong_race.sh start|status|wait|stop DIR ...}
dir=${2:?usage: pong_race.sh $cmd DIR ...}
python=${PYTHON:-python3}
here=$(cd "$(dirname "$0")/.." && pwd)

alive() { [[ -f $dir/$1.pid ]] && kill -0 "$(cat "$dir/$1.pid")" 2>/dev/null; }

case $cmd in
start)
    seconds=${3:?usage: pong_race.sh start DIR SECONDS [PPO_CORES] [DQN_CORES]}
    ppo_cores=${4:-0-10}
    dqn_cores=${5:-11-15}
    if [[ -e $dir ]]; then
        echo "pong_race.sh: $dir exists; pass a new directory (nothing was started)" >&2
        exit 2
    fi
    for c in "$ppo_cores" "$dqn_cores"; do
        if ! taskset -c "$c" true 2>/dev/null; then
            echo "pong_race.sh: cannot pin to cores $c on this machine (it has $(nproc --all)); pass PPO_CORES and DQN_CORES that exist, e.g. 0-4 5-7 (nothing was started)" >&2
            exit 2
        fi
    done
    mkdir -p "$dir"
    extra=()
    for s in ${RACE_SET:-}; do extra+=(--set "$s"); done
    common=(--set stop.target_return=18 --set "stop.max_seconds=$seconds" --set run.save_interval=30
            "${extra[@]}")
    # 3 DQN actors: at replay ratio 8 the GPU learner takes ~1,000 env steps/s, which 3 make.
    declare -A cores=([ppo]=$ppo_cores [dqn]=$dqn_cores)
    declare -A sets=([ppo]="" [dqn]="--set topology.actors=3")
    for algo in ppo dqn; do
        # shellcheck disable=SC2086
        (cd "$here" && exec setsid taskset -c "${cores[$algo]}" "$python" -u -m tianji_dask.cli train \
            "configs/pong_$algo${RACE_CONFIG:-}.yaml" "${common[@]}" ${sets[$algo]} --out "$dir/$algo" \
            >"$dir/$algo.log" 2>&1 </dev/null) &
        echo $! >"$dir/$algo.pid"
        echo "started $algo (pid $(cat "$dir/$algo.pid"), cores ${cores[$algo]}): $dir/$algo.log"
    done
    ;;
status)
    for algo in ppo dqn; do
        state=ended
        alive $algo && state=running
        line=$(grep -E 'steps|reached|stopped|failed|error' "$dir/$algo.log" 2>/dev/null | tail -1 || true)
        echo "$algo [$state] ${line:-no output yet}"
    done
    ;;
wait)
    deadline=$((SECONDS + ${3:?usage: pong_race.sh wait DIR SECONDS}))
    while (alive ppo || alive dqn) && ((SECONDS < deadline)); do sleep 5; done
    "$0" status "$dir"
    ;;
stop)
    for algo in ppo dqn; do
        if alive $algo; then kill -TERM "$(cat "$dir/$algo.pid")"; fi
    done
    "$0" wait "$dir" 120
    ;;
*)
    echo "pong_race.sh: unknown command $cmd; use start, status, wait or stop" >&2
    exit 2
    ;;
esac
