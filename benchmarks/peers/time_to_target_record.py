"""The time-to-target record every peer runner prints as its final JSON line, from the returns of
the episodes it sees finish. Imports nothing but the standard library: each peer runs it in its own
environment (``from time_to_target_record import ...`` works because a runner is started as a
script of this folder).

The record (``TimeToTarget.record``): ``seconds_to_target`` and ``env_steps_to_target`` (the first
full 100-episode window whose mean reaches ``target``, as tianji-dask's ``stop.target_return``;
null if never, or with no target), ``reached``, ``target``, ``max_seconds`` (the cap: a run that
missed the target took longer than it, a lower bound), ``wall_s``, ``env_steps``,
``env_steps_per_s``, ``episodes``, ``return_mean_100`` (the last window's mean, null before any
episode), ``best_return_mean_100`` (the best full window's, null before 100 episodes) and
``curve``, the window's mean after each episode as ``[seconds, env steps, mean]``; the caller adds
its own keys (settings, threads).
"""

from __future__ import annotations

import collections
import json
import time
from typing import Any

WINDOW = 100


class TimeToTarget:
    """Feed it each finished episode's return with the env steps made so far (``episode``); it
    keeps the 100-episode window, its curve, the first time the target was reached and the best
    full window. ``t0``: the ``time.perf_counter()`` the run's clock starts at."""

    def __init__(self, t0: float, target: float | None, max_seconds: float):
        self.t0, self.target, self.max_seconds = t0, target, max_seconds
        self.window: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.curve: list[tuple[float, int, float]] = []
        self.episodes = 0
        self.best: float | None = None
        self.seconds_to_target: float | None = None
        self.env_steps_to_target: int | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def episode(self, episode_return: float, env_steps: int) -> None:
        now = self.elapsed()
        self.window.append(float(episode_return))
        self.episodes += 1
        mean = sum(self.window) / len(self.window)
        self.curve.append((now, int(env_steps), mean))
        if len(self.window) == WINDOW:
            self.best = mean if self.best is None else max(self.best, mean)
            if self.target is not None and mean >= self.target and self.seconds_to_target is None:
                self.seconds_to_target, self.env_steps_to_target = now, int(env_steps)

    @property
    def reached(self) -> bool:
        return self.seconds_to_target is not None

    def out_of_time(self) -> bool:
        return self.elapsed() >= self.max_seconds

    def record(self, env_steps: int, **extra: Any) -> dict[str, Any]:
        wall = self.elapsed()
        return {
            "seconds_to_target": self.seconds_to_target,
            "env_steps_to_target": self.env_steps_to_target,
            "reached": self.reached,
            "target": self.target,
            "max_seconds": self.max_seconds,
            "wall_s": wall,
            "env_steps": int(env_steps),
            "env_steps_per_s": env_steps / wall if wall > 0 else 0.0,
            "episodes": self.episodes,
            "return_mean_100": sum(self.window) / len(self.window) if self.window else None,
            "best_return_mean_100": self.best,
            **extra,
            "curve": self.curve,
        }


def print_record(record: dict[str, Any]) -> None:
    """The record as the process's last line of output, which the drivers parse."""
    print(json.dumps(record, default=str), flush=True)
