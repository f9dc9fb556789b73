#!/usr/bin/env bash
# one lease: how much another thread's use of the GIL costs raw TCP on loopback
# (lease/gil_coupling.py): duty 0, 0.1, 0.2, 0.3 at 30 us holds, then 0.2 at 10 and 100 us, five rounds
source /tmp/tj/.old_src/jobs.sh
rm -rf /tmp/x; X=/tmp/x; mkdir -p $X/gil
{ nproc; lscpu | grep -i "model name"; cat .old_src/commit.txt; } > $X/machine.txt 2>&1
uptime > $X/gil/uptime_start.txt
for r in 1 2 3 4 5; do
  for dh in "0 30" "0.1 30" "0.2 30" "0.3 30" "0.2 10" "0.2 100"; do
    python3 .old_src/gil_coupling.py 10000 $dh | sed "s/^/r$r /" >> $X/gil/gil_coupling.txt 2>&1
  done
done
uptime > $X/gil/uptime_end.txt
touch $X/ALLDONE
