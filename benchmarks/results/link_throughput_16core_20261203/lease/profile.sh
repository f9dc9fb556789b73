#!/usr/bin/env bash
# profile.sh OUT MESSAGES [link_throughput args...]: one unlimited-link case of 512 KiB, with
# py-spy (per thread, and GIL holders only) on the receiving and the sending worker processes
out=$1; n=$2; shift 2; mkdir -p $out
python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages $n --out $out "$@" > $out/bench.log 2>&1 &
lp=$!
for i in $(seq 200); do
  rn=$(pgrep -f -- "--name node1-receiver" | head -1); sn=$(pgrep -f -- "--name node2-sender" | head -1)
  if [ -n "$rn" ] && [ -n "$sn" ]; then
    rw=$(pgrep -P $rn -f spawn_main | head -1); sw=$(pgrep -P $sn -f spawn_main | head -1)
    [ -n "$rw" ] && [ -n "$sw" ] && break
  fi
  sleep 0.3
done
echo "receiver $rw sender $sw" > $out/pids.txt
for side in receiver:$rw sender:$sw; do
  name=${side%%:*}; pid=${side#*:}
  py-spy record --nonblocking --threads -r 250 -d ${PROF_S:-30} -f raw -o $out/$name.threads.txt -p $pid > $out/$name.threads.log 2>&1 &
  py-spy record --nonblocking --gil -r 250 -d ${PROF_S:-30} -f raw -o $out/$name.gil.txt -p $pid > $out/$name.gil.log 2>&1 &
done
wait
