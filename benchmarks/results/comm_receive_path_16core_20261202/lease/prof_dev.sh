#!/usr/bin/env bash
# prof_dev.sh OUT: py-spy the receiving worker of a 16-actor channel case (B tree)
OUT=$1; mkdir -p $OUT; cd /tmp/tj
python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16 --messages 80000 --out $OUT/bench > $OUT/bench.log 2>&1 &
BP=$!
while ! grep -q "raw_tcp .* A=16 " $OUT/bench.log; do sleep 0.2; kill -0 $BP 2>/dev/null || exit 1; done
sleep 2
pid=
for p in $(pgrep -f "spawn_main"); do
  if py-spy dump -p $p 2>/dev/null | grep -q "tianji-queue-read"; then pid=$p; break; fi
done
echo "receiver pid $pid"
py-spy record -p $pid -d 4 -r 250 --threads -f raw -o $OUT/all.txt --nonblocking > $OUT/pyspy1.log 2>&1
py-spy record -p $pid -d 4 -r 250 --threads --gil -f raw -o $OUT/gil.txt --nonblocking > $OUT/pyspy2.log 2>&1
wait $BP
grep channel $OUT/bench.log | tail -2
