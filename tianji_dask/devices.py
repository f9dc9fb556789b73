"""Which GPU a host runs on when the config says ``cuda`` and its worker sees several.

A learner and its buffer have a slot, their global id ``g*L + j`` (:mod:`tianji_dask.runtime.cluster.placement`);
an actor takes the slot of the buffer it feeds, so that its inference shares its learner's GPU.
``cuda`` without an index then means GPU ``slot % GPUs`` of those the worker sees: on a
LocalCluster of a 4-GPU machine the learners of 4 groups (or the 4 data-parallel ranks of one)
get a GPU each, and a Slurm job given one GPU (``--gres=gpu:1``, which sets
``CUDA_VISIBLE_DEVICES``) sees only its own. ``cuda:N`` and ``cpu`` stay as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig


def device_of_slot(device: str, slot: int, gpus: int) -> str:
    """``device`` for the host of ``slot`` on a worker that sees ``gpus`` GPUs."""
    if device != "cuda" or gpus <= 1:
        return device
    return f"cuda:{slot % gpus}"


def on_slot_gpu(cfg: ExperimentConfig, slot: int) -> ExperimentConfig:
    """``cfg`` with ``learner.device`` and ``actor.device`` resolved for ``slot`` on this worker."""
    if "cuda" not in (cfg.learner.device, cfg.actor.device):
        return cfg
    import torch

    gpus = torch.cuda.device_count()
    learner, actor = (device_of_slot(d, slot, gpus) for d in (cfg.learner.device, cfg.actor.device))
    if (learner, actor) == (cfg.learner.device, cfg.actor.device):
        return cfg
    return cfg.model_copy(
        update={
            "learner": cfg.learner.model_copy(update={"device": learner}),
            "actor": cfg.actor.model_copy(update={"device": actor}),
        }
    )


def bind_thread(device: str) -> None:
    """Make ``device`` the calling thread's current CUDA device (for ``cuda:N``), so that what
    torch makes without naming a device (streams, events, CUDA graphs' pools) lands on the GPU of
    this thread's host and not on GPU 0. Nothing for ``cpu`` or a plain ``cuda``."""
    if device.startswith("cuda:"):
        import torch

        torch.cuda.set_device(torch.device(device))
