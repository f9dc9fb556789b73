#!/usr/bin/env bash
# ab.sh ROUNDS MESSAGES OUT TREE... : Fig. 5d's unlimited link at 512 KiB, one connection, each
# tree (a directory holding tianji_dask, benchmarks and jobqueue) in turn, ROUNDS rounds; as root.
R=$1; M=$2; OUT=$3; shift 3
PY=${PYTHON:-python3}
for r in $(seq $R); do for t in "$@"; do
  v=$(basename $t); d=$OUT/${v}_r$r; mkdir -p $d; uptime > $d/uptime_start.txt
  (cd $t && PYTHONPATH=$t $PY benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages $M --out $d > $d/bench.log 2>&1)
  grep unlimited $d/bench.log | sed "s/^/$v r$r /"
done; done
