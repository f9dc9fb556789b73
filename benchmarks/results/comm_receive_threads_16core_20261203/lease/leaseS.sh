#!/usr/bin/env bash
# one lease: the inbox's receive loop on 1, 2 (the tree) or 4 threads, and QueueSender's
# max_batch_bytes 1 MiB (the tree) or 4 MiB: comm.py 16 and 32 actors (T1, T2, T4, T2B4) twice,
# then Fig. 5d unlimited (64 KiB, 512 KiB, 4 MiB; 5,000 messages; one connection, so one thread)
# T2 against T2B4 three times, alternating
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
export PATH=/tmp/tj/.ipr/bin:/tmp/site/bin:$PATH LD_LIBRARY_PATH=/tmp/tj/.ipr/lib
X=/tmp/x; mkdir -p $X
for v in T1:1:1 T4:4:1 T2B4:2:4; do
  IFS=: read name threads batch <<< "$v"
  t=/tmp/tj$name; rm -rf $t; mkdir -p $t; cp -r tianji_dask benchmarks jobqueue $t/
  sed -i "s/^RECEIVE_THREADS = 2$/RECEIVE_THREADS = $threads/" $t/tianji_dask/channels/receive_loop.py
  sed -i "s/max_batch_bytes: int = 1 << 20,/max_batch_bytes: int = $batch << 20,/" $t/tianji_dask/channels/queue_sender.py
  echo "$name: $(grep -h '^RECEIVE_THREADS\|max_batch_bytes: int' $t/tianji_dask/channels/receive_loop.py $t/tianji_dask/channels/queue_sender.py | tr '\n' ' ')"
done > $X/machine.txt 2>&1
ln -s /tmp/tj /tmp/tjT2
{ nproc; cat /tmp/tj/.old_src/commit.txt; git -C /tmp/tj diff --stat 2>&1 | tail -1; } >> $X/machine.txt
job() {
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/run.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
run() {  # run NAME VARIANT COMMAND
  local n=$1 t=/tmp/tj$2; shift 2
  job $n env PYTHONPATH=/tmp/site:$t bash -c "cd $t && $* --out $X/$n > $X/$n/bench.log 2>&1"
}
C="python3 -u benchmarks/comm.py --sweeps actors --sample-times 0.001 --actors 16,32 --messages 8000"
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 65536,524288,4194304 --messages 5000"
for r in 1 2; do for v in T1 T2 T4 T2B4; do run comm_${v}_r$r $v $C; done; done
for r in 1 2 3; do for v in T2 T2B4; do run link_${v}_r$r $v $L; done; done
touch $X/ALLDONE
