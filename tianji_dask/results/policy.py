"""A trained run's policy from Python (``tianji_dask.load_policy(RUN_DIR)``), as
stable-baselines3's ``model.predict`` gives it: ``policy.act(obs)`` for one observation or a
batch, in an env of the user's own.

The policy is the one ``tianji-dask eval`` plays (:func:`~tianji_dask.results.evaluation.load_trained`
reads the same checkpoint, :func:`~tianji_dask.results.evaluation.trained_policy` builds it):
``deterministic=True`` takes DQN's greedy action (no epsilon) or PPO's most likely action, or
its mean for continuous actions; ``deterministic=False`` keeps DQN's ``epsilon`` of random
actions, or draws PPO's actions from its distribution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np

from tianji_dask.config import ConfigError


@dataclass
class TrainedPolicy:
    """A run's trained policy; :meth:`act` chooses actions. ``checkpoint`` is the run
    directory's checkpoint it holds (``checkpoint_best`` or ``checkpoint``), taken at ``updates``
    learner updates and ``env_steps`` env steps."""

    run_dir: Path
    checkpoint: str
    updates: int
    env_steps: int
    observation_space: gym.Space
    action_space: gym.Space
    epsilon: float
    _build: Callable[[bool], Callable[[np.ndarray], np.ndarray]] = field(repr=False)
    _obs_dtype: type = field(repr=False)
    _policies: dict[bool, Callable[[np.ndarray], np.ndarray]] = field(default_factory=dict, repr=False)

    def act(self, obs, deterministic: bool = True):
        """The actions for ``obs``: one observation of the env's observation space (an int for
        ``Discrete`` actions, else an array of the action space's shape) or a batch with one
        more leading dimension (an array of actions, one a row)."""
        obs = np.asarray(obs, dtype=self._obs_dtype)
        shape = tuple(self.observation_space.shape or ())
        single = obs.shape == shape
        if not single and obs.shape[1:] != shape:
            raise ValueError(
                f"obs of shape {obs.shape}: one observation of shape {shape} or a batch of shape (n, *{shape}) "
                f"({self.run_dir} trained on {self.observation_space})"
            )
        policy = self._policies.get(deterministic)
        if policy is None:
            policy = self._policies[deterministic] = self._build(deterministic)
        actions = policy(obs[None] if single else obs)
        if not single:
            return actions
        return int(actions[0]) if isinstance(self.action_space, gym.spaces.Discrete) else actions[0]


def load_policy(
    run_dir: str | Path,
    *,
    which: str | None = None,
    device: str = "cpu",
    epsilon: float = 0.05,
    seed: int = 0,
) -> TrainedPolicy:
    """The trained policy of ``run_dir``: ``which`` ``"best"`` (``checkpoint_best``), ``"latest"``
    (``checkpoint``), or None: the best where the run kept one, else the latest, as
    ``tianji-dask eval`` picks. The network runs on ``device``. ``epsilon``: DQN's random actions
    with ``act(obs, deterministic=False)``; ``seed``: the random draws of that call. A
    :class:`ConfigError` names what is wrong with the directory or its checkpoint, and the fix."""
    from tianji_dask.config.machine import check_env
    from tianji_dask.envs import observation_dtype
    from tianji_dask.results.evaluation import load_trained, trained_policy

    run_dir = Path(run_dir)
    if not 0.0 <= epsilon <= 1.0:
        raise ConfigError(f"load_policy {run_dir}: epsilon={epsilon}: a probability, in [0, 1]")
    trained = load_trained(run_dir, which, device)
    spaces = check_env(trained.cfg)

    def build(deterministic: bool) -> Callable[[np.ndarray], np.ndarray]:
        return trained_policy(
            trained.cfg,
            trained.state,
            spaces.observation_space,
            spaces.action_space,
            epsilon=0.0 if deterministic else epsilon,
            seed=seed,
            sample=not deterministic,
        )

    return TrainedPolicy(
        run_dir=run_dir,
        checkpoint=trained.checkpoint,
        updates=int(trained.meta.get("updates", 0)),
        env_steps=int(trained.meta.get("env_steps", 0)),
        observation_space=spaces.observation_space,
        action_space=spaces.action_space,
        epsilon=epsilon,
        _build=build,
        _obs_dtype=observation_dtype(trained.cfg.env),
    )
