#!/usr/bin/env bash
# one lease: raw TCP on loopback (lease/gil_coupling.py) with Python work after each message in
# the sending and/or the receiving thread, and with another thread holding the GIL 10 % of the time
source /tmp/tj/.old_src/jobs.sh
rm -rf /tmp/x; X=/tmp/x; mkdir -p $X/work
{ nproc; lscpu | grep -i "model name"; cat .old_src/commit.txt; } > $X/machine.txt 2>&1
uptime > $X/work/uptime_start.txt
for r in 1 2 3 4 5; do
  for c in "0 30 0 0" "0 30 30 0" "0 30 0 30" "0 30 30 30" "0 30 15 15" "0 30 60 0" "0.1 30 30 30"; do
    python3 .old_src/gil_coupling.py 10000 $c | sed "s/^/r$r /" >> $X/work/gil_coupling.txt 2>&1
  done
done
uptime > $X/work/uptime_end.txt
touch $X/ALLDONE
