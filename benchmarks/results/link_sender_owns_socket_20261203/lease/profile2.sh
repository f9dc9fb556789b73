#!/usr/bin/env bash
# profile2.sh OUT MESSAGES [link_throughput args...]: one unlimited-link case of 512 KiB with py-spy
# on both workers, idle samples kept (where each thread waits): the sender's with native frames
# (a thread waiting for the GIL shows take_gil), the receiver's Python frames only
out=$1; n=$2; shift 2; mkdir -p $out
python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages $n --out $out "$@" > $out/bench.log 2>&1 &
for i in $(seq 200); do
  rn=$(pgrep -f -- "--name node1-receiver" | head -1); sn=$(pgrep -f -- "--name node2-sender" | head -1)
  if [ -n "$rn" ] && [ -n "$sn" ]; then
    rw=$(pgrep -P $rn -f spawn_main | head -1); sw=$(pgrep -P $sn -f spawn_main | head -1)
    [ -n "$rw" ] && [ -n "$sw" ] && break
  fi
  sleep 0.3
done
echo "receiver $rw sender $sw" > $out/pids.txt
py-spy record --threads --idle --native -r 200 -d ${PROF_S:-25} -f raw -o $out/sender.idle.txt -p $sw > $out/sender.log 2>&1 &
py-spy record --nonblocking --threads --idle -r 200 -d ${PROF_S:-25} -f raw -o $out/sender.py.txt -p $sw > $out/sender.py.log 2>&1 &
py-spy record --nonblocking --threads --idle -r 200 -d ${PROF_S:-25} -f raw -o $out/receiver.idle.txt -p $rw > $out/receiver.log 2>&1 &
wait
