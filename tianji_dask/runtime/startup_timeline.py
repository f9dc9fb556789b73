"""A run's start-up timeline: how many seconds after its origin the run reached each phase.

The origin is the driver process's start (the interpreter's) for a run the CLI made, else the
``train()`` call (a notebook's kernel started long before). The phases: the cluster up, the
first parameters published, the first env step and the first learner update, always in this
order (an actor steps with parameters, a learner trains on steps), and every host built (its
role made: a learner's networks, an actor's envs and policy), which falls after the cluster's
start and may fall on either side of the others. The hosts report their own as unix times in
their heartbeats (``startup``); the earliest host of a role marks a phase (the first actor to
step, the first learner to update); the hosts' later incarnations (re-created after a loss) are
not start-up.

The timeline goes into metrics.nc's attributes (``startup_<phase>_s``, ``startup_origin`` and
its unix time ``startup_origin_unix``, ``startup_hosts_built_json``, and
``startup_learner_prepare_s``: the longest learner's prepare, its optimiser and compile, made
after its first parameters are out) and is said once, as one line, when every phase is in.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable

import psutil

#: The phases; all but ``hosts_built`` in the order a run reaches them.
PHASES = ("cluster_up", "first_parameters", "first_env_step", "first_learner_update", "hosts_built")
#: A host's own phases, as its heartbeat's ``startup`` names them.
HOST_PHASES = ("first_parameters", "first_env_step", "first_learner_update")


def process_started_at() -> float:
    """The unix time this process's interpreter started, from the kernel's record of it: on
    Linux its start in clock ticks since boot against the boot clock (to a tick; psutil's
    ``create_time`` adds the boot time, which the kernel gives to the whole second)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started_since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started_since_boot)
    except (OSError, ValueError, IndexError, AttributeError):
        return psutil.Process().create_time()


class StartupTimeline:
    """Collects the phases from the driver (:meth:`mark`, :meth:`expect_hosts`) and the hosts'
    heartbeats (:meth:`add`); ``on_complete(line)`` is called once every phase is in."""

    def __init__(self, origin: float, origin_name: str, on_complete: Callable[[str], None] = lambda line: None):
        self.origin = origin
        self.origin_name = origin_name
        self._on_complete = on_complete
        self._lock = threading.Lock()
        self._at: dict[str, float] = {}
        self._built: dict[str, float] = {}
        self._prepare_s: dict[str, float] = {}
        self._hosts: set[str] | None = None
        self._said = False

    def mark(self, phase: str, at: float) -> None:
        """The driver's own phase (``cluster_up``) at unix time ``at``; the earliest counts."""
        if phase not in PHASES:
            raise ValueError(f"unknown start-up phase {phase!r}; one of {PHASES}")
        with self._lock:
            self._at[phase] = min(at, self._at.get(phase, math.inf))
        self._say_if_complete()

    def expect_hosts(self, hosts: list[str]) -> None:
        """The hosts the run started with (``"actor 0"``-style names): ``hosts_built`` is the
        last of them built."""
        with self._lock:
            self._hosts = set(hosts)
        self._say_if_complete()

    def add(self, heartbeat: dict) -> None:
        """A host's heartbeat: its ``startup`` times, those of its first incarnation only."""
        times = heartbeat.get("startup")
        if not times or heartbeat.get("incarnation", 0) != 0:
            return
        host = f"{heartbeat.get('role')} {heartbeat.get('id')}"
        prepare_s = (heartbeat.get("build_parts") or {}).get("prepare")
        with self._lock:
            if prepare_s is not None:
                self._prepare_s.setdefault(host, float(prepare_s))
            if "built" in times:
                self._built.setdefault(host, float(times["built"]))
            for phase in HOST_PHASES:
                if phase in times:
                    self._at[phase] = min(float(times[phase]), self._at.get(phase, math.inf))
        self._say_if_complete()

    def seconds(self) -> dict[str, float]:
        """Seconds from the origin to each phase reached so far (``hosts_built`` once all are)."""
        with self._lock:
            at = dict(self._at)
            built = dict(self._built)
            hosts = self._hosts
        if hosts and hosts <= built.keys():
            at["hosts_built"] = max(built[h] for h in hosts)
        return {phase: at[phase] - self.origin for phase in PHASES if phase in at}

    def attrs(self) -> dict[str, float | str]:
        """metrics.nc attributes: each phase's seconds (NaN: not reached), the origin, and each
        host's built time as JSON."""
        seconds = self.seconds()
        with self._lock:
            built = {host: round(t - self.origin, 3) for host, t in sorted(self._built.items())}
            prepare_s = max(self._prepare_s.values(), default=math.nan)
        return {
            **{f"startup_{phase}_s": seconds.get(phase, math.nan) for phase in PHASES},
            "startup_origin": self.origin_name,
            "startup_origin_unix": self.origin,
            "startup_hosts_built_json": json.dumps(built),
            "startup_learner_prepare_s": prepare_s,
        }

    def line(self) -> str:
        seconds = sorted(self.seconds().items(), key=lambda kv: kv[1])
        parts = [f"{phase.replace('_', ' ')} {s:.1f}" for phase, s in seconds]
        return f"start-up, seconds from the {self.origin_name}: " + ", ".join(parts)

    def _say_if_complete(self) -> None:
        if self._said or len(self.seconds()) < len(PHASES):
            return
        with self._lock:
            if self._said:
                return
            self._said = True
        self._on_complete(self.line())
