"""The credit-queue core of both queue inboxes, ``QueueInbox`` (remote senders) and ``LocalQueue``
(in-process): the items waiting for their consumer, each with where its credit goes back, their
bytes, and what has been received.

The owner shares :attr:`CreditQueue.cond` with everything else it guards; every method but
:meth:`wait` expects the caller to hold it (``wait`` too, and releases it while waiting).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Iterable
from typing import Generic, TypeVar

from .ports import InboxStats, Item

#: Where an item's credit goes back: a remote sender's connection, or nothing in process.
Origin = TypeVar("Origin")


class CreditQueue(Generic[Origin]):
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.items: deque[tuple[Item, Origin]] = deque()
        self.closed = False
        self.queued_bytes = 0
        self.max_queued_bytes = 0
        self.received_items = 0
        self.received_bytes = 0
        self.seq_gaps = 0
        self.senders: Counter[str] = Counter()

    def receive(self, sender: str, entries: Iterable[tuple[int, int, dict]], origin: Origin, next_seq: int) -> int:
        """Queue ``entries`` ((seq, nbytes, payload) of one message, in order) and count them as
        received; returns the next sequence number expected of ``sender`` (a higher one is a gap:
        items it dropped). Wakes the consumer."""
        now = time.time()
        items = self.items
        for seq, nbytes, payload in entries:
            if seq > next_seq:
                self.seq_gaps += seq - next_seq
            next_seq = seq + 1
            items.append((Item(sender, seq, payload, nbytes, now), origin))
            self.queued_bytes += nbytes
            self.received_items += 1
            self.received_bytes += nbytes
            self.senders[sender] += 1
        self.max_queued_bytes = max(self.max_queued_bytes, self.queued_bytes)
        self.cond.notify_all()
        return next_seq

    def put(self, item: Item, origin: Origin) -> None:
        """Queue ``item`` without counting it as received (``LocalQueue`` counts on take:
        :meth:`count`). Wakes the consumer."""
        self.items.append((item, origin))
        self.queued_bytes += item.nbytes
        self.max_queued_bytes = max(self.max_queued_bytes, self.queued_bytes)
        self.cond.notify_all()

    def drop_oldest(self) -> Item:
        item, _ = self.items.popleft()
        self.queued_bytes -= item.nbytes
        return item

    def count(self, items: Iterable[Item], next_seq: int) -> int:
        """Count ``items`` (one sender's, in order) as received; returns the next sequence number
        expected, as :meth:`receive` does."""
        for item in items:
            if item.seq > next_seq:
                self.seq_gaps += item.seq - next_seq
            next_seq = item.seq + 1
            self.received_items += 1
            self.received_bytes += item.nbytes
            self.senders[item.sender] += 1
        return next_seq

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds until an item is queued or the queue is closed."""
        deadline = time.monotonic() + timeout
        while not self.items and not self.closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.cond.wait(remaining)

    def take(self, max_items: int | None) -> list[tuple[Item, Origin]]:
        """Up to ``max_items`` of the oldest items (all if None), with their origins."""
        n = len(self.items) if max_items is None else min(max_items, len(self.items))
        taken = [self.items.popleft() for _ in range(n)]
        for item, _ in taken:
            self.queued_bytes -= item.nbytes
        return taken

    def close(self) -> None:
        self.closed = True
        self.cond.notify_all()

    def stats(self) -> InboxStats:
        return {
            "received_items": self.received_items,
            "received_bytes": self.received_bytes,
            "queued_items": len(self.items),
            "queued_bytes": self.queued_bytes,
            "max_queued_bytes": self.max_queued_bytes,
            "seq_gaps": self.seq_gaps,
            "senders": dict(self.senders),
        }
