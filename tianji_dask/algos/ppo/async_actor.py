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
acted. Frames: each env's column starts with its whole stack (:meth:`FrameStreams.restart`);
frames emitted for a column of a later rollout are kept for that rollout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from tianji_dask.algos.ppo.actor import PPOActorRole, frame_positions
from tianji_dask.algos.ppo.core import acting_policy
from tianji_dask.envs import AtariTrainingSignals, make_atari_vector_env
from tianji_dask.heartbeats import ActorCounters, counter
from tianji_dask.roles.frame_replay import FrameStreams


@dataclass
class _Columns:
    """One rollout's arrays, ``(T, N)`` each env's column, filled at each env's own pace."""

    T: int
    N: int
    stack: int
    version: int
    finished: int = 0  # envs that made their T steps in it
    data: dict[str, np.ndarray] = field(default_factory=dict)
    first_seq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # each column's first frame
    started: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # the columns begun

    def __post_init__(self) -> None:
        T, N = self.T, self.N
        self.first_seq = np.zeros(N, np.int64)
        self.started = np.zeros(N, bool)
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
        self.quota = self._rollout_quota()
        self._rollouts_this_version = 0
        N = self.num_envs
        self._streams = FrameStreams(self.id, N, stack=self.obs_shape[0])
        self.frames = self._streams
        self._seen = np.zeros(N, bool)  # envs whose reset came back
        # each env: the rollout of its latest column (-1: none yet) and the row of the action it
        # was sent there (-1: the action is not recorded; the env waits for its next column)
        self._rollout_of = np.full(N, -1, np.int64)
        self._row = np.full(N, -1, np.int64)
        self._open: dict[int, _Columns] = {}
        self._opened = 0  # rollouts opened so far; the next one to open has this index
        self._pushed = 0  # rollouts pushed so far; the next one to push has this index
        self._carried: tuple[np.ndarray, np.ndarray] | None = None  # frames of rollouts not yet pushed
        self._unpushed = 0  # env steps made into rollouts not yet pushed
        self.chooses_ahead = False  # the other envs step while a batch is chosen for
        obs, infos = self.env.reset(seed=seed)
        self._signals = AtariTrainingSignals(np.zeros(N, np.int64))
        self.training_signals = self._signals
        envs = np.asarray(infos["env_id"], np.int64)
        self._start_envs(envs, infos)
        self._received: tuple[np.ndarray, np.ndarray, np.ndarray] | None = (obs, envs, np.zeros(len(envs), bool))

    def _start_envs(self, envs: np.ndarray, infos: dict) -> None:
        self._seen[envs] = True
        self._signals.start(envs, np.asarray(infos["lives"]))

    def step(self) -> bool:
        if self._received is None:
            self._received = self._receive()
        obs, envs, finishing = self._received
        waiting = self._row[envs] < 0
        next_rollout = self._rollout_of[envs] + 1
        for k in np.unique(next_rollout[waiting]):
            if k == self._opened and not self._open_rollout(int(k)):
                break
        starting = waiting & np.isin(next_rollout, list(self._open))
        # no env has a row to fill: every env is held, as the balance controller says
        hold = bool((waiting & ~starting).any() and (self._row < 0).all())
        if hold and not finishing.any():
            return self._held()
        actions, logp, values = self.policy.act(obs, envs)
        if finishing.any():  # these values are the last values of the columns just finished
            for k in np.unique(self._rollout_of[envs[finishing]]):
                sel = finishing & (self._rollout_of[envs] == k)
                columns = self._open[int(k)]
                columns.data["last_values"][envs[sel]] = values[sel]
                columns.finished += int(sel.sum())
            self._received = (obs, envs, np.zeros_like(finishing))
            self.flush()
        if hold:
            return self._held()
        self._received = None
        self.env.send(self.policy.env_actions(actions))
        # the emulators step these envs again while the choices are written
        if starting.any():
            begin, k = envs[starting], next_rollout[starting]
            for rollout in np.unique(k):
                columns, these = self._open[int(rollout)], begin[k == rollout]
                columns.first_seq[these], columns.started[these] = self._streams.first_seq(these), True
            self._streams.restart(begin, obs[starting])  # a column starts with its whole stack
            self._rollout_of[begin], self._row[begin] = k, 0
        recorded = self._row[envs] >= 0
        for k in np.unique(self._rollout_of[envs[recorded]]):
            sel = recorded & (self._rollout_of[envs] == k)
            d, e, r = self._open[int(k)].data, envs[sel], self._row[envs[sel]]
            d["obs_ids"][r, e] = self._streams.ids[e]
            d["actions"][r, e], d["logp"][r, e], d["values"][r, e] = actions[sel], logp[sel], values[sel]
        return True

    def _held(self) -> bool:
        t = time.perf_counter()
        time.sleep(0.002)
        self.counters.throttled_s += time.perf_counter() - t
        return False

    def _receive(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The next batch's results, written into the rows their actions were recorded in;
        returns ``(observations, envs, whether each env just made the last step of its column)``."""
        obs, rewards, terminated, truncated, infos = self.env.recv()
        envs = np.asarray(infos["env_id"], np.int64)
        first = ~self._seen[envs]
        if first.any():  # a reset's result: nothing stepped
            self._start_envs(envs[first], {k: v[first] for k, v in infos.items()})
        stepped = ~first
        recorded = self._row[envs] >= 0
        if stepped.any():
            self._record_results(
                envs[stepped],
                obs[stepped],
                rewards[stepped],
                terminated[stepped],
                truncated[stepped],
                {k: v[stepped] for k, v in infos.items()},
                recorded[stepped],
            )
        self.counters.env_steps += int(recorded.sum())
        self.counters.idle_env_steps += int((stepped & ~recorded).sum())
        self._unpushed += int(recorded.sum())
        row = self._row[envs] + 1
        finishing = recorded & (row == self.T)
        self._row[envs] = np.where(recorded & ~finishing, row, -1)
        return obs, envs, finishing

    def _open_rollout(self, k: int) -> bool:
        """Opens rollout ``k`` (the next to open) with the newest parameters, unless the balance
        controller holds it."""
        self.probe_params()
        if self.balance and self.ahead_of_learner():
            return False
        self._open[k] = _Columns(self.T, self.num_envs, self.obs_shape[0], self.policy.version)
        self._opened += 1
        self._rollouts_this_version += 1
        return True

    def _record_results(self, envs, next_obs, rewards, terminated, truncated, infos, recorded) -> None:
        """Step results of ``envs``: their episodes, frames and training signals; written into
        their rows where their actions were ``recorded``."""
        ended = terminated | truncated
        self._streams.step(next_obs, ended, infos, envs)
        self.tracker.update(rewards, ended, time.time(), envs)  # the env's own rewards
        rewards, terminated, dones = self._signals(rewards, terminated, truncated, infos, envs)
        rewards = rewards.astype(np.float32)
        bootstrap = truncated & ~terminated & recorded
        if bootstrap.any():  # a time limit is not a terminal state: bootstrap from the final obs
            rewards[bootstrap] += self.algo.gamma * self.policy.value(infos["final_obs"][bootstrap])
        rollouts, rows = self._rollout_of[envs], self._row[envs]
        for k in np.unique(rollouts[recorded]):
            sel = recorded & (rollouts == k)
            d = self._open[int(k)].data
            d["rewards"][rows[sel], envs[sel]] = rewards[sel]
            d["dones"][rows[sel], envs[sel]] = dones[sel]

    def _on_new_version(self) -> None:
        self._rollouts_this_version = 0

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
        frames, ids = self._streams.take()
        if self._carried is not None:
            frames, ids = np.concatenate([self._carried[0], frames]), np.concatenate([self._carried[1], ids])
        obs_ids = r.pop("obs_ids")
        needed = np.isin(ids, obs_ids)
        # frames of the columns begun in later rollouts: each such column's frames from its first on
        keep_from = np.full(self.num_envs, np.iinfo(np.int64).max)
        for later_columns in self._open.values():
            began = later_columns.started
            keep_from[began] = np.minimum(keep_from[began], later_columns.first_seq[began])
        env, seq = self._streams.env_and_seq(ids)
        later = ~needed & (seq >= keep_from[env])
        self._carried = (frames[later], ids[later])
        r["frames"], r["obs_frames"] = frame_positions(frames[needed], ids[needed], obs_ids, self.id)
        self._unpushed -= self.T * self.num_envs
        r["version"] = np.array(columns.version, np.int64)
        r["created"] = np.array(time.time(), np.float64)
        nbytes = sum(v.nbytes for v in r.values())
        if self.sender.push(r):
            self.counters.messages_sent += 1
            self.counters.bytes_sent += nbytes
