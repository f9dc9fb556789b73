cd /work/main
N=$1; OUT=$2; mkdir -p "$OUT"
for r in 1 2 3; do
  for t in T1 T2; do
    uptime > "$OUT/${t}_r$r.uptime"
    PYTHONPATH=/tmp/tr$t timeout 600 .venv/bin/python benchmarks/comm.py --sweeps actors,tiny --sample-times 0.001 \
      --actors 4 --messages "$N" --out "$OUT/${t}_r$r" > "$OUT/${t}_r$r.log" 2>&1
    uptime >> "$OUT/${t}_r$r.uptime"
  done
done
touch $OUT/DONE
