"""What every algorithm's learner core provides, and the state encoding they share.

A core's ``state()`` is the checkpoint format of :mod:`tianji_dask.results.checkpoint`: components of
named CPU tensors, nothing pickled. ``restore(state)`` into a freshly built core of the same
config makes it continue exactly where the saved one was: the next update is bit-identical
(networks, the optimiser's moments and step counts, the update count that drives schedules, and
any sampling generator).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
import torch.nn as nn

from tianji_dask.errors import CheckpointError

State = dict[str, dict[str, torch.Tensor]]


class LearnerCore(Protocol):
    updates: int

    @property
    def module(self) -> nn.Module:
        """The network whose parameters data-parallel ranks keep identical."""
        ...

    def policy_params(self) -> dict[str, np.ndarray]:
        """The weights actors act with, as fresh C-contiguous CPU numpy arrays (:func:`host_arrays`)."""
        ...

    def load_policy_params(self, params: dict[str, np.ndarray]) -> None: ...

    def prepare(self) -> None:
        """Finish the build with what updates need and actors do not (the optimiser, a
        compiled learner's kernels): a host calls it once its first parameters are published;
        an update before makes what it needs itself."""
        ...

    def state(self) -> State: ...

    def restore(self, state: State) -> None: ...


def host_arrays(module: nn.Module) -> dict[str, np.ndarray]:
    """``module``'s state as fresh C-contiguous CPU numpy arrays, safe to hand to a channel
    whatever the layout the learner keeps (channels-last convolutions)."""
    return {
        k: v.detach().to("cpu", memory_format=torch.contiguous_format, copy=True).numpy()
        for k, v in module.state_dict().items()
    }


def optimizer_state(optim: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The optimiser's per-parameter state (Adam's moments and step counts) as ``"<param
    index>.<name>"`` tensors. Its hyperparameters come from the config; schedules that change
    them are saved by the core."""
    return {
        f"{pid}.{name}": torch.as_tensor(val)
        for pid, st in optim.state_dict()["state"].items()
        for name, val in st.items()
    }


def load_optimizer_state(optim: torch.optim.Optimizer, flat: dict[str, torch.Tensor]) -> None:
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for key, val in flat.items():
        pid, name = key.split(".", 1)
        # a copy: the optimiser would otherwise keep and update tensors the caller still holds
        per_param.setdefault(int(pid), {})[name] = val.clone()
    optim.load_state_dict({"state": per_param, "param_groups": optim.state_dict()["param_groups"]})


def generator_state(rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """A PCG64 generator's 128-bit state and increment as little-endian bytes, plus its
    buffered 32-bit half."""
    st = rng.bit_generator.state
    if st["bit_generator"] != "PCG64":
        raise TypeError(f"only PCG64 generators are saved, got {st['bit_generator']}")
    as_bytes = {
        k: torch.frombuffer(bytearray(int(st["state"][k]).to_bytes(16, "little")), dtype=torch.uint8)
        for k in ("state", "inc")
    }
    return {**as_bytes, "buffered": torch.tensor([st["has_uint32"], st["uinteger"]], dtype=torch.int64)}


def restore_generator(rng: np.random.Generator, saved: dict[str, torch.Tensor]) -> None:
    has_uint32, uinteger = (int(v) for v in saved["buffered"])
    rng.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {k: int.from_bytes(bytes(saved[k].tolist()), "little") for k in ("state", "inc")},
        "has_uint32": has_uint32,
        "uinteger": uinteger,
    }


def component(state: State, name: str, algo: str) -> dict[str, torch.Tensor]:
    """``state[name]``, or a clear error naming what the checkpoint lacks."""
    if name not in state:
        raise CheckpointError(
            f"this {algo} checkpoint has no {name!r} component (it has {sorted(state)}): it was written "
            "by another algorithm or an older tianji_dask that did not save it, and cannot be restored"
        )
    return state[name]
