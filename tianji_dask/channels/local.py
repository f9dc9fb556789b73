"""In-process twins of the channels for the serial mode: no Dask, no event loop, same rules.

Call protocol::

    q = LocalQueue(capacity_bytes=8 << 20, full_policy="drop_oldest")
    q.push({"obs": obs})          # producer
    items = q.poll()              # consumer: list[Item], credit returns here

    topic = LocalTopic()
    sub = topic.subscribe()
    topic.publish(3, state)
    sub.probe()                   # (3, state), then None until a newer version

A pushed item is in transit until the consumer takes it, so ``drop_oldest`` may drop any item
not yet taken (unlike the remote queue, nothing here is ever "already written"), and the new
item always fits.  With ``full_policy="wait"`` the consumer must run in another thread: a
single thread that pushes into a full queue waits forever.
"""

from __future__ import annotations

import threading
import time

from tianji_dask.errors import ChannelError

from .common import FULL_POLICIES, on_event_loop
from .latest_inbox import LatestSlot
from .ports import Item, LocalQueueStats, PublisherStats
from .queue_inbox import CreditQueue
from .wire import payload_nbytes

LOCAL_SENDER = "local"


class LocalQueue:
    """Both ends of a queue in one object: ``push`` like QueueSender, ``poll``/``get`` like QueueInbox."""

    def __init__(self, capacity_bytes: int, full_policy: str = "wait"):
        if full_policy not in FULL_POLICIES:
            raise ValueError(f"full_policy must be one of {FULL_POLICIES}, got {full_policy!r}")
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be positive")
        self.capacity_bytes = int(capacity_bytes)
        self.full_policy = full_policy
        self._queue: CreditQueue[None] = CreditQueue()
        self._next_seq = 0
        self._expected_seq = 0
        self._takes = 0
        self._dropped = 0
        self._blocked_s = 0.0

    def push(self, payload: dict) -> bool:
        """Queue one item; same capacity and policy rules as ``QueueSender.push``."""
        nbytes = payload_nbytes(payload)
        if nbytes > self.capacity_bytes:
            raise ValueError(f"item of {nbytes} bytes exceeds capacity_bytes={self.capacity_bytes} of LocalQueue")
        q = self._queue
        with q.cond:
            self._check_open()
            if q.queued_bytes + nbytes > self.capacity_bytes:
                if self.full_policy == "wait":
                    self._wait_for_room(nbytes)
                else:
                    while q.queued_bytes + nbytes > self.capacity_bytes:
                        q.drop_oldest()
                        self._dropped += 1
            q.put(Item(LOCAL_SENDER, self._next_seq, payload, nbytes, time.time()), None)
            self._next_seq += 1
        return True

    def poll(self, max_items: int | None = None) -> list[Item]:
        with self._queue.cond:
            return self._take(max_items)

    def get(self, timeout: float, max_items: int | None = None) -> list[Item]:
        with self._queue.cond:
            self._queue.wait(timeout)
            return self._take(max_items)

    def close(self, timeout: float = 5.0) -> None:
        """Refuse further pushes (ChannelError); queued items stay readable.  Idempotent."""
        with self._queue.cond:
            self._queue.close()

    def stats(self) -> LocalQueueStats:
        """Sender and inbox statistics in one dict (an item counts as sent and received when
        the consumer takes it)."""
        q = self._queue
        with q.cond:
            return {
                "sent_items": q.received_items,
                "sent_bytes": q.received_bytes,
                "messages": self._takes,
                "dropped": self._dropped,
                "blocked_s": self._blocked_s,
                "outstanding_bytes": q.queued_bytes,
                "errors": 0,
                **q.stats(),
            }

    def _check_open(self) -> None:
        if self._queue.closed:
            raise ChannelError("LocalQueue is closed")

    def _wait_for_room(self, nbytes: int) -> None:
        if on_event_loop():
            raise RuntimeError("LocalQueue.push() would block an event loop")
        start = time.monotonic()
        try:
            while self._queue.queued_bytes + nbytes > self.capacity_bytes:
                self._queue.cond.wait()
                self._check_open()
        finally:
            self._blocked_s += time.monotonic() - start

    def _take(self, max_items: int | None) -> list[Item]:
        taken, _ = self._queue.take(max_items)
        self._expected_seq = self._queue.count(taken, self._expected_seq)
        if taken:
            self._takes += 1
            self._queue.cond.notify_all()  # credit returned: wake waiting pushers
        return taken


class LocalSubscription(LatestSlot):
    """What ``LocalTopic.subscribe`` returns: ``probe``/``stats`` like LatestInbox."""


class LocalTopic:
    """One-to-many, newest version wins, in one process."""

    def __init__(self):
        self._lock = threading.Lock()
        self._subs: list[LocalSubscription] = []
        self._last: tuple[int, dict] | None = None
        self._published = 0
        self._conflated = 0

    def subscribe(self) -> LocalSubscription:
        """A new subscription; it sees the last published version at once."""
        sub = LocalSubscription()
        with self._lock:
            self._subs.append(sub)
            if self._last is not None:
                sub.offer(*self._last)
        return sub

    def publish(self, version: int, payload: dict) -> None:
        if not isinstance(payload, dict):
            raise TypeError(f"topic payloads are dicts, got {type(payload).__name__}")
        with self._lock:
            self._published += 1
            self._last = (int(version), payload)
            for sub in self._subs:
                self._conflated += sub.offer(*self._last)

    def stats(self) -> PublisherStats:
        with self._lock:
            return {
                "published": self._published,
                "sent": self._published * len(self._subs),
                "conflated": self._conflated,
                "errors": 0,
                "subscribers": len(self._subs),
            }

    def close(self, timeout: float = 5.0) -> None:
        pass
