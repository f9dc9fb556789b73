"""The nanny of a run's own LocalCluster: its worker process is forked from the run's fork
server (:mod:`tianji_dask.runtime.processes.fork_server`) instead of spawned to import torch, Dask
and the roles again; a worker's start drops from seconds to a fraction of one, for every worker a
nanny restarts after it was killed too.

Dask takes a nanny's start method from ``distributed.worker.multiprocessing-method``, one setting
for the whole process: :class:`ForkedNanny` sets it to ``forkserver`` while it makes its worker
process, one nanny at a time, so that other LocalClusters of the process keep spawning theirs.
"""

from __future__ import annotations

import asyncio
import weakref

import dask
from distributed import Nanny

_instantiating: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


class ForkedNanny(Nanny):
    """A nanny whose worker process is forked from the fork server (:func:`start_fork_server`)."""

    async def instantiate(self):
        lock = _instantiating.setdefault(asyncio.get_running_loop(), asyncio.Lock())
        async with lock:
            with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
                return await super().instantiate()
