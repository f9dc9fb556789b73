"""The learner role: policy update (step 3 of the paper's Algorithm 1).

It samples from its local buffer without waiting for fresh data (after warm-up)
and publishes versioned parameters every ``publish_interval`` updates. The
version of a parameter set is the learner's update count when it was taken.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gymnasium as gym
import torch

from tianji_dask.algos.dqn.core import DQNLearner
from tianji_dask.algos.networks import network_kind
from tianji_dask.envs import action_count
from tianji_dask.roles.heartbeats import Heartbeat, LearnerCounters, counter
from tianji_dask.roles.learner_base import LearnerBase

if TYPE_CHECKING:
    from tianji_dask.config.schema import DQNConfig

THROTTLE_S = 0.0005  # one pause of a learner the balance controller holds back


@dataclass
class DQNLearnerCounters(LearnerCounters):
    q_mean: float = counter(math.nan)  # mean Q value of the batches since the previous heartbeat


class DQNLearnerRole(LearnerBase):
    """``publish()`` once so actors can start, then ``step()`` in a loop; ``step()`` returns
    False when it did not update (warm-up or balance control)."""

    algo: DQNConfig

    learner_core: DQNLearner
    counters_class = DQNLearnerCounters
    counters: DQNLearnerCounters

    def _make_learner_core(self, obs_dim: int, action_space: gym.Space, seed: int) -> DQNLearner:
        cfg = self.cfg
        n_actions = action_count(action_space)
        return DQNLearner(obs_dim, n_actions, self.algo, seed, cfg.learner.device, network=network_kind(cfg))

    def _setup(self) -> None:
        self._received_at_update = -1
        self._stat_sum: torch.Tensor | None = None  # the updates' statistics since the last heartbeat
        self._n = 0
        # a uniform device replay draws batches on the device, and a lone CUDA learner replays
        # draw and update as one graph; data-parallel ranks average gradients between them
        self._sample = self.buffer.device_sampler() if self.grad_hook is None else None

    def publish(self) -> None:
        self._publish_version(self.learner_core.updates)

    def ahead_of_actors(self) -> bool:
        """Would another update push the replay ratio above the serial one (plus the band)?

        The slack of one publication's worth of updates guarantees the learner publishes its
        consumption before it pauses; with the actors flushing before they pause, the two
        sides can never wait for each other (their pause conditions exclude each other)."""
        algo = self.algo
        if algo.ratio_tolerance is None:  # the controller is off
            return False
        # the warm-up's transitions are not weighed; a buffer restored with a replay has had its
        # warm-up (at least in part), and its learner goes on at once
        warm_up = max(algo.learning_starts - getattr(self.buffer, "restored", 0), 0)
        fresh = max(self.buffer.received - warm_up, 0)
        slack = self.cfg.learner.publish_interval * algo.batch_size
        return self.counters.samples >= algo.target_replay_ratio * (1.0 + algo.ratio_tolerance) * fresh + slack

    def ready(self) -> bool:
        return len(self.buffer) >= self.algo.learning_starts

    def wants_update(self) -> bool:
        """Warm-up done and the balance controller does not hold the learner back
        (synchronous mode: and fresh data arrived since the previous update)."""
        if not self.ready():
            return False
        if self.synchronous:
            return self.buffer.received > self._received_at_update
        if self.balance and self.ahead_of_actors():
            if self.counters.param_version != self.learner_core.updates:
                self.publish()  # actors pace themselves on the consumption count it carries
            return False
        return True

    def updates_per_launch(self) -> int:
        """Updates the next launch makes: ``algo.updates_per_graph`` on batches drawn on the
        device, ending where a publication is due (one in synchronous mode); one otherwise."""
        if self._sample is None or self.synchronous:
            return 1
        interval = self.cfg.learner.publish_interval
        return min(self.algo.updates_per_graph, interval - self.counters.updates % interval)

    def update(self) -> None:
        """One gradient step on a batch from the local buffer (gradients averaged by
        ``grad_hook`` in a data-parallel group), or :meth:`updates_per_launch` of them on batches
        drawn on the device."""
        algo = self.algo
        t = time.perf_counter()
        self._received_at_update = self.buffer.received
        n = self.updates_per_launch()
        if self._sample is not None:
            with self.buffer.lock:  # the buffer's thread writes the replay's device tensors
                stats = self.learner_core.update_sampled(self._sample, n)
        else:
            batch = self.buffer.sample(algo.batch_size)
            keys = batch.pop("keys", None)  # prioritized replay: where the batch came from
            stats = self.learner_core.update(batch, self.grad_hook)
            if keys is not None:
                self.buffer.update_priorities(keys, self.learner_core.td_errors())
        self.counters.train_s += time.perf_counter() - t
        # summed on the device: read once a heartbeat, not once an update
        self._stat_sum = stats.clone() if self._stat_sum is None else self._stat_sum.add_(stats)
        self._n += n
        self.counters.updates += n
        self.counters.samples += algo.batch_size * n
        if self.synchronous or self.counters.updates % self.cfg.learner.publish_interval == 0:
            self.publish()  # synchronous mode: the actors wait for every version

    def step(self) -> bool:
        if self.wants_update():
            self.update()
            return True
        if self.ready():  # held back by the balance controller
            t = time.perf_counter()
            time.sleep(THROTTLE_S)
            self.counters.throttled_s += time.perf_counter() - t
        return False

    def heartbeat(self) -> Heartbeat:
        c = self.counters
        c.loss = c.q_mean = math.nan
        if self._stat_sum is not None:
            c.loss, c.q_mean = (self._stat_sum / self._n).tolist()
        self._stat_sum = None
        self._n = 0
        return Heartbeat("learner", self.id, c)
