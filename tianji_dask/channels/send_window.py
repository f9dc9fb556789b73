"""A queue sender's window: what it holds and what it has in flight, under one condition.

The pushing threads, the connection's writer (a thread of its own on an owned tcp:// socket, the
event loop on tls://) and whoever applies the receiver's credit share one :class:`SendWindow`;
:class:`~tianji_dask.channels.queue_sender.QueueSender` explains the rules it keeps. Its fields
are those parts' common state: they read and write them holding :attr:`SendWindow.cond` (the
writer thread pops :attr:`SendWindow.ready` without it, see ``sender_threads``)."""

from __future__ import annotations

import threading
import time
from collections import deque

from tianji_dask.errors import ChannelError

from .common import SMALL_ITEM_BYTES, on_event_loop
from .ports import QueueSenderStats
from .wire import encode


class SendWindow:
    def __init__(self, where: str, capacity_bytes: int, full_policy: str, max_batch_bytes: int, max_batch_items: int):
        self.where = where  # "queue channel 'x' at tcp://...", for the errors
        self.capacity_bytes = capacity_bytes
        self.full_policy = full_policy
        self.max_batch_bytes = max_batch_bytes
        self.max_batch_items = max_batch_items
        self.cond = threading.Condition()
        self.pending: deque[tuple[int, int, dict]] = deque()  # (seq, nbytes, payload), unwritten
        self.pending_bytes = 0
        # Items push encoded for the writer thread (``_hand_to_writer``), each a message (pieces,
        # bytes), in order and before everything pending; only that thread pops them.
        self.ready: deque[tuple[list, int]] = deque()
        self.inflight_bytes = 0  # ready, or written with credit not yet returned
        self.window = capacity_bytes
        self.next_seq = 0
        self.error: ChannelError | None = None
        self.closing = False
        self.bye_sent = False
        self.writer_thread = False  # items go from a thread of the sender (an owned connection)
        # The sent counts: stats() reads them under cond; the connection's one writer (its thread
        # or the event loop) writes them without it.
        self.sent_items = 0
        self.sent_bytes = 0
        self.messages = 0
        self.dropped = 0
        self.blocked_s = 0.0
        self.errors = 0

    def outstanding(self) -> int:
        return self.pending_bytes + self.inflight_bytes

    def check_usable(self) -> None:
        if self.error is not None:
            raise ChannelError(str(self.error))
        if self.closing:
            raise ChannelError(f"{self.where}: sender closed")

    def add(self, nbytes: int, payload: dict, owner: object) -> bool:
        """Queue one pushed item within the capacity (waiting for credit, or dropping, as the
        policy says); False when ``drop_oldest`` dropped this very item. ``owner``: the sender,
        named in the error of a wait on an event loop."""
        if self.pending_bytes + self.inflight_bytes + nbytes > self.capacity_bytes:  # outstanding(), inline
            if self.full_policy == "wait":
                self._wait_for_room(nbytes, owner)
            elif self.inflight_bytes + nbytes > self.capacity_bytes:
                self.next_seq += 1
                self.dropped += 1
                return False
            else:
                while self.outstanding() + nbytes > self.capacity_bytes:
                    _, dropped_bytes, _ = self.pending.popleft()
                    self.pending_bytes -= dropped_bytes
                    self.dropped += 1
        if not (self.writer_thread and self._hand_to_writer(nbytes, payload)):
            self.pending.append((self.next_seq, nbytes, payload))
            self.pending_bytes += nbytes
        self.next_seq += 1
        return True

    def _wait_for_room(self, nbytes: int, owner: object) -> None:
        if on_event_loop():
            raise RuntimeError(
                f"{owner!r}: push() would block the event loop waiting for credit; "
                "push from the role's own thread or use full_policy='drop_oldest'"
            )
        start = time.monotonic()
        try:
            while self.outstanding() + nbytes > self.capacity_bytes:
                self.cond.wait()
                self.check_usable()
        finally:
            self.blocked_s += time.monotonic() - start

    def _hand_to_writer(self, nbytes: int, payload: dict) -> bool:
        """Encode an item of half a batch or more as a message of its own and queue it for the
        writer thread, when nothing is pending before it and it fits the window; False otherwise
        (it waits in the pending queue for the writer to take it).

        Each microsecond of Python the writer spends a message adds to the connection's time a
        message, its system call doing the rest of the work, while the pushing thread's Python
        runs beside that call (docs/benchmarks.md): so the pushing thread encodes. Smaller items
        go several to a message, as the writer takes them: each message costs the receiver a
        parse of its own. With ``drop_oldest`` items stay pending, where a later push may drop
        them, until the writer takes them."""
        if nbytes < max(SMALL_ITEM_BYTES, self.max_batch_bytes / 2) or self.full_policy != "wait":
            return False
        if self.pending or self.error is not None:
            return False
        if self.inflight_bytes and self.inflight_bytes + nbytes > min(self.window, self.capacity_bytes):
            return False
        try:
            pieces = encode({"items": [(self.next_seq, nbytes, payload)]}, out_of_band=True)
        except Exception:  # noqa: BLE001 - the writer encodes it again and fails the channel with the reason
            return False
        self.ready.append((pieces, nbytes))
        self.inflight_bytes += nbytes
        return True

    def take_batch(self) -> tuple[list[tuple[int, int, dict]], int]:
        """Move the head of the pending queue into flight, within window and batch size: the
        items and their bytes."""
        batch: list[tuple[int, int, dict]] = []
        batch_bytes = 0
        if self.error is not None:
            return batch, 0
        window = min(self.window, self.capacity_bytes)
        while self.pending:
            nbytes = self.pending[0][1]
            if batch and (batch_bytes + nbytes > self.max_batch_bytes or len(batch) >= self.max_batch_items):
                break
            if batch and (nbytes < SMALL_ITEM_BYTES) != (batch[0][1] < SMALL_ITEM_BYTES):
                break  # a message carries small items or large ones, in order
            fits = self.inflight_bytes + batch_bytes + nbytes <= window
            if not fits and (batch or self.inflight_bytes):
                break
            batch.append(self.pending.popleft())
            batch_bytes += nbytes
        self.pending_bytes -= batch_bytes
        self.inflight_bytes += batch_bytes
        return batch, batch_bytes

    def count_written(self, items: int, nbytes: int, messages: int = 1) -> None:
        """Count written items and messages; only the connection's writer calls it, without cond."""
        self.sent_items += items
        self.sent_bytes += nbytes
        self.messages += messages

    def credit(self, msg: dict) -> None:
        """Apply a credit/window message of the receiver (taking cond) and wake waiting pushers."""
        with self.cond:
            self.inflight_bytes -= int(msg.get("credit", 0))
            if "window" in msg:
                self.window = int(msg["window"])
            self.cond.notify_all()

    def fail(self, reason: ChannelError | str) -> None:
        """Record the channel's first error (taking cond) and release what can never be written."""
        with self.cond:
            if self.error is None:
                self.error = reason if isinstance(reason, ChannelError) else ChannelError(f"{self.where}: {reason}")
                self.errors += 1
                self.pending.clear()
                self.ready.clear()
                self.pending_bytes = 0
            self.cond.notify_all()

    def stats(self) -> QueueSenderStats:
        with self.cond:
            return {
                "sent_items": self.sent_items,
                "sent_bytes": self.sent_bytes,
                "messages": self.messages,
                "dropped": self.dropped,
                "blocked_s": self.blocked_s,
                "outstanding_bytes": self.outstanding(),
                "errors": self.errors,
                "window": self.window,
            }
