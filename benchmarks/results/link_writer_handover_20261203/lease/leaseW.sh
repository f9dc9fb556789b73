#!/usr/bin/env bash
# one lease: Fig. 5d at 512 KiB, one connection, unlimited link: S (HEAD) against W (the tree: a
# large item goes to the writer thread as a message encoded by push; the writer hands the
# messages to the socket without a turn of the lock), five rounds, the order alternating; then
# comm.py 16 and 32 actors with W.
source /tmp/tj/.old_src/jobs.sh
rm -rf /tmp/x; X=/tmp/x; mkdir -p $X
mk() { local t=/tmp/tj$1; rm -rf $t; mkdir -p $t; cp -r benchmarks jobqueue $t/; tar xzf .old_src/$1.tgz -C $t; }
mk S; rm -f /tmp/tjW; ln -s /tmp/tj /tmp/tjW
{ nproc; lscpu | grep -i "model name"; cat .old_src/commit.txt; for v in S W; do echo "$v: $(grep -c _hand_to_writer /tmp/tj$v/tianji_dask/channels/queue_sender.py)"; done; } > $X/machine.txt 2>&1
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000 --repeats 3"
for r in 1 2 3 4 5; do
  if [ $((r % 2)) = 1 ]; then order="W S"; else order="S W"; fi
  for v in $order; do run link_${v}_r$r $v $L; done
done
touch $X/LINKDONE
run comm_W W python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000
touch $X/ALLDONE
