#!/usr/bin/env bash
# one lease: Fig. 5d at 512 KiB, one connection, unlimited link, credit window 16 MB (the default)
# against 64 MB, with D (9f9b11e + one lock turn a written message) and F (the tree: D + the
# encoder thread); and F with credit sent once an eighth of the window is due instead of a quarter
# (F8, 16 MB); three rounds alternating.
source /tmp/tj/.old_src/jobs.sh  # the tree, $X, job and run
t=/tmp/tjD; rm -rf $t; mkdir -p $t; cp -r benchmarks jobqueue $t/; tar xzf .old_src/D.tgz -C $t
ln -s /tmp/tj /tmp/tjF
t=/tmp/tjF8; rm -rf $t; mkdir -p $t; cp -r benchmarks jobqueue tianji_dask $t/
sed -i 's|return min(conn.window, conn.sender_capacity or conn.window) // 4|return min(conn.window, conn.sender_capacity or conn.window) // 8|' $t/tianji_dask/channels/queue_inbox.py
{ nproc; cat .old_src/commit.txt; for v in D F F8; do echo "$v: $(grep -c '_encode_loop' /tmp/tj$v/tianji_dask/channels/queue_sender.py) $(grep 'conn.window) //' /tmp/tj$v/tianji_dask/channels/queue_inbox.py)"; done; } > $X/machine.txt 2>&1
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000"
for r in 1 2 3; do
  for v in D F; do for c in 16 64; do run link_${v}_c${c}_r$r $v $L --capacity-mb $c; done; done
  run link_F8_c16_r$r F8 $L --capacity-mb 16
done
touch $X/ALLDONE
