#!/usr/bin/env bash
# one lease: the machine's CPUs; S (the tree) at 512 KiB, one connection, unlimited link under
# py-spy (profile2.sh); then S against S with a 0.5 ms GIL switch interval in every process
# (SW: sitecustomize), three rounds alternating, three pairs a run.
source /tmp/tj/.old_src/jobs.sh
{ nproc; cat .old_src/commit.txt; lscpu; lscpu -e; } > $X/machine.txt 2>&1
ln -s /tmp/tj /tmp/tjS
job prof_S env PROF_S=25 bash .old_src/profile2.sh $X/prof_S/out 40000
L="python3 -u benchmarks/link_throughput.py --rates unlimited --sizes 524288 --messages 10000 --repeats 3"
for r in 1 2 3; do
  run link_S_r$r S $L
  job link_SW_r$r env PYTHONPATH=/tmp/tj/.old_src/sw:/tmp/site:/tmp/tj bash -c "python3 -c 'import sys; print(sys.getswitchinterval())' > $X/link_SW_r$r/switch.txt; $L --out $X/link_SW_r$r > $X/link_SW_r$r/bench.log 2>&1"
done
touch $X/ALLDONE
