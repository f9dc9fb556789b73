#!/usr/bin/env bash
# ab.sh N OUT TREE_T1 TREE_T2: comm.py's 4-actor and tiny cases, the receive loop on one thread
# (TREE_T1, a copy of the tree with RECEIVE_THREADS = 1) and on two (TREE_T2), alternating, three
# rounds; run from the repository root with its .venv.
N=$1; OUT=$2; declare -A TREE=([T1]=$3 [T2]=$4); mkdir -p "$OUT"
for r in 1 2 3; do
  for t in T1 T2; do
    uptime > "$OUT/${t}_r$r.uptime"
    PYTHONPATH=${TREE[$t]} timeout 600 .venv/bin/python benchmarks/comm.py --sweeps actors,tiny --sample-times 0.001 \
      --actors 4 --messages "$N" --out "$OUT/${t}_r$r" > "$OUT/${t}_r$r.log" 2>&1
    uptime >> "$OUT/${t}_r$r.uptime"
  done
done
touch $OUT/DONE
