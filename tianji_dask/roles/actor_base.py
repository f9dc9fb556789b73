"""What every actor role shares: probing for parameter versions, the one wait for the first
version, the synchronous ablation's wait, the balance controller's pause, pushing a message,
heartbeats and closing the envs.

A subclass sets ``policy`` (with ``load(version, params)``) in ``_setup``, for the env's
``action_space`` (``Discrete``, or ``Box`` where the algorithm acts in one); the base owns
``params`` (a :class:`~tianji_dask.channels.ports.ParamSource`), ``sender`` (a
:class:`~tianji_dask.channels.ports.Sender`), ``tracker``, ``env``, ``id`` and ``counters``
(an :class:`~tianji_dask.roles.heartbeats.ActorCounters`, or the subclass's ``counters_class``);
``_on_new_version()`` is its hook.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from tianji_dask.channels.ports import ParamSource, Sender
from tianji_dask.envs import (
    EpisodeTracker,
    identity_training_signals,
    make_env_groups,
    observation_dtype,
    training_signals,
)
from tianji_dask.roles.heartbeats import ActorCounters, Heartbeat
from tianji_dask.roles.loop import never

if TYPE_CHECKING:
    from tianji_dask.config.schema import AlgoConfig, ExperimentConfig

FIRST_PARAMS_POLL_S = 0.005  # how often an actor looks for its first parameters
SYNC_PARAMS_POLL_S = 0.0002  # how often a synchronous-mode actor looks for the next version: it waits every step
THROTTLE_S = 0.002  # one pause of an actor the balance controller holds


class ActorBase(ABC):
    algo: AlgoConfig  # the config's algo section; a subclass annotates its own section type
    counters_class: type[ActorCounters] = ActorCounters
    counters: ActorCounters
    learner_consumed = 0
    _learner_dropped: np.ndarray | None = None  # the rollouts of each actor its learner dropped unused
    policy: Any  # set by the subclass's _setup: load(version, params) and the action rule

    def __init__(
        self,
        cfg: ExperimentConfig,
        actor_id: int,
        seed: int,
        sender: Sender,
        params: ParamSource,
        *,
        prior_env_steps: int = 0,
        balance_prior_env_steps: int = 0,
        balance: bool = True,
        n_actors: int | None = None,
        should_stop: Callable[[], bool] = never,
    ):
        """The common half of an actor: its channels, controller switches, vector env and
        counters; then the subclass's ``_setup(seed)``. ``prior_env_steps``: env steps of the
        actor's predecessors (one re-created with its host), from which its schedules continue (its
        counters begin again at 0); ``balance_prior_env_steps``: the part of them the balance
        controller counts (none where its learner and buffer were re-created too). The serial
        runner passes ``balance=False`` (no controller, no synchronous waits); ``should_stop()``
        (the host's stop flag) ends a synchronous wait for parameters."""
        self.cfg = cfg
        self.prior_env_steps = prior_env_steps
        self.balance_prior_env_steps = balance_prior_env_steps
        self.algo = cfg.algo
        self.id = actor_id
        self.sender = sender
        self.params = params
        self.synchronous = cfg.topology.mode == "synchronous" and balance
        self.balance = balance and cfg.algo.ratio_tolerance is not None and not self.synchronous
        self.should_stop = should_stop
        self.n_actors = n_actors or cfg.topology.actors
        self.num_envs = cfg.env.num_envs
        began = time.monotonic()
        self.env = self._make_env(seed)
        # the part of the build that start-up reports apart: emulators are built one at a time
        self.build_parts = {"envs": time.monotonic() - began}
        obs_space = self.env.single_observation_space
        assert obs_space.shape is not None, obs_space
        # the config check (check_env) admitted it for this algorithm
        self.action_space: gym.Space = self.env.single_action_space
        self.obs_shape: tuple[int, ...] = obs_space.shape
        self.obs_dtype = observation_dtype(cfg.env)  # uint8 frames for Atari, else float32
        self.obs_dim = int(np.prod(self.obs_shape))
        self.tracker = EpisodeTracker(self.num_envs)  # the env's own rewards and episodes
        # what the learner trains on: Atari clips rewards and ends an episode at each lost life
        self.training_signals = identity_training_signals
        self.counters = self.counters_class()
        self._setup(seed)

    def _make_env(self, seed: int) -> Any:
        """The actor's envs: the config's step groups (:class:`~tianji_dask.envs.EnvGroups`)."""
        return make_env_groups(self.cfg.env, seed)

    @abstractmethod
    def _setup(self, seed: int) -> None:
        """The subclass's policy, first observations and buffers."""

    @abstractmethod
    def flush(self) -> None:
        """Push what the actor holds that a message may carry now."""

    def reset_env(self, seed: int) -> np.ndarray:
        """First observations (as ``obs_dtype``); starts the Atari training signals' life count."""
        obs, infos = self.env.reset(seed=seed)
        self.training_signals = training_signals(self.cfg.env, infos)
        return obs.astype(self.obs_dtype, copy=False)

    def probe_params(self) -> bool:
        """Swap in a newer parameter version if one arrived. Never blocks."""
        got = self.params.probe()
        if got is None:
            return False
        version, payload = got
        self.policy.load(version, payload["params"])
        self.learner_consumed = int(payload.get("consumed", 0))
        self._learner_dropped = payload.get("dropped")
        self.counters.param_version = version
        self.counters.params_received += 1
        self._on_new_version()
        return True

    def dropped_by_learner(self) -> int:
        """This actor's rollouts the learner's buffer dropped unused, as of the newest version
        (0 where the learner publishes no such count)."""
        dropped = self._learner_dropped
        return int(dropped[self.id]) if dropped is not None and self.id < len(dropped) else 0

    def _on_new_version(self) -> None:  # noqa: B027 - optional hook, empty by default
        pass

    def wait_for_params(self, timeout: float, stop=lambda: False) -> None:
        """Block until the first parameter version arrives (the only time an actor waits)."""
        deadline = time.monotonic() + timeout
        while not self.probe_params():
            if stop():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"actor {self.id}: no parameters from the learner after {timeout:.0f} s")
            time.sleep(FIRST_PARAMS_POLL_S)

    def wait_for_newer_params(self, timeout: float = 60.0) -> None:
        """Synchronous (Gorila-style) ablation: block until a parameter version newer than the one
        in use arrives. Time spent is counted as ``sync_wait_s``."""
        t = time.perf_counter()
        deadline = time.monotonic() + timeout
        while not self.probe_params():
            if self.should_stop():
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"actor {self.id}: synchronous mode, no newer parameters after {timeout:.0f} s")
            time.sleep(SYNC_PARAMS_POLL_S)
        self.counters.sync_wait_s += time.perf_counter() - t

    def throttle(self) -> bool:
        """The balance controller holds the actor: a short pause, counted as ``throttled_s``.
        False, what ``step()`` returns when it made no env step."""
        t = time.perf_counter()
        time.sleep(THROTTLE_S)
        self.counters.throttled_s += time.perf_counter() - t
        return False

    def push(self, message: dict[str, np.ndarray]) -> None:
        """Hand a message to the channel (it owns the arrays from here); counted as sent if it
        took it."""
        nbytes = sum(v.nbytes for v in message.values())
        if self.sender.push(message):
            self.counters.messages_sent += 1
            self.counters.bytes_sent += nbytes

    @property
    def produced_env_steps(self) -> int:
        """Env steps of this actor and its predecessors (what schedules count)."""
        return self.prior_env_steps + self.counters.env_steps

    @property
    def balanced_env_steps(self) -> int:
        """Env steps the balance controller weighs against the learner's consumption."""
        return self.balance_prior_env_steps + self.counters.env_steps

    def unsent(self) -> int:
        """Env steps made but not yet handed to the channel; lost if the host dies now."""
        return 0

    def heartbeat(self) -> Heartbeat:
        sent = self.sender.stats()
        self.counters.blocked_s = float(sent["blocked_s"])
        self.counters.dropped = int(sent["dropped"])
        self.counters.unsent = self.unsent()
        return Heartbeat("actor", self.id, self.counters, self.tracker.drain())

    def close(self) -> None:
        self.env.close()
