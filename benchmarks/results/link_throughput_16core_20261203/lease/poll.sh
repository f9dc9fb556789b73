#!/usr/bin/env bash
# poll.sh SECONDS: wait for /tmp/x/ALLDONE up to SECONDS, report, tar /tmp/x into $OUT
end=$(( $(date +%s) + ${1:-300} ))
while [ ! -e /tmp/x/ALLDONE ] && [ $(date +%s) -lt $end ]; do sleep 5; done
uptime; tail -5 /tmp/lease.log
for d in /tmp/x/*/; do
  n=$(basename $d); rc=$(cat $d/rc 2>/dev/null || echo running)
  dur=""; [ -e $d/t_end ] && dur=$(( $(cat $d/t_end) - $(cat $d/t_start) ))
  echo "== $n rc=$rc ${dur}s"; tail -4 $d/bench.log $d/*/bench.log 2>/dev/null
done
[ -e /tmp/x/ALLDONE ] && echo ALLDONE
tar czf $OUT/x.tar.gz -C /tmp x 2>/dev/null; ls -la $OUT
