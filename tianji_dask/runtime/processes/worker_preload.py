"""Dask worker preload: import torch and gymnasium while the worker process starts (the roles
load when the hosts are created), so they load in parallel across workers instead of one after
the other. Use with ``dask worker --preload tianji_dask.runtime.processes.worker_preload``."""

import gymnasium  # noqa: F401
import torch
import torch._dynamo  # torch.optim's optimizers import it when made: seconds of a learner's start


def dask_setup(worker) -> None:  # the preload hook Dask calls; importing was the point
    torch.set_num_threads(1)
