#!/usr/bin/env bash
# ab.sh N OUT: OLD (7c20264) and NEW (5efaf88) alternating, 3 rounds, 4 actors x 512 KiB at 1 ms and
# 100-byte messages, N messages a case; each tree's tianji_dask/ exported to /tmp/trOLD, /tmp/trNEW
# (git archive <commit> tianji_dask | tar -x -C /tmp/trX). Ran as `ab.sh 2000 n2000` and `ab.sh 10000 n10000`.
cd "$(git rev-parse --show-toplevel)"
N=${1:?messages a case}; OUT=${2:?output folder}; mkdir -p "$OUT"
for r in 1 2 3; do
  for t in OLD NEW; do
    uptime > "$OUT/${t}_r$r.uptime"
    PYTHONPATH=/tmp/tr$t timeout 600 .venv/bin/python benchmarks/comm.py --sweeps actors,tiny --sample-times 0.001 \
      --actors 4 --messages "$N" --out "$OUT/${t}_r$r" > "$OUT/${t}_r$r.log" 2>&1
    uptime >> "$OUT/${t}_r$r.uptime"
  done
done
