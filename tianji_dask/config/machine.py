"""Checks of an experiment config against this machine, made before any work starts.

:func:`check_env` finds an Atari game among ale-py's ROMs, or the ``mujoco`` package a MuJoCo env
needs, and builds the env once;
:func:`check_device` looks for the CUDA device. They are slower than the schema's checks or
depend on where they run, so they are not validators: a config saved in a run directory must
validate on a machine without ale-py or a GPU.
:func:`~tianji_dask.config.load_config` runs both unless told not to, and every run checks the
env again before it starts (:class:`tianji_dask.runtime.driver.Run`).
"""

from __future__ import annotations

import difflib
import os
from typing import Any, NamedTuple

from tianji_dask.config.errors import ConfigError
from tianji_dask.config.schema import EnvConfig, ExperimentConfig


class EnvSpaces(NamedTuple):
    """The spaces of the configured env, as :func:`check_env` found them."""

    observation_space: Any  # gymnasium.spaces.Box
    action_space: Any  # gymnasium.spaces.Discrete, or Box where the algorithm acts in one


def check_env(config: ExperimentConfig) -> EnvSpaces:
    """Build ``config.env.id`` once with ``gymnasium.make``, close it, and return its spaces.

    Raises :class:`ConfigError` when the id is unknown (with close matches from the gymnasium
    registry, or for ``env.kind: atari`` from ale-py's games: :func:`check_atari_game`), a
    MuJoCo env is asked for without the ``mujoco`` package (:func:`check_mujoco`), the env fails
    to build (e.g. another missing optional dependency), its observation space is not a ``Box``,
    or the algorithm cannot act in its action space (its config section's ``action_space_problem``: DQN
    needs ``Discrete`` actions, PPO takes ``Discrete`` or a one-dimensional ``Box``).
    """
    import gymnasium
    from gymnasium import spaces

    env_id = config.env.id
    if config.env.frame_stacks:  # Atari preprocessed: uint8 (4, 84, 84) frame stacks, the game's actions
        from tianji_dask.envs import atari_spaces

        check_atari_game(config.env)
        try:
            return EnvSpaces(*atari_spaces(config.env))
        except Exception as exc:
            raise ConfigError(
                f"env.id={env_id!r} (env.kind=atari, env.atari_backend={config.env.atari_backend!r}): {exc}"
            ) from exc
    check_mujoco(env_id)
    try:
        env = gymnasium.make(env_id)
    except gymnasium.error.UnregisteredEnv as exc:
        ids = list(gymnasium.envs.registry)
        close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.6)
        # gymnasium's own text helps when nothing is close (e.g. "install the package for ale_py")
        hint = f"did you mean {', '.join(close)}?" if close else f"{exc} (gymnasium.envs.registry)"
        raise ConfigError(f"env.id={env_id!r}: no such gymnasium environment; {hint}") from None
    except Exception as exc:
        raise ConfigError(f"env.id={env_id!r}: gymnasium.make failed: {type(exc).__name__}: {exc}") from exc
    try:
        action_space, observation_space = env.action_space, env.observation_space
    finally:
        env.close()
    problems = []
    action_problem = config.algo.action_space_problem(env_id, action_space)
    if action_problem is not None:
        problems.append(action_problem)
    if not isinstance(observation_space, spaces.Box):
        problems.append(
            f"env.id={env_id!r}: observation space is {observation_space}, but a Box observation space is needed"
        )
    if problems:
        raise ConfigError(problems)
    return EnvSpaces(observation_space, action_space)


#: The extra that installs MuJoCo for gymnasium's MuJoCo envs (pyproject.toml).
MUJOCO_INSTALL = "pip install 'tianji-dask[mujoco]'"


def check_mujoco(env_id: str) -> None:
    """Raise :class:`ConfigError` with the install command when ``env_id`` is one of gymnasium's
    MuJoCo envs (``HalfCheetah-v5``, ``Hopper-v5``, ...) and the ``mujoco`` package does not
    import; other ids pass (an unknown one is :func:`check_env`'s to report)."""
    import gymnasium

    spec = gymnasium.envs.registry.get(env_id)
    entry_point = spec.entry_point if spec is not None else None
    if not (isinstance(entry_point, str) and entry_point.startswith("gymnasium.envs.mujoco")):
        return
    try:
        import mujoco  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"env.id={env_id!r} is a MuJoCo env, and the mujoco package is not installed ({exc}); "
            f"install the optional extra: {MUJOCO_INSTALL} (gymnasium[mujoco])"
        ) from None


def check_atari_game(env: EnvConfig) -> None:
    """Check that ``env.id`` is an ``ALE/<Game>-v5`` id of a game whose ROM ale-py ships.

    Raises :class:`ConfigError` naming the fix: install ale-py, or the closest game ids.
    """
    from tianji_dask.envs import atari_rom

    try:
        atari_rom(env.id)
    except ImportError as exc:
        raise ConfigError(f"env.kind=atari needs ale-py ({exc}); pip install 'ale-py>=0.12'") from None
    except ValueError as exc:
        raise ConfigError(f"env.id={env.id!r} (env.kind=atari): {exc}") from None


def check_device(config: ExperimentConfig) -> None:
    """Check that ``config.learner.device`` and ``config.actor.device`` exist on *this* machine.

    Only meaningful where the learner and actors will run (or on an identical node); a driver on
    a login node without a GPU should skip it (``load_config(..., check_device=False)``). Imports
    torch only when a device is a CUDA one.
    """
    for section in ("learner", "actor"):
        _check_one_device(f"{section}.device", getattr(config, section).device)
    if getattr(config.algo, "compile", False):
        problem = compiler_problem(config.learner.device)
        if problem:
            raise ConfigError(f"algo.compile=true: {problem}")


def compiler_problem(device: str) -> str | None:
    """Why ``torch.compile`` cannot build kernels for ``device`` here, with the fix; None when it
    can: inductor writes C++ for the CPU (a compiler on PATH) and Triton kernels for CUDA."""
    import shutil

    if device == "cpu":
        compilers = [c for c in (os.environ.get("CXX"), "g++", "clang++") if c and shutil.which(c)]
        if not compilers:
            return (
                "torch.compile needs a C++ compiler for a CPU learner (install g++, or set CXX); "
                "or set algo.compile=false"
            )
        return None
    from torch.utils._triton import has_triton

    if not has_triton():
        return (
            f"torch.compile needs Triton for a learner on {device} (pip install triton, the version "
            "torch was built with); or set algo.compile=false"
        )
    return None


def _check_one_device(name: str, device: str) -> None:
    if device == "cpu":
        return
    try:
        import torch
    except ImportError as exc:
        raise ConfigError(f"{name}={device!r}: torch cannot be imported ({exc})") from None
    if not torch.cuda.is_available():
        raise ConfigError(
            f"{name}={device!r}: torch.cuda.is_available() is False on this machine "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); "
            f"use --set {name}=cpu or run where a GPU is visible"
        )
    if ":" in device:
        index, count = int(device.split(":")[1]), torch.cuda.device_count()
        if index >= count:
            raise ConfigError(f"{name}={device!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
