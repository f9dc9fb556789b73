"""Dask worker preload: import the heavy modules (torch, gymnasium, the roles) while the
worker process starts, so they load in parallel across workers instead of one after the
other when the hosts are created. Use with ``dask worker --preload tianji_dask.runtime.processes.worker_preload``."""

import gymnasium  # noqa: F401
import torch
import torch._dynamo  # torch.optim's optimizers import it when made: seconds of a learner's start


def dask_setup(worker) -> None:  # the preload hook Dask calls; importing was the point
    torch.set_num_threads(1)
