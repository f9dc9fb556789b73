"""The PPO actor on an asynchronous vector env (``env.async_batch``): no emulator waits for the policy.

ale-py's ``AtariVectorEnv`` with ``batch_size`` B below its N envs hands back, at each
``recv()``, the first B envs whose step is done (``info["env_id"]``); ``send()`` gives exactly
those envs their next actions, and the other envs go on stepping meanwhile. The actor chooses
for one batch while the emulators step the rest, so they never stand idle while the policy runs
or waits for a GPU shared with the learner.

Each env fills its own column of a rollout at its own pace. A rollout opens when its first env
needs it (the parameters are probed then), and is pushed, in the format of
:class:`~tianji_dask.algos.ppo.actor.PPOActorRole`'s, once every env has made its T steps in it.
An env that has made its T steps goes on in the next rollout while slower envs finish theirs;
its last value is the value of the observation its column ended on. Where the balance controller
holds the next rollout, an env that has finished its column plays on outside any rollout
(``idle_env_steps``, not trained on) as long as other envs still have rows to fill, since ale-py
steps only the envs it was sent actions for, and every env is held once none has. A rollout is
tagged with the version it opened with; envs still finishing it act with any newer version
probed meanwhile, each step with its own log-probability, so the tag is never newer than what
acted. Frames: each env's column starts with its whole stack (:meth:`FrameStreams.restart`),
and each frame an env emits goes to the rollout whose column it continues (or nowhere).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from tianji_dask.algos.ppo.actor import PPOActorRole
from tianji_dask.algos.ppo.core import acting_policy
from tianji_dask.algos.ppo.pacing import RolloutCredit
from tianji_dask.algos.ppo.rollout_writer import frame_positions
from tianji_dask.envs import AtariTrainingSignals, make_atari_vector_env
from tianji_dask.roles.frame_replay import FrameStreams
from tianji_dask.roles.heartbeats import ActorCounters, counter


def by_value(keys: np.ndarray) -> Iterator[tuple[int, np.ndarray | slice]]:
    """``(value, selection)`` for each distinct value of ``keys``; a batch's envs are nearly
    always in one rollout, so all-equal keys take one pair and no sort."""
    if not len(keys):
        return
    if keys.min() == keys.max():
        yield int(keys[0]), slice(None)
        return
    for k in np.unique(keys):
        yield int(k), keys == k


@dataclass
class _Columns:
    """One rollout's arrays, ``(T, N)`` each env's column, filled at each env's own pace, and the
    frames its columns emitted."""

    T: int
    N: int
    stack: int
    version: int
    finished: int = 0  # envs that made their T steps in it
    data: dict[str, np.ndarray] = field(default_factory=dict)
    frames: list[np.ndarray] = field(default_factory=list)
    frame_ids: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self) -> None:
        T, N = self.T, self.N
        self.data = {
            "obs_ids": np.empty((T, N, self.stack), np.int64),
            "actions": np.empty((T, N), np.int64),
            "logp": np.empty((T, N), np.float32),
            "values": np.empty((T, N), np.float32),
            "rewards": np.empty((T, N), np.float32),
            "dones": np.empty((T, N), np.float32),
            "last_values": np.empty(N, np.float32),
        }


@dataclass
class AsyncActorCounters(ActorCounters):
    # env steps played outside any rollout: an env whose column was done, while the balance
    # controller held the next rollout and other envs still had rows to fill
    idle_env_steps: int = counter(grows=True)


class PPOAsyncActorRole(PPOActorRole):
    """Protocol as :class:`PPOActorRole`; ``step()`` handles one batch of envs."""

    counters_class = AsyncActorCounters
    counters: AsyncActorCounters

    def _make_env(self, seed: int):
        env_cfg = self.cfg.env
        return make_atari_vector_env(
            env_cfg.id, env_cfg.num_envs, env_cfg.atari_backend, env_cfg.atari_threads, batch_size=env_cfg.async_batch
        )

    def _setup(self, seed: int) -> None:
        self.policy = acting_policy(self.cfg, self.action_space, self.obs_dim, seed)
        self.T = self.algo.rollout_steps
        self.learner_consumed = 0
        self.credit = RolloutCredit(self._rollouts_per_version(), self.algo.rollouts_ahead)
        N = self.num_envs
        self._streams = FrameStreams(self.id, N, stack=self.obs_shape[0])
        self._seen = np.zeros(N, bool)  # envs whose reset came back
        # each env: the rollout of its latest column (-1: none yet) and the row of the action it
        # was sent there (-1: the action is not recorded; the env waits for its next column)
        self._rollout_of = np.full(N, -1, np.int64)
        self._row = np.full(N, -1, np.int64)
        self._open: dict[int, _Columns] = {}  # rollouts _pushed .. _opened - 1
        self._opened = 0
        self._pushed = 0
        self._unpushed = 0  # env steps made into rollouts not yet pushed
        self.chooses_ahead = False  # the other envs step while a batch is chosen for
        obs, infos = self.env.reset(seed=seed)
        self._signals = AtariTrainingSignals(np.zeros(N, np.int64))
        self.training_signals = self._signals
        envs = np.asarray(infos["env_id"], np.int64)
        self._start_envs(envs, infos)
        self._received: tuple[np.ndarray, np.ndarray, np.ndarray, tuple | None] | None = (
            obs,
            envs,
            np.zeros(len(envs), bool),
            None,
        )

    def _start_envs(self, envs: np.ndarray, infos: dict) -> None:
        self._seen[envs] = True
        self._signals.start(envs, np.asarray(infos["lives"]))

    def step(self) -> bool:
        if self._received is None:
            self._received = self._receive()
        obs, envs, finishing, results = self._received
        starting, next_rollout = self._columns_to_start(envs)
        hold = self._every_env_held()
        if hold and not finishing.any():
            return self._hold_batch(obs, envs, finishing, results)
        chosen = self.policy.act_async(obs, envs)
        if results is not None:  # while the device infers
            self._record_results(*results)
        actions, logp, values = chosen()
        if finishing.any():  # these values are the last values of the columns just finished
            self._finish_columns(envs[finishing], values[finishing])
        if hold:
            self._received = (obs, envs, np.zeros_like(finishing), None)
            return self.throttle()
        self._received = None
        self.env.send(self.policy.env_actions(actions))
        # the emulators step these envs again while the choices are written
        self._start_columns(envs[starting], next_rollout[starting], obs[starting])
        self._write_choices(envs, actions, logp, values)
        return True

    def _hold_batch(self, obs: np.ndarray, envs: np.ndarray, finishing: np.ndarray, results: tuple | None) -> bool:
        """The batch waits for the rollout the controller holds; its step results are recorded
        meanwhile."""
        if results is not None:
            self._record_results(*results)
            self._received = (obs, envs, finishing, None)
        return self.throttle()

    def _columns_to_start(self, envs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(which of ``envs`` start a column now, each env's next rollout); opens the next
        rollout where one of them needs it, unless the balance controller holds it."""
        waiting = self._row[envs] < 0
        next_rollout = self._rollout_of[envs] + 1
        if waiting.any() and next_rollout[waiting].max() >= self._opened:
            self._open_rollout()
        return waiting & (next_rollout < self._opened), next_rollout

    def _every_env_held(self) -> bool:
        """Every env, in this batch or in flight, waits for the rollout the controller holds: none
        could fill a row (an env in flight whose next rollout is open, its reset included, would
        start a column there when it comes back)."""
        return bool((self._row < 0).all() and (self._rollout_of + 1 == self._opened).all())

    def _finish_columns(self, envs: np.ndarray, last_values: np.ndarray) -> None:
        """``envs`` made the last step of their columns: their last values, and the rollouts every
        env has finished are pushed."""
        for k, sel in by_value(self._rollout_of[envs]):
            columns = self._open[k]
            columns.data["last_values"][envs[sel]] = last_values[sel]
            columns.finished += len(envs[sel])
        self.flush()

    def _start_columns(self, envs: np.ndarray, rollouts: np.ndarray, obs: np.ndarray) -> None:
        """``envs`` begin their columns of ``rollouts``, each with the whole stack of ``obs``."""
        if not len(envs):
            return
        self._rollout_of[envs], self._row[envs] = rollouts, 0
        self._streams.restart(envs, obs)
        dest = np.full(self.num_envs, -1, np.int64)
        dest[envs] = rollouts
        self._route_frames(dest)

    def _write_choices(self, envs: np.ndarray, actions: np.ndarray, logp: np.ndarray, values: np.ndarray) -> None:
        """The observations, actions, log-probs and values of the envs whose rows are recorded."""
        recorded = self._row[envs] >= 0
        e, a, lp, v = envs[recorded], actions[recorded], logp[recorded], values[recorded]
        rows = self._row[e]
        for k, sel in by_value(self._rollout_of[e]):
            d = self._open[k].data
            d["obs_ids"][rows[sel], e[sel]] = self._streams.ids[e[sel]]
            d["actions"][rows[sel], e[sel]], d["logp"][rows[sel], e[sel]] = a[sel], lp[sel]
            d["values"][rows[sel], e[sel]] = v[sel]

    def _receive(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple | None]:
        """The next batch: ``(observations, envs, whether each env just made the last step of
        its column, its step results for :meth:`_record_results`)``. Each env moves on to its
        next row here; the results carry the rollouts and rows their actions were recorded in."""
        obs, rewards, terminated, truncated, infos = self.env.recv()
        envs = np.asarray(infos["env_id"], np.int64)
        first = ~self._seen[envs]
        stepped = ~first
        if first.any():  # a reset's result: nothing stepped
            self._start_envs(envs[first], {k: v[first] for k, v in infos.items()})
            obs_s, rewards, terminated, truncated = (
                obs[stepped],
                rewards[stepped],
                terminated[stepped],
                truncated[stepped],
            )
            infos = {k: v[stepped] for k, v in infos.items()}
        else:
            obs_s = obs
        recorded = self._row[envs] >= 0
        results = None
        if stepped.any():
            e = envs[stepped]
            where = (self._rollout_of[e], self._row[e], recorded[stepped])
            results = (e, *where, obs_s, rewards, terminated, truncated, infos)
        made = int(recorded.sum())
        self.counters.env_steps += made
        self.counters.idle_env_steps += int(stepped.sum()) - made
        self._unpushed += made
        row = self._row[envs] + 1
        finishing = recorded & (row == self.T)
        self._row[envs] = np.where(recorded & ~finishing, row, -1)
        return obs, envs, finishing, results

    def _open_rollout(self) -> bool:
        """Opens the next rollout with the newest parameters, unless the balance controller
        holds it."""
        self.probe_params()
        if self.balance and self.ahead_of_learner():
            return False
        self._open[self._opened] = _Columns(self.T, self.num_envs, self.obs_shape[0], self.policy.version)
        self._opened += 1
        self.credit.spend()
        return True

    def _record_results(self, envs, rollouts, rows, recorded, next_obs, rewards, terminated, truncated, infos) -> None:
        """Step results of ``envs``: their episodes, frames and training signals; written into
        rows ``rows`` of rollouts ``rollouts`` where their actions were ``recorded``."""
        ended = terminated | truncated
        self._streams.step(next_obs, ended, infos, envs)
        # a frame continues its env's column, except the one after the column's last row: the
        # next column starts with its whole stack again
        dest = np.full(self.num_envs, -1, np.int64)
        filling = recorded & (rows < self.T - 1)
        dest[envs[filling]] = rollouts[filling]
        self._route_frames(dest)
        self.tracker.update(rewards, ended, time.time(), envs)  # the env's own rewards
        rewards, terminated, dones = self._signals(rewards, terminated, truncated, infos, envs)
        rewards = rewards.astype(np.float32)
        bootstrap = truncated & ~terminated & recorded
        if bootstrap.any():  # a time limit is not a terminal state: bootstrap from the final obs
            rewards[bootstrap] += self.algo.gamma * self.policy.value(infos["final_obs"][bootstrap])
        e, r, dn, at = envs[recorded], rewards[recorded], dones[recorded], rows[recorded]
        for k, sel in by_value(rollouts[recorded]):
            d = self._open[k].data
            d["rewards"][at[sel], e[sel]], d["dones"][at[sel], e[sel]] = r[sel], dn[sel]

    def _route_frames(self, dest: np.ndarray) -> None:
        """The frames emitted since the last call, each to rollout ``dest[env]`` of its env
        (-1: none)."""
        frames, ids = self._streams.take()
        if not len(ids):
            return
        for k, sel in by_value(dest[self._streams.env_of(ids)]):
            if k >= 0:
                columns = self._open[k]
                columns.frames.append(frames[sel])
                columns.frame_ids.append(ids[sel])

    def _on_new_version(self) -> None:
        self.credit.new_version(self.policy.version, self.dropped_by_learner())

    def unsent(self) -> int:
        return self._unpushed

    def flush(self) -> None:
        """Push the rollouts every env has finished, in the order they opened."""
        while self._pushed in self._open and self._open[self._pushed].finished == self.num_envs:
            self._push(self._open.pop(self._pushed))
            self._pushed += 1
            if self.synchronous:
                self.wait_for_newer_params()

    def _push(self, columns: _Columns) -> None:
        r = columns.data
        frames = np.concatenate(columns.frames) if len(columns.frames) > 1 else columns.frames[0]
        ids = np.concatenate(columns.frame_ids) if len(columns.frame_ids) > 1 else columns.frame_ids[0]
        r["frames"], r["obs_frames"] = frame_positions(frames, ids, r.pop("obs_ids"), self.id)
        self._unpushed -= self.T * self.num_envs
        r["version"] = np.array(columns.version, np.int64)
        r["created"] = np.array(time.time(), np.float64)
        r["actor"] = np.array(self.id, np.int64)
        self.push(r)
