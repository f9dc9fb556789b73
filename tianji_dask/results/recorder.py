"""Run results: heartbeats in, xarray time series and per-episode records out, written as NetCDF.

Every host (actor, buffer, learner) sends the driver a heartbeat of *cumulative* counters about
twice a second. :class:`MetricsRecorder` keeps the latest heartbeat of each host, turns the
counters into one time row per metrics interval (rates from counter differences, sums over hosts,
the 100-episode return window, staleness, buffer fill) and builds ``metrics.nc`` / ``episodes.nc``.
Every variable carries ``long_name`` and ``units`` so plots label themselves; ``docs/metrics.md``
defines each of them.
"""

from __future__ import annotations

import collections
import datetime as _dt
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from tianji_dask.roles.heartbeats import ROLES, growing_counters, rates

# Counters that only grow while a host lives. When a host is re-created (its heartbeat has a
# higher ``incarnation``), or one of them goes down, its counters began again at zero; the
# recorder then adds the old totals as an offset so sums over hosts and rates stay monotone.
_GROWING = {role: growing_counters(role) for role in ROLES}
# Per role: counter whose rate over the last interval is reported, keyed by the name of the rate.
_RATES = {role: rates(role) for role in ROLES}

# name -> (long_name, units, dtype). Order is the order in the dataset.
_TIME_VARS: dict[str, tuple[str, str, str]] = {
    "env_steps": ("env steps (all actors)", "1", "int64"),
    "env_fps": ("env steps per second (all actors)", "s-1", "float64"),
    "receive_fps": ("transitions received per second (all buffers)", "s-1", "float64"),
    "train_fps": ("samples consumed per second (all learners)", "s-1", "float64"),
    "train_fps_in_updates": (
        "samples consumed per second of update time (all learners): the learners' rate while they update",
        "s-1",
        "float64",
    ),
    "train_busy": (
        "learner time in updates per second of wall time, summed over learners (1: one learner always updating)",
        "1",
        "float64",
    ),
    "send_bytes_per_s": ("trajectory bytes sent per second (all actors)", "B s-1", "float64"),
    "updates": ("learner updates (all learners)", "1", "int64"),
    "samples": ("samples consumed (cumulative, all learners)", "1", "int64"),
    "episodes": ("episodes finished (all actors)", "1", "int64"),
    "return_mean_100": ("mean return of the last 100 episodes", "1", "float64"),
    "replay_ratio": ("samples consumed / transitions received", "1", "float64"),
    "replay_size": ("transitions held in replay (all buffers)", "1", "float64"),
    "replay_fill": ("replay fill fraction (held / capacity)", "1", "float64"),
    "param_version": ("latest published parameter version", "1", "float64"),
    "policy_lag": ("learner parameter version minus mean actor version", "1", "float64"),
    "epsilon": ("exploration epsilon (mean over actors of each actor's mean over its envs)", "1", "float64"),
    "loss": ("learner loss (mean since the learner's previous heartbeat)", "1", "float64"),
    "q_mean": ("mean Q value (mean since the learner's previous heartbeat)", "1", "float64"),
    "blocked_s": ("actor time blocked on channel credit (cumulative, all actors)", "s", "float64"),
    "throttled_actor_s": ("actor time paused by the balance controller (cumulative, all actors)", "s", "float64"),
    "throttled_learner_s": ("learner time paused by the balance controller (cumulative, all learners)", "s", "float64"),
    "train_s": ("learner time spent in updates (cumulative, all learners)", "s", "float64"),
    "dropped": ("trajectory chunks dropped by the channel (cumulative, all actors)", "1", "int64"),
    "seq_gaps": ("sequence gaps seen by the buffers (cumulative)", "1", "int64"),
    "stale_dropped": (
        "transitions dropped unused for exceeding max_policy_lag or buffer room (cumulative, all buffers)",
        "1",
        "int64",
    ),
    "policy_lag_mean": (
        "mean policy lag of the rollouts trained on since the previous row "
        "(learner version minus the rollout's version)",
        "1",
        "float64",
    ),
    "policy_lag_max": ("largest policy lag of the rollouts trained on since the previous row", "1", "float64"),
    "behaviour_weight_mean": (
        "mean weight pi_prox / pi_acted of the samples trained on since the previous row "
        "(algo.staleness_correction: decoupled; 1 without it)",
        "1",
        "float64",
    ),
    "sample_age_s": (
        "mean age of the rollouts trained on since the previous row (training time minus creation time)",
        "s",
        "float64",
    ),
    "group_param_distance": (
        "largest L2 distance between a group's parameters and the other "
        "groups' latest snapshots, at the last gossip round",
        "1",
        "float64",
    ),
    "actor_restarts": ("actor hosts re-created after their worker was lost (cumulative)", "1", "int64"),
    "buffer_restarts": ("buffer hosts re-created after their worker was lost (cumulative)", "1", "int64"),
    "learner_restarts": ("learner hosts re-created after their worker was lost (cumulative)", "1", "int64"),
    "lost_env_steps": ("env steps lost with re-created actors, not yet sent (cumulative)", "1", "int64"),
    "lost_episodes": ("episodes in progress lost with re-created actors (cumulative)", "1", "int64"),
    "lost_replay": (
        "transitions held by the buffers of rebuilt groups and not in the replay kept for them, "
        "gone with them (cumulative)",
        "1",
        "int64",
    ),
    "restored_replay": (
        "transitions put back into re-created buffers from the replay kept in the driver (cumulative)",
        "1",
        "int64",
    ),
    "lost_updates": ("learner updates undone by restoring an older learner state (cumulative)", "1", "int64"),
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
_ADDED_LATER = {"restored_replay": 0, "samples": 0}
# Cumulative time variables that a continued run (``continue_from``) carries on from the
# previous run's last row; env_steps, the episode count and the loss counts carry on by their own.
_CARRIED = (
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
_HOST_VARS: dict[str, tuple[str, str, str, str]] = {
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
# Per role: the values kept per host each row, in the order of _HOST_VARS.
_HOST_KEYS = {role: tuple(src for dim, _, _, src in _HOST_VARS.values() if dim == role) for role in ROLES}

_EPISODE_VARS: dict[str, tuple[str, str, str]] = {
    "return": ("episode return (undiscounted)", "1", "float64"),
    "length": ("episode length", "1", "int64"),
    "actor": ("actor host that ran the episode", "1", "int64"),
    "wall_time": ("wall time the episode finished, since start", "s", "float64"),
    "env_steps": ("env steps (all actors) when the episode was reported", "1", "int64"),
}

_VERSIONED = ("torch", "dask", "distributed", "gymnasium", "numpy", "xarray")

RUNNING = "running"  # the status attr of the files a run writes before it has ended


class _Host:
    """Latest heartbeat of one host plus the reference point of its rates."""

    __slots__ = ("t", "raw", "offset", "ref_t", "ref", "rates", "prev_t", "prev_version", "incarnation")

    def __init__(self, t: float, counters: dict[str, float], incarnation: int = 0):
        self.t = t
        self.incarnation = incarnation
        self.raw = counters
        self.prev_t = math.nan  # the heartbeat before the latest: for versions between the two
        self.prev_version = math.nan
        self.offset: dict[str, float] = {}
        self.ref_t = t
        self.ref = dict(counters)
        self.rates: dict[str, float] = {}

    def value(self, key: str, default: float = 0.0) -> float:
        return self.raw.get(key, default) + self.offset.get(key, 0.0)


class MetricsRecorder:
    """Turns heartbeats into time series.

    Call protocol: ``add(heartbeat)`` as they arrive (thread-safe), ``row(t_rel)`` every metrics
    interval, and ``dataset()`` / ``episodes_dataset()`` / ``write(run_dir)`` at any time, also
    while the run goes on. ``last_seen()`` serves supervision.

    Rates (``*_fps``) are the difference of a host's cumulative counter between the heartbeat
    used by the previous row and the latest one, divided by the difference of the heartbeats' own
    ``t``. A host with no new heartbeat since the previous row keeps its previous rate; a host's
    first rate needs two heartbeats (NaN before). Sums over hosts skip hosts whose rate is NaN.
    """

    def __init__(
        self, *, run_name: str, target_return: float | None, config_json: str, t0: float, attrs: dict | None = None
    ):
        if not isinstance(config_json, str):
            raise TypeError(
                f"config_json must be a JSON string, got {type(config_json).__name__}; "
                "pass e.g. config.model_dump_json()"
            )
        try:
            json.loads(config_json)
        except ValueError as e:
            raise ValueError(f"config_json is not valid JSON ({e}); pass e.g. config.model_dump_json()") from e
        self.run_name = run_name
        self.target_return = None if target_return is None else float(target_return)
        self.config_json = config_json
        self.t0 = float(t0)
        topo = json.loads(config_json).get("topology") or {}
        self._actors_per_group = int(topo.get("actors") or 0)  # maps an actor to its group's learner
        self._learners_per_group = int(topo.get("learners") or 1)
        self._extra_attrs = _netcdf_attrs(attrs or {})
        self._provenance = provenance_attrs()  # at start: the code this run was launched with
        self._lock = threading.Lock()
        self._hosts: dict[tuple[str, int], _Host] = {}
        self._rows: list[dict[str, Any]] = []
        self._host_rows: list[dict[tuple[str, int], tuple[float, ...]]] = []
        self._ep_cols: dict[str, list] = {k: [] for k in _EPISODE_VARS}
        self._window: collections.deque[float] = collections.deque(maxlen=100)
        self.time_to_target_s = math.nan
        self._status, self._error = RUNNING, ""
        self._losses = dict.fromkeys(LOSS_KEYS, 0)
        # a continued run (continue_from): the previous run's files and where this one carries on
        self._prior: xr.Dataset | None = None
        self._time_offset = 0.0
        self._carried: dict[str, float] = {}
        self._prior_actor_steps: dict[tuple[str, int], float] = {}

    def continue_from(self, metrics: xr.Dataset, episodes: xr.Dataset) -> None:
        """Carry on the run whose ``metrics.nc`` and ``episodes.nc`` these are (loaded): before
        any heartbeat, so that ``time`` continues from its last row, cumulative counters
        (``env_steps`` and each actor's, ``updates``, the loss counts...) from their last values,
        and the episodes (and the 100-episode window) from its episodes. :meth:`dataset` and
        :meth:`episodes_dataset` then hold the previous rows and episodes followed by the new."""
        missing = missing_variables(metrics, episodes)
        if missing:
            raise ValueError(f"cannot continue from files without {', '.join(missing)}")
        with self._lock:
            if self._hosts or self._rows:
                raise RuntimeError("continue_from must come before the first heartbeat and row")
            self._prior = metrics.copy()
            for k, v in _ADDED_LATER.items():
                if k not in self._prior:
                    long_name, units, dtype = _TIME_VARS[k]
                    added = xr.full_like(self._prior["env_steps"], v, dtype=dtype)
                    self._prior[k] = added.assign_attrs(long_name=long_name, units=units)
            metrics = self._prior
            n = metrics.sizes["time"]
            if n:
                last = metrics.isel(time=-1)
                self._time_offset = float(last["time"])
                self._carried = {k: float(last[k]) for k in _CARRIED}
                for k in LOSS_KEYS:
                    self._losses[k] = int(last[k])
                steps = last["actor_env_steps"]
                self._prior_actor_steps = {
                    ("actor", int(a)): float(v) for a, v in zip(steps["actor"].values, steps.values) if v == v
                }
            for k in _EPISODE_VARS:
                self._ep_cols[k] = [v.item() for v in episodes[k].values]
            self._window.extend(self._ep_cols["return"][-100:])
            prior_ttt = float(metrics.attrs.get("time_to_target_s", math.nan))
            same_target = float(metrics.attrs.get("target_return", math.nan)) == (
                math.nan if self.target_return is None else self.target_return
            )
            if same_target and not math.isnan(prior_ttt):
                self.time_to_target_s = prior_ttt
            starts = json.loads(metrics.attrs.get("continued_at_s", "[]"))
            self._extra_attrs["continued_at_s"] = json.dumps([*starts, self._time_offset])

    # ------------------------------------------------------------------ input
    def add(self, heartbeat: dict) -> None:
        """Record one heartbeat: keep its counters as the host's latest, append its episodes.

        A heartbeat older than the latest one of the same host (out-of-order delivery) only
        contributes its episodes. Raises ValueError for a heartbeat without a known role.
        """
        role = heartbeat.get("role")
        if role not in ROLES:
            raise ValueError(f"heartbeat role must be one of {ROLES}, got {role!r} (keys: {sorted(heartbeat)})")
        key = (role, int(heartbeat["id"]))
        t = float(heartbeat["t"])
        incarnation = int(heartbeat.get("incarnation", 0))
        counters = {k: _num(v) for k, v in (heartbeat.get("counters") or {}).items()}
        with self._lock:
            host = self._hosts.get(key)
            if host is None:
                host = self._hosts[key] = _Host(t, counters, incarnation)
                if key in self._prior_actor_steps:  # a continued run's actor carries on its count
                    host.offset["env_steps"] = self._prior_actor_steps[key]
                    host.ref = {k: host.value(k) for k in host.ref}
            elif incarnation > host.incarnation or (
                incarnation == host.incarnation and t > host.t
            ):  # a late heartbeat of an earlier incarnation only brings its episodes
                began_again = incarnation > host.incarnation or any(
                    counters.get(k, math.inf) < host.raw.get(k, -math.inf) for k in _GROWING[role]
                )
                if began_again:
                    for k in _GROWING[role]:
                        if not math.isnan(host.raw.get(k, math.nan)):
                            host.offset[k] = host.offset.get(k, 0.0) + host.raw[k]
                host.prev_t, host.prev_version = host.t, _version(host)
                host.t, host.raw, host.incarnation = t, counters, incarnation
            steps = self._env_steps_locked()
            for ep in heartbeat.get("episodes") or ():
                ret, length, t_end = float(ep[0]), int(ep[1]), float(ep[2])
                c = self._ep_cols
                c["return"].append(ret)
                c["length"].append(length)
                c["actor"].append(key[1])
                c["wall_time"].append(t_end - self.t0 + self._time_offset)
                c["env_steps"].append(steps)
                self._window.append(ret)
                if (
                    self.target_return is not None
                    and math.isnan(self.time_to_target_s)
                    and len(c["return"]) >= 100
                    and self._mean_100() >= self.target_return
                ):
                    self.time_to_target_s = t_end - self.t0 + self._time_offset

    def record_losses(self, **counts: int) -> None:
        """Add to the driver's counts of re-created hosts and of what was lost with them
        (keys of ``LOSS_KEYS``); each row carries the running totals."""
        unknown = set(counts) - set(LOSS_KEYS)
        if unknown:
            raise ValueError(f"unknown loss counts {sorted(unknown)}; known: {LOSS_KEYS}")
        with self._lock:
            for k, v in counts.items():
                self._losses[k] += int(v)

    def losses(self) -> dict[str, int]:
        with self._lock:
            return dict(self._losses)

    def host_total(self, role: str, host_id: int, counter: str) -> float:
        """A host's cumulative ``counter`` over all its incarnations (0 before its first heartbeat)."""
        with self._lock:
            host = self._hosts.get((role, host_id))
            return 0.0 if host is None else host.value(counter)

    def _policy_lag(self, actors, learners) -> float:
        """Mean over actors of (their group's latest version at the actor's heartbeat time -
        the version the actor used then). Comparing each host's latest heartbeat instead made
        the lag jump by a heartbeat interval's worth of updates whenever the learner's beat came
        later than the actor's. The version at that time is the larger of the learner's,
        interpolated between its last two heartbeats, and any version an actor of the group
        already held by then (it was published)."""
        A, L = self._actors_per_group, self._learners_per_group
        learner_of = {hid: h for hid, h in learners}
        lags = []
        for aid, a in actors:
            v_a = _version(a)
            if math.isnan(v_a):
                continue
            group = aid // A if A else None
            lead = learner_of.get(group * L) if group is not None else None
            mine = [lead] if lead is not None else [h for _, h in learners]
            held = [_version(b) for bid, b in actors if b.t <= a.t and (group is None or bid // A == group)]
            latest = _nanmax([*(_learner_version_at(h, a.t) for h in mine), *held])
            if not math.isnan(latest):
                lags.append(max(0.0, latest - v_a))
        return float(np.mean(lags)) if lags else math.nan

    # ---------------------------------------------------------------- summary
    @property
    def time_offset(self) -> float:
        """Where this recorder's ``time`` starts: the last row of the run it continues, else 0."""
        return self._time_offset

    @property
    def env_steps(self) -> int:
        """Env steps produced so far, summed over actors (latest heartbeats)."""
        with self._lock:
            return self._env_steps_locked()

    @property
    def return_mean_100(self) -> float:
        """Mean return of the last min(100, n) episodes (arrival order); NaN before any."""
        with self._lock:
            return self._mean_100()

    @property
    def episodes(self) -> int:
        """Number of episodes finished so far."""
        with self._lock:
            return len(self._ep_cols["return"])

    def last_seen(self) -> dict[tuple[str, int], float]:
        """Unix time (the heartbeat's own ``t``) of the latest heartbeat per (role, id)."""
        with self._lock:
            return {k: h.t for k, h in self._hosts.items()}

    def _env_steps_locked(self) -> int:
        made = sum(v for (r, _), h in self._hosts.items() if r == "actor" and not math.isnan(v := h.value("env_steps")))
        # a continued run's actors that have not reported yet still count what they made before
        return int(made + sum(v for key, v in self._prior_actor_steps.items() if key not in self._hosts))

    def _mean_100(self) -> float:
        return float(np.mean(self._window)) if self._window else math.nan

    # ------------------------------------------------------------------- rows
    def row(self, t_rel: float | None = None) -> dict:
        """Append one time row from the latest counters and return it (scalars, for progress).

        ``t_rel`` is the row's time in seconds since ``t0``; default now.
        """
        if t_rel is None:
            t_rel = time.time() - self.t0
        with self._lock:
            by_role: dict[str, list[tuple[int, _Host]]] = {r: [] for r in ROLES}
            for (role, hid), h in sorted(self._hosts.items()):
                by_role[role].append((hid, h))
                dt = h.t - h.ref_t
                if dt > 0:  # no new heartbeat (dt == 0) keeps the previous rate
                    for name, counter in _RATES[role].items():
                        h.rates[name] = (h.value(counter) - h.ref.get(counter, 0.0)) / dt
                    h.ref_t = h.t
                    h.ref = {c: h.value(c) for c in _RATES[role].values()}
            actors, buffers, learners = by_role["actor"], by_role["buffer"], by_role["learner"]

            def total(hosts, key):  # a counter a host did not send (or sent as None) counts 0
                return sum(v for _, h in hosts if not math.isnan(v := h.value(key)))

            def rate(hosts, name):
                vals = [h.rates.get(name, math.nan) for _, h in hosts]
                vals = [v for v in vals if not math.isnan(v)]
                return float(sum(vals)) if vals else math.nan

            received, samples = total(buffers, "received"), total(learners, "samples")
            capacity = total(buffers, "capacity")
            size = total(buffers, "size") if buffers else math.nan
            actor_versions = [_version(h) for _, h in actors]
            learner_versions = [_version(h) for _, h in learners]
            # an actor's version was published, so it bounds the latest one from below: a row can
            # hold a learner heartbeat older than an actor's, which made policy_lag negative
            param_version = _nanmax([*learner_versions, *actor_versions])
            r = {
                "time": float(t_rel) + self._time_offset,
                "env_steps": self._env_steps_locked(),
                "env_fps": rate(actors, "env_fps"),
                "receive_fps": rate(buffers, "receive_fps"),
                "train_fps": rate(learners, "train_fps"),
                "train_fps_in_updates": _in_updates(learners),
                "train_busy": rate(learners, "train_busy"),
                "send_bytes_per_s": rate(actors, "send_bytes_per_s"),
                "updates": int(total(learners, "updates")),
                "samples": int(samples),
                "episodes": len(self._ep_cols["return"]),
                "return_mean_100": self._mean_100(),
                "replay_ratio": samples / received if received > 0 else math.nan,
                "replay_size": float(size),
                "replay_fill": size / capacity if capacity > 0 else math.nan,
                "param_version": param_version,
                "policy_lag": self._policy_lag(actors, learners),
                "epsilon": _nanmean([h.raw.get("epsilon", math.nan) for _, h in actors]),
                "loss": _nanmean([h.raw.get("loss", math.nan) for _, h in learners]),
                "q_mean": _nanmean([h.raw.get("q_mean", math.nan) for _, h in learners]),
                "blocked_s": float(total(actors, "blocked_s")),
                "throttled_actor_s": float(total(actors, "throttled_s")),
                "throttled_learner_s": float(total(learners, "throttled_s")),
                "train_s": float(total(learners, "train_s")),
                "dropped": int(total(actors, "dropped")),
                "seq_gaps": int(total(buffers, "seq_gaps")),
                "stale_dropped": int(total(buffers, "stale_dropped")),
                "policy_lag_mean": _nanmean([h.raw.get("policy_lag_mean", math.nan) for _, h in learners]),
                "policy_lag_max": _nanmax([h.raw.get("policy_lag_max", math.nan) for _, h in learners]),
                "behaviour_weight_mean": _nanmean([h.raw.get("behaviour_weight", math.nan) for _, h in learners]),
                "sample_age_s": _nanmean([h.raw.get("sample_age_s", math.nan) for _, h in learners]),
                "group_param_distance": _nanmax([h.raw.get("group_distance", math.nan) for _, h in learners]),
                **self._losses,
            }
            for k in self._carried:
                r[k] = type(r[k])(r[k] + self._carried[k])
            per_host = {}
            for role in ROLES:
                for hid, h in by_role[role]:
                    per_host[(role, hid)] = tuple(
                        h.rates.get(k, math.nan)
                        if k.endswith("fps")
                        else _version(h)
                        if k == "param_version"
                        else h.value(k)
                        for k in _HOST_KEYS[role]
                    )
            self._rows.append(r)
            self._host_rows.append(per_host)
            return dict(r)

    # ---------------------------------------------------------------- datasets
    def set_outcome(self, status: str, error: str | None = None) -> None:
        """How the run ended, for the ``status`` and ``error`` attrs of every later dataset and
        write; before this call they are ``running`` and empty."""
        with self._lock:
            self._status, self._error = status, error or ""

    def set_attrs(self, attrs: dict[str, Any]) -> None:
        """Add or replace extra attrs of every later dataset and write (stored as
        ``MetricsRecorder(attrs=...)`` stores them)."""
        with self._lock:
            self._extra_attrs.update(_netcdf_attrs(attrs))

    def attrs(self) -> dict[str, Any]:
        """Dataset attrs: run name, target, time to target, config JSON, versions, git commit,
        the extra attrs, status and error."""
        a: dict[str, Any] = {
            "run_name": self.run_name,
            "target_return": math.nan if self.target_return is None else self.target_return,
            "time_to_target_s": float(self.time_to_target_s),
            "config_json": self.config_json,
            "t0_unix": self.t0,
            **self._provenance,
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        a.update(self._extra_attrs)
        a.update(status=self._status, error=self._error)
        return a

    def dataset(self) -> xr.Dataset:
        """Time series: dimension ``time`` (s since t0) plus ``actor``/``buffer``/``learner``."""
        with self._lock:
            rows = list(self._rows)
            host_rows = list(self._host_rows)
            attrs = self.attrs()
        n = len(rows)
        times = np.array([r["time"] for r in rows], dtype="float64")
        data_vars: dict[str, xr.Variable] = {}
        for name, (long_name, units, dtype) in _TIME_VARS.items():
            data_vars[name] = xr.Variable(
                ("time",), np.array([r[name] for r in rows], dtype=dtype), {"long_name": long_name, "units": units}
            )
        ids = {role: sorted({hid for hr in host_rows for (r, hid) in hr if r == role}) for role in ROLES}
        for name, (role, long_name, units, source) in _HOST_VARS.items():
            col = _HOST_KEYS[role].index(source)
            arr = np.full((n, len(ids[role])), np.nan)
            index = {hid: j for j, hid in enumerate(ids[role])}
            for i, hr in enumerate(host_rows):
                for (r, hid), vals in hr.items():
                    if r == role:
                        arr[i, index[hid]] = vals[col]
            data_vars[name] = xr.Variable(("time", role), arr, {"long_name": long_name, "units": units})
        coords = {"time": ("time", times, {"long_name": "wall time since start", "units": "s"})}
        for role in ROLES:
            coords[role] = (role, np.array(ids[role], dtype="int64"), {"long_name": f"{role} host id", "units": "1"})
        ds = xr.Dataset(data_vars, coords=coords, attrs=attrs)
        if self._prior is None:
            return ds
        names = [*_TIME_VARS, *_HOST_VARS]
        both = xr.concat([self._prior[names], ds], dim="time", join="outer", combine_attrs="drop_conflicts")
        both.attrs = attrs
        for name in _TIME_VARS:  # an outer join of host ids never touches these: keep their dtypes
            both[name] = both[name].astype(_TIME_VARS[name][2])
        return both

    def episodes_dataset(self) -> xr.Dataset:
        """Per-episode records in arrival order: dimension ``episode``."""
        with self._lock:
            cols = {k: list(v) for k, v in self._ep_cols.items()}
            attrs = self.attrs()
        n = len(cols["return"])
        data_vars = {
            name: xr.Variable(("episode",), np.array(cols[name], dtype=dtype), {"long_name": long_name, "units": units})
            for name, (long_name, units, dtype) in _EPISODE_VARS.items()
        }
        coords = {
            "episode": (
                "episode",
                np.arange(n, dtype="int64"),
                {"long_name": "episode index (arrival order)", "units": "1"},
            )
        }
        return xr.Dataset(data_vars, coords=coords, attrs=attrs)

    def write(self, run_dir: Path) -> None:
        """Write ``run_dir/metrics.nc`` and ``run_dir/episodes.nc`` atomically (through netCDF4).

        Both are written in full to temporary files before either is renamed over its old file,
        so a failure while writing them (a full disk) replaces neither.
        """
        run_dir = Path(run_dir)
        write_netcdf_files_atomic(
            {run_dir / "metrics.nc": self.dataset(), run_dir / "episodes.nc": self.episodes_dataset()}
        )


# ---------------------------------------------------------------------- helpers
def missing_variables(metrics: xr.Dataset, episodes: xr.Dataset) -> list[str]:
    """Variables a continued run needs that these files lack (files of an older version)."""
    needed = [k for k in [*_TIME_VARS, *_HOST_VARS] if k not in _ADDED_LATER]
    return [f"metrics.nc:{k}" for k in needed if k not in metrics] + [
        f"episodes.nc:{k}" for k in _EPISODE_VARS if k not in episodes
    ]


def provenance_attrs() -> dict[str, str]:
    """Versions of tianji_dask, its main dependencies and Python, plus the git commit."""
    a = {"tianji_dask_version": _package_version("tianji-dask")}
    for pkg in _VERSIONED:
        a[f"{pkg}_version"] = _package_version(pkg)
    a["python_version"] = platform.python_version()
    a["git_commit"] = git_commit()
    return a


def git_commit() -> str:
    """``git rev-parse HEAD`` of the tianji_dask source tree, ``-dirty`` if the tree has changes.

    ``"unknown"`` when the package is not a tracked file of a git checkout (e.g. installed from
    a wheel) or git is missing or fails.
    """
    pkg_dir = Path(__file__).resolve().parents[1]  # the tianji_dask package

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(pkg_dir), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout

    try:
        # A site-packages copy inside some unrelated repository must not report that repository.
        git("ls-files", "--error-unmatch", "__init__.py")
        sha = git("rev-parse", "HEAD").strip()
        dirty = bool(git("status", "--porcelain").strip())
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "") if sha else "unknown"


def _package_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)


def _learner_version_at(h: _Host, t: float) -> float:
    """A learner's version at time ``t``, between its last two heartbeats (linear), else the
    nearest of them."""
    v = _version(h)
    if t >= h.t or math.isnan(h.prev_t) or math.isnan(h.prev_version):
        return v
    if t <= h.prev_t:
        return h.prev_version
    return h.prev_version + (v - h.prev_version) * (t - h.prev_t) / (h.t - h.prev_t)


def _version(h: _Host) -> float:
    v = h.raw.get("param_version", math.nan)
    return math.nan if v < 0 else v  # -1: no parameters yet


def _in_updates(learners) -> float:
    """Sum over learners of samples per second of update time: each one's ``train_fps`` over the
    fraction of the interval it spent updating (NaN where none updated)."""
    vals = [
        h.rates.get("train_fps", math.nan) / busy
        for _, h in learners
        if (busy := h.rates.get("train_busy", math.nan)) > 0
    ]
    return float(sum(vals)) if vals else math.nan


def _nanmean(vals: list[float]) -> float:
    vals = [v for v in vals if not math.isnan(v)]
    return float(sum(vals) / len(vals)) if vals else math.nan


def _nanmax(vals: list[float]) -> float:
    vals = [v for v in vals if not math.isnan(v)]
    return float(max(vals)) if vals else math.nan


def _netcdf_attrs(attrs: dict) -> dict[str, Any]:
    """Make extra attrs storable in netCDF: drop None, dicts/lists of mixed values to JSON."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if v is None:
            continue
        if isinstance(v, bool):
            out[k] = int(v)
        elif isinstance(v, (str, int, float, np.integer, np.floating)):
            out[k] = v
        elif isinstance(v, (Path, _dt.datetime, _dt.date)):
            out[k] = v.isoformat() if not isinstance(v, Path) else str(v)
        elif isinstance(v, (dict, list, tuple)):
            try:
                out[k] = json.dumps(v)
            except TypeError as e:
                raise TypeError(f"attr {k!r}: {e}; pass JSON-serializable values") from e
        else:
            raise TypeError(
                f"attr {k!r} has type {type(v).__name__}, which netCDF cannot store; pass a str, number, dict or list"
            )
    return out


def write_netcdf_atomic(ds: xr.Dataset, path: Path) -> None:
    """Write one dataset to ``path`` atomically: a reader (or a crash) sees the old or the new file."""
    write_netcdf_files_atomic({Path(path): ds})


def _write_netcdf(ds: xr.Dataset, path: Path) -> None:
    """``ds.to_netcdf(path, engine="h5netcdf")`` without asking Dask for its scheduler. The data
    are numpy arrays, but ``to_netcdf`` picks its file lock by the process's Dask scheduler: with
    a user's default Client about (in a notebook), a distributed lock taken through that client
    (which fails once its scheduler is gone), and "no Client active" where a Client that failed or
    was closed left the setting behind. Changing the setting around the write is no way out:
    it is process-wide, and this runs in the run's thread beside the user's code.

    h5netcdf (h5py's HDF5) rather than netCDF4 (the netCDF-C library and its own HDF5): neither
    library is thread-safe, netCDF4 releases the GIL in its calls, and xarray holds its lock only
    while it opens a file, so a user's ``xr.open_dataset`` in another thread of the same process
    (a notebook's, while the run writes) crashed the process with a segmentation fault beside a
    netCDF4 write. h5py serialises its own calls, and its HDF5 is not netCDF4's. The files are
    the same netCDF-4 files; reading them stays with netCDF4, several times faster."""
    from xarray.backends import H5NetCDFStore
    from xarray.backends.locks import HDF5_LOCK

    store = H5NetCDFStore.open(path, mode="w", lock=HDF5_LOCK)
    try:
        ds.dump_to_store(store)
    finally:
        store.close()


def write_netcdf_files_atomic(datasets: dict[Path, xr.Dataset]) -> None:
    """Write every dataset to a temporary file, then rename each over its path: a failure while
    writing (a full disk) replaces none of them."""
    # Not mkstemp: its 0600 mode would stick to the result; a unique name with default mode instead.
    tmps = {path: path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp") for path in datasets}
    try:
        for path, ds in datasets.items():
            _write_netcdf(ds, tmps[path])
        for path, tmp in tmps.items():
            os.replace(tmp, path)
    finally:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
