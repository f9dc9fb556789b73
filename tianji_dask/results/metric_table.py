"""The variables of ``metrics.nc`` and ``episodes.nc``: name, ``long_name``, units and dtype,
and for each time variable the function that computes its value in a row. ``docs/metrics.md``
defines each of them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tianji_dask.results.host_record import HostRecord, param_version
from tianji_dask.roles.heartbeats import ROLES

Hosts = list[tuple[int, HostRecord]]  # (host id, its record), by id


@dataclass(frozen=True)
class RowInputs:
    """What one row is computed from: each role's hosts, with their rates since the previous
    row, and the recorder's own counts."""

    actors: Hosts
    buffers: Hosts
    learners: Hosts
    env_steps: int
    episodes: int
    return_mean_100: float
    losses: dict[str, int]
    actors_per_group: int  # maps an actor to its group's learner
    learners_per_group: int

    def hosts(self, role: str) -> Hosts:
        return {"actor": self.actors, "buffer": self.buffers, "learner": self.learners}[role]


Value = Callable[[RowInputs], float]  # a time variable's value in a row


class TimeVar(NamedTuple):
    long_name: str
    units: str
    dtype: str
    value: Value


def total(hosts: Hosts, key: str) -> float:
    """Sum of a cumulative counter over hosts; one a host did not send (or sent as None) counts 0."""
    return sum(v for _, h in hosts if not math.isnan(v := h.value(key)))


def rate(hosts: Hosts, name: str) -> float:
    """Sum of a rate over the hosts whose rate is known (NaN where none is)."""
    vals = [h.rates.get(name, math.nan) for _, h in hosts]
    vals = [v for v in vals if not math.isnan(v)]
    return float(sum(vals)) if vals else math.nan


def summed(role: str, counter: str, as_type: type = float) -> Value:
    """The sum of a cumulative counter over ``role``'s hosts."""
    return lambda s: as_type(total(s.hosts(role), counter))


def rate_sum(role: str, name: str) -> Value:
    return lambda s: rate(s.hosts(role), name)


def mean_over(role: str, key: str) -> Value:
    return lambda s: _nanmean([h.raw.get(key, math.nan) for _, h in s.hosts(role)])


def max_over(role: str, key: str) -> Value:
    return lambda s: _nanmax([h.raw.get(key, math.nan) for _, h in s.hosts(role)])


def in_updates(s: RowInputs) -> float:
    """Sum over learners of samples per second of update time: each one's ``train_fps`` over the
    fraction of the interval it spent updating (NaN where none updated)."""
    vals = [
        h.rates.get("train_fps", math.nan) / busy
        for _, h in s.learners
        if (busy := h.rates.get("train_busy", math.nan)) > 0
    ]
    return float(sum(vals)) if vals else math.nan


def replay_ratio(s: RowInputs) -> float:
    received, samples = total(s.buffers, "received"), total(s.learners, "samples")
    return samples / received if received > 0 else math.nan


def replay_size(s: RowInputs) -> float:
    return total(s.buffers, "size") if s.buffers else math.nan


def replay_fill(s: RowInputs) -> float:
    capacity = total(s.buffers, "capacity")
    return replay_size(s) / capacity if capacity > 0 else math.nan


def latest_param_version(s: RowInputs) -> float:
    # an actor's version was published, so it bounds the latest one from below: a row can hold a
    # learner heartbeat older than an actor's, which made policy_lag negative
    return _nanmax([param_version(h) for _, h in [*s.learners, *s.actors]])


