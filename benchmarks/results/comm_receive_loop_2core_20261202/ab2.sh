#!/usr/bin/env bash
# 2-core A/B: OLD (7c20264) vs NEW (HEAD) alternating, 3 rounds: 4 actors x 512 KiB at 1 ms, and 100-byte messages
cd /work/main
OUT=${1:-/tmp/ab2}; mkdir -p $OUT
for r in 1 2 3; do
  for t in OLD NEW; do
    uptime > $OUT/${t}_r$r.uptime
    PYTHONPATH=/tmp/tr$t timeout 600 .venv/bin/python benchmarks/comm.py --sweeps actors,tiny --sample-times 0.001 --actors 4 --messages 2000 --out $OUT/${t}_r$r > $OUT/${t}_r$r.log 2>&1
    uptime >> $OUT/${t}_r$r.uptime
  done
done
touch $OUT/DONE
