"""The paper's virtual communication experiment (TianJi Fig. 5, equation 1); the code is the
``comm_bench`` package beside this script.

    python benchmarks/comm.py                 # full run: N = 10,000 per case (about 10 minutes)
    python benchmarks/comm.py --small         # N = 500 per case (about a minute)
    python benchmarks/comm.py --max-actors 16 --out benchmarks/results/comm16

Writes comm.nc, comm.json and comm.png to --out (default benchmarks/results/comm); every output
is defined in docs/benchmarks.md.
"""

import sys

from comm_bench.comm import main

if __name__ == "__main__":  # the raw TCP anchor spawns processes that re-import this file
    sys.exit(main())
