"""The paper's virtual communication experiment (TianJi, Fig. 5 and equation 1) on this project's
data plane, with plain TCP sockets as the physical anchor.

Simulated actors, one Dask worker process each, produce messages of a given size, sampling
(sleeping, by default) a given time before each, and push them through a ``QueueSender`` into
one ``QueueInbox`` on a receiver worker until that inbox has delivered N messages to its
consumer. Every case is also run over raw TCP between plain Python processes with the same
sizes, senders and sample time, right before it, and reported as a fraction of it.

    python benchmarks/comm.py                 # full run: N = 10,000 per case (about 10 minutes)
    python benchmarks/comm.py --small         # N = 500 per case (about a minute)
    python benchmarks/comm.py --max-actors 16 --out benchmarks/results/comm16

Sweeps (docs/benchmarks.md defines every output):
  size       64 KiB .. 4 MiB, 1 actor, sample time 0
  actors     1, 2, 4 (.. --max-actors) actors at 512 KiB, sample time 0, 0.001 s and 0.01 s
  transports distributed.Queue put/get and Dask actor calls, 512 KiB, 1 actor, fewer messages
  tiny       100-byte messages, 1 actor: messages per second end to end

Equation 1 of the paper, with the ``/ N_A`` that its text implies ("increasing the number of
actors is equivalent to linearly accelerating the sample collection") and that the printed
formula lacks::

    T_c = N * max((T_sp + T_sd) / N_A, T_rv)     actor-bound when the first term is larger

is evaluated from the per-message times measured at the two ends and stored beside the
measured collection time.

Writes ``comm.nc`` (one ``case`` dimension), ``comm.json`` and ``comm.png`` to ``--out`` (default
benchmarks/results/comm). The code is the ``comm_bench`` package beside this script.
"""

import sys

from comm_bench.cli import main

if __name__ == "__main__":  # the raw TCP anchor spawns processes that re-import this file
    sys.exit(main(description=__doc__))
