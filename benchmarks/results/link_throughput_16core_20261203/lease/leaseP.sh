#!/usr/bin/env bash
# one lease: py-spy on the receiving and sending workers of link_throughput's channel case,
# unlimited link, 512 KiB (60,000 messages) then 64 KiB (200,000 messages)
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
export PATH=/tmp/tj/.ipr/bin:/tmp/site/bin:$PATH LD_LIBRARY_PATH=/tmp/tj/.ipr/lib
X=/tmp/x; mkdir -p $X
{ nproc; cat /tmp/tj/.old_src/commit.txt; git -C /tmp/tj status 2>&1 | head -3; } > $X/machine.txt 2>&1
job() {
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/run.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
PROF_S=40 job prof512 bash .old_src/profile.sh $X/prof512 60000
PROF_S=40 job prof64 bash .old_src/profile.sh $X/prof64 200000 --sizes 65536
touch $X/ALLDONE
