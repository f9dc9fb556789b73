"""The one contract every role's loop follows; hosts (and serial mode) drive roles only
through it and the role's own documented methods."""

from __future__ import annotations

from typing import Protocol


class LoopRole(Protocol):
    def step(self) -> bool:
        """One unit of work; False when there was nothing to do or the role was held back."""
        ...

    def heartbeat(self) -> dict:
        """A :class:`~tianji_dask.heartbeats.Heartbeat` as its ``message()``: cumulative counters
        since the role was built, and the episodes finished since the previous heartbeat."""
        ...

    def close(self) -> None:
        """Release what the role owns (envs); channels belong to the host."""
        ...
