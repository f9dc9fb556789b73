# jobs.sh, sourced by the lease scripts first: the tree in /tmp/tj (prep.sh), results in $X;
# job NAME CMD... runs CMD with its log, exit status, times
# and load in $X/NAME; run NAME VARIANT CMD... runs CMD in the variant's tree /tmp/tjVARIANT
# with --out $X/NAME, its output in $X/NAME/bench.log.
cd /tmp/tj; export PYTHONPATH=/tmp/site:/tmp/tj
export PATH=/tmp/tj/.ipr/bin:/tmp/site/bin:$PATH LD_LIBRARY_PATH=/tmp/tj/.ipr/lib
X=/tmp/x; mkdir -p $X
job() {
  local name=$1; shift
  local d=$X/$name; mkdir -p $d; uptime > $d/uptime_start.txt; date +%s > $d/t_start
  "$@" > $d/run.log 2>&1 < /dev/null
  echo $? > $d/rc; uptime > $d/uptime_end.txt; date +%s > $d/t_end; touch $d/DONE
}
run() {
  local n=$1 t=/tmp/tj$2; shift 2
  job $n env PYTHONPATH=/tmp/site:$t bash -c "cd $t && $* --out $X/$n > $X/$n/bench.log 2>&1"
}