def policy_lag(s: RowInputs) -> float:
    """Mean over actors of (their group's latest version at the actor's heartbeat time - the
    version the actor used then). Comparing each host's latest heartbeat instead made the lag
    jump by a heartbeat interval's worth of updates whenever the learner's beat came later than
    the actor's. The version at that time is the larger of the learner's, interpolated between
    its last two heartbeats, and any version an actor of the group already held by then (it was
    published)."""
    A, L = s.actors_per_group, s.learners_per_group
    learner_of = {hid: h for hid, h in s.learners}
    lags = []
    for aid, a in s.actors:
        v_a = param_version(a)
        if math.isnan(v_a):
            continue
        group = aid // A if A else None
        lead = learner_of.get(group * L) if group is not None else None
        mine = [lead] if lead is not None else [h for _, h in s.learners]
        held = [param_version(b) for bid, b in s.actors if b.t <= a.t and (group is None or bid // A == group)]
        latest = _nanmax([*(_learner_version_at(h, a.t) for h in mine), *held])
        if not math.isnan(latest):
            lags.append(max(0.0, latest - v_a))
    return float(np.mean(lags)) if lags else math.nan


def loss_count(key: str) -> Value:
    return lambda s: s.losses[key]


# name -> TimeVar. Order is the order in the dataset.
TIME_VARS: dict[str, TimeVar] = {
    "env_steps": TimeVar("env steps (all actors)", "1", "int64", lambda s: s.env_steps),
    "env_fps": TimeVar("env steps per second (all actors)", "s-1", "float64", rate_sum("actor", "env_fps")),
    "receive_fps": TimeVar(
        "transitions received per second (all buffers)", "s-1", "float64", rate_sum("buffer", "receive_fps")
    ),
    "train_fps": TimeVar(
        "samples consumed per second (all learners)", "s-1", "float64", rate_sum("learner", "train_fps")
    ),
    "train_fps_in_updates": TimeVar(
        "samples consumed per second of update time (all learners): the learners' rate while they update",
        "s-1",
        "float64",
        in_updates,
    ),
    "train_busy": TimeVar(
        "learner time in updates per second of wall time, summed over learners (1: one learner always updating)",
        "1",
        "float64",
        rate_sum("learner", "train_busy"),
    ),
    "send_bytes_per_s": TimeVar(
        "trajectory bytes sent per second (all actors)",
        "B s-1",
        "float64",
        rate_sum("actor", "send_bytes_per_s"),
    ),
    "updates": TimeVar("learner updates (all learners)", "1", "int64", summed("learner", "updates", int)),
    "samples": TimeVar("samples consumed (cumulative, all learners)", "1", "int64", summed("learner", "samples", int)),
    "episodes": TimeVar("episodes finished (all actors)", "1", "int64", lambda s: s.episodes),
    "return_mean_100": TimeVar("mean return of the last 100 episodes", "1", "float64", lambda s: s.return_mean_100),
    "replay_ratio": TimeVar("samples consumed / transitions received", "1", "float64", replay_ratio),
    "received": TimeVar(
        "transitions received (cumulative, all buffers): the replay ratio over an interval is the "
        "growth of samples over the growth of this",
        "1",
        "int64",
        summed("buffer", "received", int),
    ),
    "replay_size": TimeVar("transitions held in replay (all buffers)", "1", "float64", lambda s: float(replay_size(s))),
    "replay_fill": TimeVar("replay fill fraction (held / capacity)", "1", "float64", replay_fill),
    "param_version": TimeVar("latest published parameter version", "1", "float64", latest_param_version),
    "policy_lag": TimeVar("learner parameter version minus mean actor version", "1", "float64", policy_lag),
    "epsilon": TimeVar(
        "exploration epsilon (mean over actors of each actor's mean over its envs)",
        "1",
        "float64",
        mean_over("actor", "epsilon"),
    ),
    "loss": TimeVar(
        "learner loss (mean since the learner's previous heartbeat)",
        "1",
        "float64",
        mean_over("learner", "loss"),
    ),
    "q_mean": TimeVar(
        "mean Q value (mean since the learner's previous heartbeat)",
        "1",
        "float64",
        mean_over("learner", "q_mean"),
    ),
    "blocked_s": TimeVar(
        "actor time blocked on channel credit (cumulative, all actors)",
        "s",
        "float64",
        summed("actor", "blocked_s"),
    ),
    "throttled_actor_s": TimeVar(
        "actor time paused by the balance controller (cumulative, all actors)",
        "s",
        "float64",
        summed("actor", "throttled_s"),
    ),
    "throttled_learner_s": TimeVar(
        "learner time paused by the balance controller (cumulative, all learners)",
        "s",
        "float64",
        summed("learner", "throttled_s"),
    ),
    "train_s": TimeVar(
        "learner time spent in updates (cumulative, all learners)",
        "s",
        "float64",
        summed("learner", "train_s"),
    ),
    "dropped": TimeVar(
        "trajectory chunks dropped by the channel (cumulative, all actors)",
        "1",
        "int64",
        summed("actor", "dropped", int),
    ),
    "seq_gaps": TimeVar(
        "sequence gaps seen by the buffers (cumulative)", "1", "int64", summed("buffer", "seq_gaps", int)
    ),
    "stale_dropped": TimeVar(
        "transitions dropped unused for exceeding max_policy_lag or buffer room (cumulative, all buffers)",
        "1",
        "int64",
        summed("buffer", "stale_dropped", int),
    ),
    "policy_lag_mean": TimeVar(
        "mean policy lag of the rollouts trained on since the previous row "
        "(learner version minus the rollout's version)",
        "1",
        "float64",
        mean_over("learner", "policy_lag_mean"),
    ),
    "policy_lag_max": TimeVar(
        "largest policy lag of the rollouts trained on since the previous row",
        "1",
        "float64",
        max_over("learner", "policy_lag_max"),
    ),
    "behaviour_weight_mean": TimeVar(
        "mean weight pi_prox / pi_acted of the samples trained on since the previous row "
        "(algo.staleness_correction: decoupled; 1 without it)",
        "1",
        "float64",
        mean_over("learner", "behaviour_weight"),
    ),
    "sample_age_s": TimeVar(
        "mean age of the rollouts trained on since the previous row (training time minus creation time)",
        "s",
        "float64",
        mean_over("learner", "sample_age_s"),
    ),
    "group_param_distance": TimeVar(
        "largest L2 distance between a group's parameters and the other "
        "groups' latest snapshots, at the last gossip round",
        "1",
        "float64",
        max_over("learner", "group_distance"),
    ),
    # the loss counts (LOSS_KEYS)
    "actor_restarts": TimeVar(
        "actor hosts re-created after their worker was lost (cumulative)", "1", "int64", loss_count("actor_restarts")
    ),
    "buffer_restarts": TimeVar(
        "buffer hosts re-created after their worker was lost (cumulative)", "1", "int64", loss_count("buffer_restarts")
    ),
    "learner_restarts": TimeVar(
        "learner hosts re-created after their worker was lost (cumulative)",
        "1",
        "int64",
        loss_count("learner_restarts"),
    ),
    "lost_env_steps": TimeVar(
        "env steps lost with re-created actors, not yet sent (cumulative)", "1", "int64", loss_count("lost_env_steps")
    ),
    "lost_episodes": TimeVar(
        "episodes in progress lost with re-created actors (cumulative)", "1", "int64", loss_count("lost_episodes")
    ),
    "lost_replay": TimeVar(
        "transitions held by the buffers of rebuilt groups and not in the replay kept for them, "
        "gone with them (cumulative)",
        "1",
        "int64",
        loss_count("lost_replay"),
    ),
    "restored_replay": TimeVar(
        "transitions put back into re-created buffers from the replay kept in the driver (cumulative)",
        "1",
        "int64",
        loss_count("restored_replay"),
    ),
    "lost_updates": TimeVar(
        "learner updates undone by restoring an older learner state (cumulative)",
        "1",
        "int64",
        loss_count("lost_updates"),
    ),
}
# driver-side counts of host re-creation and what was lost (``MetricsRecorder.record_losses``)
LOSS_KEYS = (
    "actor_restarts",
    "buffer_restarts",
    "learner_restarts",
    "lost_env_steps",
    "lost_episodes",
    "lost_replay",
    "lost_updates",
    "restored_replay",
)
# Variables that files of an earlier version lack, with the value a continued run gives their
# earlier rows: 0, something that did not exist yet (restored_replay) or was not recorded yet
# (samples: a run continued from such files counts them from its continuation).
ADDED_LATER = {"restored_replay": 0, "samples": 0}
# Cumulative time variables that a continued run carries on from the previous run's last row;
# env_steps, the episode count and the loss counts carry on by their own.
CARRIED = (
    "updates",
    "samples",
    "blocked_s",
    "throttled_actor_s",
    "throttled_learner_s",
    "train_s",
    "dropped",
    "seq_gaps",
    "stale_dropped",
)
# name -> (dim, long_name, units, source) with source the per-host value stored each row.
HOST_VARS: dict[str, tuple[str, str, str, str]] = {
    "actor_env_fps": ("actor", "env steps per second of one actor", "s-1", "env_fps"),
    "actor_env_steps": ("actor", "env steps of one actor", "1", "env_steps"),
    "actor_param_version": ("actor", "parameter version in use by one actor", "1", "param_version"),
    "actor_blocked_s": ("actor", "time one actor was blocked on channel credit (cumulative)", "s", "blocked_s"),
    "buffer_receive_fps": ("buffer", "transitions received per second by one buffer", "s-1", "receive_fps"),
    "learner_train_fps": ("learner", "samples consumed per second by one learner", "s-1", "train_fps"),
    "actor_rss_mb": ("actor", "resident memory of one actor's worker process", "MB", "rss_mb"),
    "buffer_rss_mb": ("buffer", "resident memory of one buffer's worker process", "MB", "rss_mb"),
    "learner_rss_mb": ("learner", "resident memory of one learner's worker process", "MB", "rss_mb"),
    "actor_open_fds": ("actor", "open file descriptors of one actor's worker process", "1", "open_fds"),
    "buffer_open_fds": ("buffer", "open file descriptors of one buffer's worker process", "1", "open_fds"),
    "learner_open_fds": ("learner", "open file descriptors of one learner's worker process", "1", "open_fds"),
    "actor_threads": ("actor", "threads of one actor's worker process", "1", "threads"),
    "buffer_threads": ("buffer", "threads of one buffer's worker process", "1", "threads"),
    "learner_threads": ("learner", "threads of one learner's worker process", "1", "threads"),
}
# Per role: the values kept per host each row, in the order of HOST_VARS.
HOST_KEYS = {role: tuple(src for dim, _, _, src in HOST_VARS.values() if dim == role) for role in ROLES}

# One record per evaluation of the policy while the run trained (run.eval_every_env_steps), along
# metrics.nc's ``evaluation`` dimension: name -> (long_name, units, dtype).
EVAL_VARS: dict[str, tuple[str, str, str]] = {
    "eval_return_mean": (
        "mean return of the policy without exploration over run.eval_episodes episodes",
        "1",
        "float64",
    ),
    "eval_return_std": ("standard deviation of those returns", "1", "float64"),
    "eval_env_steps": ("env steps (all actors) when the evaluated policy was taken", "1", "int64"),
    "eval_time": ("wall time since start when the evaluated policy was taken", "s", "float64"),
}

EPISODE_VARS: dict[str, tuple[str, str, str]] = {
    "return": ("episode return (undiscounted)", "1", "float64"),
    "length": ("episode length", "1", "int64"),
    "actor": ("actor host that ran the episode", "1", "int64"),
    "wall_time": ("wall time the episode finished, since start", "s", "float64"),
    "env_steps": ("env steps (all actors) when the episode was reported", "1", "int64"),
}


def time_row(time: float, s: RowInputs, carried: dict[str, float]) -> dict[str, float]:
    """One row of the time variables: each one's value, plus what a continued run carries on."""
    row: dict[str, float] = {"time": time}
    for name, var in TIME_VARS.items():
        v = var.value(s)
        row[name] = type(v)(v + carried[name]) if name in carried else v
    return row


def host_row(s: RowInputs) -> dict[tuple[str, int], tuple[float, ...]]:
    """Per (role, host id): the values of HOST_KEYS[role] in one row."""
    return {
        (role, hid): tuple(_host_value(h, k) for k in HOST_KEYS[role]) for role in ROLES for hid, h in s.hosts(role)
    }


def _host_value(h: HostRecord, key: str) -> float:
    if key.endswith("fps"):
        return h.rates.get(key, math.nan)
    return param_version(h) if key == "param_version" else h.value(key)


def _learner_version_at(h: HostRecord, t: float) -> float:
    """A learner's version at time ``t``, between its last two heartbeats (linear), else the
    nearest of them."""
    v = param_version(h)
    if t >= h.t or math.isnan(h.prev_t) or math.isnan(h.prev_version):
        return v
    if t <= h.prev_t:
        return h.prev_version
    return h.prev_version + (v - h.prev_version) * (t - h.prev_t) / (h.t - h.prev_t)


def _nanmean(vals: list[float]) -> float:
    vals = [v for v in vals if not math.isnan(v)]
    return float(sum(vals) / len(vals)) if vals else math.nan


def _nanmax(vals: list[float]) -> float:
    vals = [v for v in vals if not math.isnan(v)]
    return float(max(vals)) if vals else math.nan
