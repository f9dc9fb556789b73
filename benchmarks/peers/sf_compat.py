"""Sample Factory 2.1.1 (PyPI's newest; tag v2.1.1, commit 91e58936) on today's numpy and
gymnasium: the runtime patches ``sf_appo.py`` applies in every one of its processes (it calls
:func:`apply` as it is imported, and Sample Factory's spawned workers import it again). Each patch
is applied only where the installed version needs it, and changes no algorithm:

* numpy >= 2.4 no longer turns a one-element array into a scalar on assignment (an error since the
  deprecation of numpy 1.25 expired). Sample Factory's ``TensorDict._set_data_func`` stores each
  step's policy outputs (value, log-prob, action: arrays of one element for one agent) into
  scalar slots of its trajectory buffer, which then fails in every rollout worker. The patch
  reshapes such a one-element array to a scalar before Sample Factory's own assignment.
* gymnasium 1.0 renamed the wrappers that ``sf_examples/atari/atari_utils.py`` builds its Atari
  envs from: ``GrayScaleObservation`` is ``GrayscaleObservation``, ``FrameStack`` is
  ``FrameStackObservation`` (same stacking: the first frame repeated at reset, as gymnasium
  0.29's ``FrameStack``; an array instead of ``LazyFrames``, which its ``NumpyObsWrapper`` makes an
  array anyway). The patch puts the old names back as aliases.
* gymnasium 1.0 no longer loads ale-py's env ids by itself: :func:`register_atari` registers
  them (``PongNoFrameskip-v4`` and the rest), called where an Atari env is made.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


def _numpy_at_least(major: int, minor: int) -> bool:
    got = tuple(int(p) for p in np.__version__.split(".")[:2])
    return got >= (major, minor)


def _patch_tensor_dict() -> None:
    from sample_factory.algo.utils.tensor_dict import TensorDict

    original = TensorDict._set_data_func
    if getattr(original, "_scalar_slots", False):
        return

    def set_data(self, x, index, new_data):
        one = isinstance(x, np.ndarray) and isinstance(new_data, np.ndarray) and new_data.size == 1
        if one and np.ndim(x[index]) == 0:
            new_data = new_data.reshape(())
        return original(self, x, index, new_data)

    set_data._scalar_slots = True  # type: ignore[attr-defined]
    TensorDict._set_data_func = set_data


def _alias_gymnasium_wrappers() -> None:
    wrappers = gym.wrappers
    if not hasattr(wrappers, "GrayScaleObservation"):
        wrappers.GrayScaleObservation = wrappers.GrayscaleObservation
    if not hasattr(wrappers, "FrameStack"):
        wrappers.FrameStack = wrappers.FrameStackObservation


def gymnasium_1() -> bool:
    return int(gym.__version__.split(".")[0]) >= 1


def apply() -> list[str]:
    """Applies the patches this numpy and gymnasium need; returns their names, for the record."""
    applied = []
    if _numpy_at_least(2, 4):
        _patch_tensor_dict()
        applied.append("numpy>=2.4: one-element arrays into scalar slots of TensorDict")
    if gymnasium_1():
        _alias_gymnasium_wrappers()
        applied.append("gymnasium>=1: GrayScaleObservation and FrameStack aliases")
    return applied


def register_atari() -> None:
    """ale-py's env ids in gymnasium's registry (gymnasium 0.29 loaded them through a plugin)."""
    if gymnasium_1():
        import ale_py

        gym.register_envs(ale_py)
