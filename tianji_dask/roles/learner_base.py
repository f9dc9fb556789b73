"""What every learner role shares: its learner core, publishing versioned policy parameters,
the data-parallel gradient hook, gossip bookkeeping and the checkpoint state.

A subclass makes its learner core (``_make_learner_core``: a
:class:`~tianji_dask.roles.learner_core.LearnerCore`) and sets up its own state (``_setup``); hosts talk
to the role through these methods, never to the learner core or the counters directly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
import torch

from tianji_dask.channels.ports import Publisher
from tianji_dask.roles.heartbeats import LearnerCounters
from tianji_dask.roles.learner_core import LearnerCore, State
from tianji_dask.roles.publishing import publish_params

if TYPE_CHECKING:
    from tianji_dask.config.schema import AlgoConfig, ExperimentConfig

AverageGradients = Callable[[list[torch.nn.Parameter]], None]


class LearnerBase(ABC):
    algo: AlgoConfig  # the config's algo section; a subclass annotates its own section type
    learner_core: LearnerCore
    counters_class: type[LearnerCounters] = LearnerCounters
    counters: LearnerCounters

    def __init__(
        self,
        cfg: ExperimentConfig,
        buffer,
        publisher: Publisher | None,
        obs_dim: int,
        action_space: gym.Space,
        seed: int,
        *,
        balance: bool = True,
        learner_id: int = 0,
        average_gradients: AverageGradients | None = None,
        world_size: int = 1,
    ):
        """``action_space``: the env's (one env's), from which the algorithm sizes its policy;
        ``buffer``: the co-located buffer role it trains from; ``publisher``: only rank 0 of a
        data-parallel group has one; ``average_gradients(parameters)``: called between backward
        and the optimiser step in a data-parallel group (all ranks average). The serial runner
        passes ``balance=False`` (no controller, no synchronous waits)."""
        self.cfg = cfg
        self.algo = cfg.algo
        self.id = learner_id
        self.buffer = buffer
        self.publisher = publisher
        self.world_size = world_size
        self.synchronous = cfg.topology.mode == "synchronous" and balance
        self.balance = balance and cfg.algo.ratio_tolerance is not None and not self.synchronous
        self.learner_core = self._make_learner_core(obs_dim, action_space, seed)
        params = list(self.learner_core.module.parameters())
        self.grad_hook = (lambda: average_gradients(params)) if average_gradients is not None else None
        self.counters = self.counters_class()
        self._samples_before = 0  # trained on by the learner whose state this one was restored from
        self._setup()

    @abstractmethod
    def _make_learner_core(self, obs_dim: int, action_space: gym.Space, seed: int) -> LearnerCore: ...

    def _setup(self) -> None:  # noqa: B027 - optional hook, empty by default
        """The subclass's own state, once the learner core and counters exist."""

    def prepare(self) -> None:
        """The learner core's :meth:`~tianji_dask.roles.learner_core.LearnerCore.prepare`."""
        self.learner_core.prepare()

    def _publish_version(self, version: int, dropped: np.ndarray | None = None) -> None:
        if self.publisher is not None:  # in a data-parallel group only rank 0 publishes
            consumed = self.counters.samples * self.world_size
            if not publish_params(self.publisher, version, self.learner_core.policy_params(), consumed, dropped):
                self.counters.publish_errors += 1
        self.counters.param_version = version

    @property
    def module(self) -> torch.nn.Module:
        """The network data-parallel ranks keep identical (broadcast after a gossip average)."""
        return self.learner_core.module

    def policy_params(self) -> dict[str, np.ndarray]:
        return self.learner_core.policy_params()

    def load_policy_params(self, params: dict[str, np.ndarray]) -> None:
        self.learner_core.load_policy_params(params)

    def record_gossip(self, rounds: int, distance: float) -> None:
        """Reported in the heartbeat: the group's gossip rounds and its distance to the others."""
        self.counters.gossip_rounds = rounds
        self.counters.group_distance = distance

    def state(self) -> State:
        """The learner core's state, and the samples trained on so far (the ``counters`` component)."""
        return {**self.learner_core.state(), "counters": {"samples": torch.tensor(self.samples, dtype=torch.int64)}}

    def restore(self, state: State) -> None:
        """Continue from a saved :meth:`state` (networks, optimiser, update count, schedules,
        samples trained on). The heartbeat's counters still count from 0: they are this role's,
        and the recorder carries on the earlier ones itself."""
        self.learner_core.restore(state)
        # a checkpoint written before the component existed: its samples are not known
        self._samples_before = int(state["counters"]["samples"]) if "counters" in state else 0

    @property
    def samples(self) -> int:
        """Samples trained on since the run began: those of the state restored, then this role's."""
        return self._samples_before + self.counters.samples

    def checkpoint_meta(self) -> dict[str, int]:
        return {"updates": self.learner_core.updates, "samples": self.samples}

    def close(self) -> None:  # noqa: B027 - part of LoopRole; a learner owns nothing to close
        """The host closes the publisher and the data-parallel group; nothing of the role's own."""
