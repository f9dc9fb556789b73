"""The serial reference: the same role objects in one process, no Dask.

It runs the serial algorithm's schedule exactly. DQN: every ``train_freq`` env steps the
buffer ingests what the actor produced and the learner does ``gradient_steps`` updates.
PPO: after every rollout the learner trains on it (as often as the sample distribution
allows). Then the actor takes the newest parameters. This is the baseline that measures
what distribution buys, and a debugging aid.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from tianji_dask.algos.registry import spec_for
from tianji_dask.channels import LocalQueue, LocalTopic
from tianji_dask.seeding import role_seeds

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig


class SerialRun:
    """Protocol: ``run(emit, should_stop)``; ``emit(heartbeat)`` is called every
    ``run.metrics_interval`` seconds with each role's heartbeat, ``should_stop()``
    is checked between env steps."""

    def __init__(self, cfg: ExperimentConfig):
        import torch

        torch.set_num_threads(cfg.topology.torch_threads)
        self.cfg = cfg
        seeds = role_seeds(cfg.seed, n_actors=1)
        self.queue = LocalQueue(capacity_bytes=1 << 62, full_policy="wait")
        self.topic = LocalTopic()
        self.spec = spec_for(cfg)
        self.actor = self.spec.make_actor(
            cfg, 0, seeds.actors[0], self.queue, self.topic.subscribe(), balance=False, n_actors=1
        )
        obs_dim = int(np.prod(self.actor.obs_shape))
        self.buffer = self.spec.make_buffer(cfg, self.queue, self.actor.obs_shape, self.actor.obs_dtype, seeds.buffer)
        self.learner = self.spec.make_learner(
            cfg, self.buffer, self.topic, obs_dim, self.actor.action_space, seeds.learner, balance=False
        )

    def heartbeats(self) -> list[dict]:
        return [role.heartbeat().message() for role in (self.actor, self.buffer, self.learner)]

    def _train_round(self) -> None:
        """The serial algorithm's training between two collection phases."""
        self.actor.flush()
        self.buffer.ingest()
        self.spec.serial_train_round(self.cfg, self.learner)

    def run(self, emit, should_stop) -> None:
        period = self.spec.serial_period(self.cfg)
        interval = self.cfg.run.metrics_interval
        self.learner.publish()
        self.actor.probe_params()
        since_train = 0
        # a first beat at the start: the reference of the first rates, so that a run shorter
        # than one interval still has them from its final beat
        beat_steps = self.actor.counters.env_steps
        for hb in self.heartbeats():
            emit(hb)
        next_beat = time.monotonic() + interval
        try:
            while not should_stop():
                self.actor.step()
                since_train += self.actor.num_envs
                if since_train >= period:
                    since_train -= period
                    self._train_round()
                if time.monotonic() >= next_beat:
                    next_beat += interval
                    beat_steps = self.actor.counters.env_steps
                    for hb in self.heartbeats():
                        emit(hb)
        finally:
            if self.actor.counters.env_steps != beat_steps:  # an unchanged beat would read as 0 fps
                for hb in self.heartbeats():
                    emit(hb)
            self.actor.close()
