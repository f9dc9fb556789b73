"""When a host's worker is lost: whether the run may re-create its hosts, and what was lost.

The driver re-creates the hosts of a lost worker (``Recovery.recover``) as long as
:class:`RestartPolicy` admits it: at most ``run.max_restarts`` lost workers within
``run.restart_window_s``. One more, or any loss with ``max_restarts: 0``, fails the run with a
message naming every lost worker of the window, its hosts and the cause. What died with a host
is counted from its last heartbeat (:func:`lost_with`, :func:`replay_lost`).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tianji_dask.errors import HostLost

if TYPE_CHECKING:
    from tianji_dask.roles.replay_state import ReplayState

Key = tuple[str, int]  # (role, global id)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its repr if it has none), for a one-line report."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else repr(exc)


@dataclass(frozen=True)
class LostWorker:
    """A worker that left the cluster, with the run's hosts it held."""

    address: str
    hosts: tuple[Key, ...]
    cause: str  # the scheduler's and the nanny's word, when they said something

    def describe(self) -> str:
        names = ", ".join(f"{role} {hid}" for role, hid in self.hosts)
        return (
            f"{names} on {self.address}: its worker left the cluster (the process died, or its "
            f"batch job ended or was cancelled){self.cause}"
        )


class RestartPolicy:
    """Admits re-creating the hosts of lost workers, ``max_restarts`` within ``window_s``."""

    def __init__(self, max_restarts: int, window_s: float):
        self.max_restarts = max_restarts
        self.window_s = window_s
        self._admitted: collections.deque[tuple[float, LostWorker]] = collections.deque()

    def admit(self, lost: list[LostWorker], now: float) -> None:
        """Record these losses as restarts, or raise :class:`HostLost` if they are too many."""
        while self._admitted and now - self._admitted[0][0] > self.window_s:
            self._admitted.popleft()
        if len(self._admitted) + len(lost) > self.max_restarts:
            if self.max_restarts == 0:
                raise HostLost(
                    "; ".join(w.describe() for w in lost) + " (run.max_restarts=0: a lost host fails the run)"
                )
            earlier = [f"{now - t:.0f} s ago: {w.describe()}" for t, w in self._admitted]
            raise HostLost(
                "; ".join(w.describe() for w in lost)
                + f". Too many lost workers: {len(earlier)} re-created within the last "
                f"{self.window_s:g} s (run.max_restarts={self.max_restarts}, "
                f"run.restart_window_s={self.window_s:g})" + ("; earlier: " + "; ".join(earlier) if earlier else "")
            )
        self._admitted.extend((now, w) for w in lost)


def lost_with(role: str, counters: dict, num_envs: int) -> dict[str, int]:
    """What a host took with it, from its last heartbeat's counters: an actor its unsent env
    steps and the episodes its envs were in; a buffer the transitions it held. (A learner's
    loss, the updates after the state it is restored from, is counted where it is restored.)"""
    if role == "actor":
        return {"lost_env_steps": int(counters.get("unsent") or 0), "lost_episodes": num_envs}
    if role == "buffer":
        return {"lost_replay": int(counters.get("size") or 0)}
    return {}


def replay_lost(heartbeat: dict, kept: tuple[ReplayState, int] | None) -> dict[str, int]:
    """The transitions a buffer of a rebuilt group takes with it, from its last heartbeat: all
    it held without a replay kept in the driver; with one, ``kept = (state, incarnation it was
    taken from)``, only those it received after that copy (all that this incarnation received,
    if the copy is of an earlier one), at most what it held."""
    counters = heartbeat.get("counters") or {}
    size = int(counters.get("size") or 0)
    if kept is None:
        return {"lost_replay": size}
    state, incarnation = kept
    received = int(counters.get("received") or 0)
    since = int(state.values.get("received", 0)) if int(heartbeat.get("incarnation", 0)) == incarnation else 0
    return {"lost_replay": min(size, max(0, received - since))}
