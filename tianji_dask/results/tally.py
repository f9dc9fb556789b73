"""What a run's heartbeats said so far: each host's latest counters, the episodes, the
100-episode window, the time to target and the driver's loss counts, with the read-only
queries the driver and its callers ask while the run goes on."""

from __future__ import annotations

import collections
import math
import threading

import numpy as np
import xarray as xr

from tianji_dask.results.host_record import HostRecord
from tianji_dask.results.metric_table import CARRIED, EPISODE_VARS, LOSS_KEYS, RowInputs, host_row, time_row
from tianji_dask.roles.heartbeats import ROLES


class Tally:
    """Heartbeats in (``add``, thread-safe), rows of the metric table out (``take_row``).

    A continued run's tally (``carry_on``) starts from the previous run's last row: its time,
    its cumulative counters, each actor's env steps, its episodes and its time to target.
    """

    def __init__(self, *, t0: float, target_return: float | None, topology: dict):
        self.t0 = t0
        self.target_return = target_return
        self._actors_per_group = int(topology.get("actors") or 0)  # maps an actor to its group's learner
        self._learners_per_group = int(topology.get("learners") or 1)
        self._lock = threading.Lock()
        self._hosts: dict[tuple[str, int], HostRecord] = {}
        self._ep_cols: dict[str, list] = {k: [] for k in EPISODE_VARS}
        self._window: collections.deque[float] = collections.deque(maxlen=100)
        self.time_to_target_s = math.nan
        self._losses = dict.fromkeys(LOSS_KEYS, 0)
        self._time_offset = 0.0
        self._carried: dict[str, float] = {}
        self._prior_actor_steps: dict[tuple[str, int], float] = {}

    def carry_on(self, metrics: xr.Dataset, episodes: xr.Dataset) -> None:
        """Start from the run whose (complete) ``metrics.nc`` and ``episodes.nc`` these are."""
        with self._lock:
            if self._hosts:
                raise RuntimeError("continue_from must come before the first heartbeat and row")
            if metrics.sizes["time"]:
                last = metrics.isel(time=-1)
                self._time_offset = float(last["time"])
                self._carried = {k: float(last[k]) for k in CARRIED}
                for k in LOSS_KEYS:
                    self._losses[k] = int(last[k])
                steps = last["actor_env_steps"]
                self._prior_actor_steps = {
                    ("actor", int(a)): float(v) for a, v in zip(steps["actor"].values, steps.values) if v == v
                }
            for k in EPISODE_VARS:
                self._ep_cols[k] = [v.item() for v in episodes[k].values]
            self._window.extend(self._ep_cols["return"][-100:])
            prior_ttt = float(metrics.attrs.get("time_to_target_s", math.nan))
            same_target = float(metrics.attrs.get("target_return", math.nan)) == (
                math.nan if self.target_return is None else self.target_return
            )
            if same_target and not math.isnan(prior_ttt):
                self.time_to_target_s = prior_ttt

    def add(self, heartbeat: dict) -> None:
        """See :meth:`MetricsRecorder.add`."""
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
                host = self._hosts[key] = HostRecord(t, counters, incarnation)
                if key in self._prior_actor_steps:  # a continued run's actor carries on its count
                    host.offset["env_steps"] = self._prior_actor_steps[key]
                    host.ref = {k: host.value(k) for k in host.ref}
            elif incarnation > host.incarnation or (
                incarnation == host.incarnation and t > host.t
            ):  # a late heartbeat of an earlier incarnation only brings its episodes
                host.update(role, t, counters, incarnation)
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
        """See :meth:`MetricsRecorder.record_losses`."""
        unknown = set(counts) - set(LOSS_KEYS)
        if unknown:
            raise ValueError(f"unknown loss counts {sorted(unknown)}; known: {LOSS_KEYS}")
        with self._lock:
            for k, v in counts.items():
                self._losses[k] += int(v)

    def take_row(self, t_rel: float) -> tuple[dict[str, float], dict[tuple[str, int], tuple[float, ...]]]:
        """The time row at ``t_rel`` seconds since ``t0`` and the per-host row, from the latest
        counters and the rates since the previous row (see :class:`MetricsRecorder`)."""
        with self._lock:
            by_role: dict[str, list[tuple[int, HostRecord]]] = {r: [] for r in ROLES}
            for (role, hid), h in sorted(self._hosts.items()):
                by_role[role].append((hid, h))
                h.take_rates(role)
            inputs = RowInputs(
                actors=by_role["actor"],
                buffers=by_role["buffer"],
                learners=by_role["learner"],
                env_steps=self._env_steps_locked(),
                episodes=len(self._ep_cols["return"]),
                return_mean_100=self._mean_100(),
                losses=self._losses,
                actors_per_group=self._actors_per_group,
                learners_per_group=self._learners_per_group,
            )
            return time_row(t_rel + self._time_offset, inputs, self._carried), host_row(inputs)

    def episode_columns(self) -> dict[str, list]:
        """A copy of the episodes so far, one list per variable of EPISODE_VARS."""
        with self._lock:
            return {k: list(v) for k, v in self._ep_cols.items()}

    @property
    def time_offset(self) -> float:
        """Where this tally's ``time`` starts: the last row of the run it continues, else 0."""
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

    def host_total(self, role: str, host_id: int, counter: str) -> float:
        """A host's cumulative ``counter`` over all its incarnations (0 before its first heartbeat)."""
        with self._lock:
            host = self._hosts.get((role, host_id))
            return 0.0 if host is None else host.value(counter)

    def losses(self) -> dict[str, int]:
        with self._lock:
            return dict(self._losses)

    def _env_steps_locked(self) -> int:
        made = sum(v for (r, _), h in self._hosts.items() if r == "actor" and not math.isnan(v := h.value("env_steps")))
        # a continued run's actors that have not reported yet still count what they made before
        return int(made + sum(v for key, v in self._prior_actor_steps.items() if key not in self._hosts))

    def _mean_100(self) -> float:
        return float(np.mean(self._window)) if self._window else math.nan


def _num(v) -> float:
    return math.nan if v is None else float(v)
