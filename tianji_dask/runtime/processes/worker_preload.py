"""Dask worker preload: import torch and gymnasium while the worker process starts (the roles
load when the hosts are created), so they load in parallel across workers instead of one after
the other. Use with ``dask worker --preload tianji_dask.runtime.processes.worker_preload``.
torch._dynamo, which a learner's optimiser imports, is left to the learners: it takes seconds
that a learner spends after its first parameters are out, and an actor never needs it."""

import gymnasium  # noqa: F401
import torch


def dask_setup(worker) -> None:  # the preload hook Dask calls; importing was the point
    torch.set_num_threads(1)
