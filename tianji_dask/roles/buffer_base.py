"""What every buffer role shares: taking what the inbox holds, counting it, the loop step and
the heartbeat. A subclass stores one payload (``_add``) and reports its fill (``_fill``)."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Any

from tianji_dask.heartbeats import BufferCounters, Heartbeat

INGEST_WAIT_S = 0.05  # how long one loop step waits for the inbox


class BufferBase(ABC):
    def __init__(self, inbox, buffer_id: int):
        self.id = buffer_id
        self.inbox = inbox
        self._lock = threading.Lock()  # the buffer's thread adds, the learner's thread reads
        self.received = 0  # transitions
        self.received_bytes = 0

    @abstractmethod
    def _add(self, payload: dict) -> int:
        """Store one message's payload; returns the transitions it held."""

    @abstractmethod
    def _fill(self) -> dict[str, Any]:
        """``size`` and ``capacity`` in transitions, and any other fields of
        :class:`~tianji_dask.heartbeats.BufferCounters` the buffer keeps itself."""

    def ingest(self, timeout: float = 0.0) -> int:
        """Move whatever the inbox holds into the buffer (waiting up to ``timeout`` for
        something); taking an item returns its credit to the sender. Returns transitions."""
        items = self.inbox.get(timeout) if timeout > 0 else self.inbox.poll()
        n = 0
        for item in items:
            n += self._add(item.payload)
            self.received_bytes += item.nbytes
        self.received += n
        return n

    def step(self) -> bool:
        return self.ingest(INGEST_WAIT_S) > 0

    def heartbeat(self) -> dict:
        counters = BufferCounters(
            received=self.received,
            received_bytes=self.received_bytes,
            seq_gaps=int(self.inbox.stats().get("seq_gaps", 0)),
            **self._fill(),
        )
        return Heartbeat("buffer", self.id, counters).message()

    def close(self) -> None:  # noqa: B027 - part of LoopRole; a buffer owns nothing to close
        """The host closes the inbox."""
