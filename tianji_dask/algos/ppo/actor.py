"""The PPO actor role: collects fixed-length rollouts with one policy version each.

Like :class:`~tianji_dask.algos.dqn.actor.DQNActorRole` it pushes into ``sender`` and probes
``params``, but it swaps parameters only between rollouts, so every rollout is tagged
with exactly the version that produced it (the learner measures staleness from it).

Atari (``env.kind: atari``): a rollout carries each 84x84 frame once (``frames``, the whole
stacks of its first step and then each step's new frame, as
:class:`~tianji_dask.roles.frame_replay.FrameStreams` emits them) and its observations as
positions into them (``obs_frames``, ``(T, N, 4)`` int32): a quarter of the bytes of the
stacks. The learner rebuilds the stacks (``frames[obs_frames]``) on its device.

``Box`` action spaces (:mod:`tianji_dask.algos.ppo.gaussian`): the rollout carries the actions
as sampled (``(T, N, action_dim)`` float32; the env gets them clipped to its bounds), the
observations and rewards as normalised with the statistics of the rollout's parameter version,
and the moments of the raw observations and discounted returns it saw (``obs_moments``,
``return_moments``), which the learner folds into its statistics.

Choosing ahead: with envs that step in two calls (ale-py's ``send``/``recv``:
:meth:`~tianji_dask.envs.EnvGroups.send_all`, :meth:`~tianji_dask.envs.EnvGroups.recv_all`), the
actor sends each group the next step's actions as soon as it has received the group's step, and
does the step's bookkeeping (frame streams, training signals, episodes, the rollout's arrays)
while the emulators run the next one. A rollout's first actions are chosen only after the
parameters are probed, so it stays one version's, and the rollouts are those of choosing after
the bookkeeping (tests/test_env_groups.py). A policy whose next choice depends on that
bookkeeping (the Gaussian one: its observation statistics and gSDE draws) sets
``chooses_ahead = False``. An actor closed with a step in flight receives it first.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from tianji_dask.algos.ppo.core import acting_policy
from tianji_dask.roles.actor_base import ActorBase
from tianji_dask.roles.frame_replay import FrameStreams

if TYPE_CHECKING:
    from tianji_dask.config.schema import PPOConfig


class PPOActorRole(ActorBase):
    """Protocol as DQNActorRole: ``wait_for_params()``, then ``step()`` in a loop; ``heartbeat()``."""

    algo: PPOConfig

    def _setup(self, seed: int) -> None:
        cfg = self.cfg
        self.policy = acting_policy(cfg, self.action_space, self.obs_dim, seed)
        # uint8 frame stacks for Atari (rollouts move as uint8); the policy's view of them in obs
        self.raw_obs = self.reset_env(seed)
        self.obs = self.policy.normalize(self.raw_obs)
        self.T = self.algo.rollout_steps
        self.learner_consumed = 0
        self.quota = self._rollout_quota()
        self._rollouts_this_version = 0
        self._t = 0
        self.frames = FrameStreams(self.id, self.num_envs, stack=self.obs_shape[0]) if cfg.env.frame_stacks else None
        # envs that step in two calls get the next step's actions before this step's bookkeeping,
        # so the emulators run while it is done; the actions of a rollout's first step are chosen
        # after the parameters are probed, so a rollout stays one version's
        self.chooses_ahead = self.env.overlaps and self.policy.chooses_ahead
        self._next_choice: tuple[np.ndarray, ...] | None = None  # chosen and sent, not yet received
        self._new_rollout()

    def _rollout_quota(self) -> int:
        algo = self.algo
        share = algo.rollouts_per_update * self.cfg.topology.learners / (self.n_actors * algo.sample_reuse)
        # its share of a version within the band, plus the one rollout it makes while the
        # learner trains on the previous one (without it actor and learner would alternate)
        return max(1, int(share * (1.0 + (algo.ratio_tolerance or 0.0)))) + 1

    def _new_rollout(self) -> None:
        T, N = self.T, self.num_envs
        if self.frames is None:
            obs: dict[str, np.ndarray] = {"obs": np.empty((T, N, *self.obs_shape), self.obs_dtype)}
        else:
            self.frames.take()  # frames emitted by the previous rollout's last step: not needed here
            self.frames.start(self.obs)  # the first stacks whole: a rollout needs no other
            obs = {"obs_ids": np.empty((T, N, self.obs_shape[0]), np.int64)}
        self._r: dict[str, np.ndarray] = {
            **obs,
            "actions": np.empty((T, N, *self.policy.action_shape), self.policy.action_dtype),
            "logp": np.empty((T, N), np.float32),
            "values": np.empty((T, N), np.float32),
            "rewards": np.empty((T, N), np.float32),
            "dones": np.empty((T, N), np.float32),
        }
        self._t = 0

    def ahead_of_learner(self) -> bool:
        """Balance controller: has this actor produced its share of rollouts for the current
        parameter version?

        A learner iteration takes ``rollouts_per_update`` rollouts per learner and may use each
        ``sample_reuse`` times, so a version needs ``rollouts_per_update * learners /
        (actors * sample_reuse)`` new rollouts from each actor; the band allows
        ``1 + ratio_tolerance`` times that, rounded down, never less than one, plus the rollout
        made while the learner trains on the previous one. It paces on
        versions, not on a consumption count: rollouts that go stale and are dropped would never
        be counted as consumed, and both sides could end up waiting for each other."""
        return self._rollouts_this_version >= self.quota

    def _on_new_version(self) -> None:
        self._rollouts_this_version = 0
        # versions change between rollouts only: the whole next rollout sees this one's normalisation
        self.obs = self.policy.normalize(self.raw_obs)

    def step(self) -> bool:
        if self._t == 0:  # between rollouts: newest parameters, and the controller's say
            self.probe_params()
            if self.balance and self.ahead_of_learner():
                t = time.perf_counter()
                time.sleep(0.002)
                self.counters.throttled_s += time.perf_counter() - t
                return False
        r, t = self._r, self._t
        self.policy.exploration_step(t)
        if self.frames is None:
            r["obs"][t] = self.obs
        else:
            r["obs_ids"][t] = self.frames.ids
        if self.chooses_ahead:
            choice = self._next_choice if self._next_choice is not None else self.env.send_all(self._choose, self.obs)
            result, self._next_choice = self.env.recv_all(self._choose if t + 1 < self.T else None)
        else:  # each group of envs steps while the policy acts for the next group (env.step_groups)
            choice, result = self.env.step_with(self._choose, self.obs)
        (_, actions, logp, values), (next_obs, rewards, terminated, truncated, infos) = choice, result
        next_obs = next_obs.astype(self.obs_dtype, copy=False)
        if self.frames is not None:
            self.frames.step(next_obs, terminated | truncated, infos)
        self.tracker.update(rewards, terminated | truncated, time.time())  # the env's own rewards
        # Atari trains on clipped rewards and ends an episode at each lost life
        rewards, terminated, dones = self.training_signals(rewards, terminated, truncated, infos)
        rewards = self.policy.training_rewards(rewards.astype(np.float32), terminated)
        only_truncated = truncated & ~terminated
        if only_truncated.any():  # a time limit is not a terminal state: bootstrap from the final obs
            final: np.ndarray = np.stack([infos["final_obs"][i] for i in np.flatnonzero(only_truncated)]).astype(
                self.obs_dtype
            )
            rewards[only_truncated] += self.algo.gamma * self.policy.value(self.policy.normalize(final))
        r["actions"][t], r["logp"][t], r["values"][t] = actions, logp, values
        r["rewards"][t], r["dones"][t] = rewards, dones
        self.raw_obs = next_obs
        self.obs = self.policy.observe(next_obs)
        self._t += 1
        self.counters.env_steps += self.num_envs
        if self._t == self.T:
            self.flush()
        return True

    def _choose(self, group: int, obs: np.ndarray | None) -> tuple[np.ndarray, ...]:
        """(what the env gets, the actions the rollout keeps, their log-probs, values)."""
        assert obs is not None  # step() passes the observations
        actions, logp, values = self.policy.act(obs, self.env.envs_of(group))
        return self.policy.env_actions(actions), actions, logp, values

    def _frame_positions(self, obs_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(this rollout's frames, each observation's frames as positions into them)."""
        assert self.frames is not None
        frames, ids = self.frames.take()
        return frame_positions(frames, ids, obs_ids, self.id)

    def unsent(self) -> int:
        return self._t * self.num_envs

    def flush(self) -> None:
        """Push the finished rollout, tagged with its policy version and creation time."""
        if self._t < self.T:
            return  # PPO trains on whole rollouts only
        r = self._r
        if self.frames is not None:
            r["frames"], r["obs_frames"] = self._frame_positions(r.pop("obs_ids"))
        r["last_values"] = self.policy.value(self.obs)
        r.update(self.policy.rollout_statistics())
        r["version"] = np.array(self.policy.version, np.int64)
        r["created"] = np.array(time.time(), np.float64)
        nbytes = sum(v.nbytes for v in r.values())
        self._rollouts_this_version += 1
        if self.sender.push(r):
            self.counters.messages_sent += 1
            self.counters.bytes_sent += nbytes
        self._new_rollout()
        if self.synchronous:
            self.wait_for_newer_params()


def frame_positions(
    frames: np.ndarray, ids: np.ndarray, obs_ids: np.ndarray, actor_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """(``frames``, each observation's frame ids ``obs_ids`` as positions into ``frames``,
    whose ids are ``ids``)."""
    order = np.argsort(ids)
    pos = order[np.minimum(np.searchsorted(ids[order], obs_ids), len(ids) - 1)]
    if not np.array_equal(ids[pos], obs_ids):  # a frame the rollout never emitted: a bug, not bad input
        raise RuntimeError(f"actor {actor_id}: a rollout refers to frames it does not carry")
    return frames, pos.astype(np.int32)
