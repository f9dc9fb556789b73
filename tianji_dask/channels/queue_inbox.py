"""Receiving end of a many-to-one queue channel.

Call protocol (in the consuming role's thread)::

    inbox = ChannelService.current().open_queue("traj", capacity_bytes=64 << 20)
    # hand ChannelService.current().address and "traj" to the senders
    items = inbox.get(timeout=0.1)      # or inbox.poll() from an async method
    for item in items: ...              # Item(sender, seq, payload, nbytes, recv_time)

Credit flows back to a sender only when its items are taken by ``poll``/``get``, so the memory
held here is bounded by bytes: the inbox's ``capacity_bytes`` is split equally among the live
senders (each gets a window of ``capacity_bytes // n`` announced on its comm; a sender's own
``capacity_bytes`` may make it smaller).  ``queued_bytes`` therefore stays within
``capacity_bytes`` in steady state.  Two exceptions, both bounded: while senders join, the
earlier senders' larger windows drain only as their items are taken (worst case, n senders
joining before anything is consumed: capacity x (1 + 1/2 + ... + 1/n)); and a sender whose
item exceeds its window may still have that one item in flight.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from tianji_dask.errors import ChannelError

from . import wire
from .comm_stream import serve_stream
from .common import call_soon, logger, on_event_loop
from .owned_tcp import owned_socket
from .owned_tcp.receiving import QueueLink, ReceiveLoop, serve_owned
from .ports import InboxStats, Item, QueueInboxStats
from .wire import fit_allocator


class Malformed(Exception):
    """A message of the framing that is not a queue message."""


class SenderConn:
    """One connected sender, as seen by the inbox.

    ``wake`` tells whoever writes this sender's credit that there is something to write: an
    ``asyncio.Event`` for a comm served on the event loop, a ``threading.Event`` for an owned
    socket (``owned_tcp.receiving.QueueLink``); ``kick`` sets it from any thread."""

    __slots__ = (
        "sender",
        "comm",
        "peer",
        "next_seq",
        "credit_due",
        "window",
        "window_sent",
        "kick_scheduled",
        "wake",
        "kick",
        "live",
        "sender_capacity",
        "link",
    )

    def __init__(self, sender: str, comm, loop: asyncio.AbstractEventLoop, owned: bool, sender_capacity: int):
        self.sender = sender
        self.sender_capacity = sender_capacity  # its own capacity_bytes, 0 when not told
        self.comm = comm
        self.peer = comm.peer_address
        self.next_seq = 0  # a reconnecting sender starts a fresh sequence on its new comm
        self.credit_due = 0
        self.window = 0
        self.window_sent = 0
        self.kick_scheduled = False
        self.wake: asyncio.Event | threading.Event
        self.kick: Callable[[], object]
        if owned:
            self.wake = threading.Event()
            self.kick = self.wake.set
        else:
            self.wake = event = asyncio.Event()
            self.kick = functools.partial(call_soon, loop, event.set)
        self.live = True
        self.link: QueueLink | None = None  # an owned connection's threads, once started


class QueueInbox:
    """Receiver side of a queue channel; create it with ``ChannelService.open_queue``."""

    def __init__(self, name: str, capacity_bytes: int, loop: asyncio.AbstractEventLoop, address: str):
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be positive")
        self.name = name
        self.capacity_bytes = int(capacity_bytes)
        self.address = address
        self.loop = loop
        # Shared between the consumer's thread, the event loop and the connections' threads:
        # guarded by the queue's condition.
        self._queue: CreditQueue[SenderConn] = CreditQueue()
        self._cond = self._queue.cond
        self._conns: list[SenderConn] = []
        self.receive_loop = ReceiveLoop(name)  # reads every owned connection

    def __repr__(self) -> str:
        return f"<QueueInbox {self.name!r} at {self.address}>"

    # ------------------------------------------------------------------ consumer's thread
    def poll(self, max_items: int | None = None) -> list[Item]:
        """Take up to ``max_items`` queued items (all if None) without blocking."""
        with self._cond:
            taken, kicks = self._take(max_items)
        self._send_credit(kicks)
        return taken

    def get(self, timeout: float, max_items: int | None = None) -> list[Item]:
        """Wait up to ``timeout`` seconds for at least one item, then take up to ``max_items``.

        Returns [] on timeout or once the inbox is closed and empty.  Blocks the calling
        thread, so it must not be called on the event loop (use ``poll`` there)."""
        if on_event_loop():
            raise RuntimeError(f"{self!r}: get() would block the event loop; use poll()")
        with self._cond:
            self._queue.wait(timeout)
            taken, kicks = self._take(max_items)
        self._send_credit(kicks)
        return taken

    def stats(self) -> QueueInboxStats:
        with self._cond:
            return {
                **self._queue.stats(),
                "connected": len(self._conns),
                "capacity_bytes": self.capacity_bytes,
                "closed": self._queue.closed,
            }

    def _take(self, max_items: int | None) -> tuple[list[Item], list[SenderConn]]:
        taken, credit = self._queue.take(max_items)
        kicks: list[SenderConn] = []
        for conn, nbytes in credit.items():
            if not conn.live:
                continue
            conn.credit_due += nbytes
            if not conn.kick_scheduled:
                conn.kick_scheduled = True
                kicks.append(conn)
            elif conn.link is not None and conn.credit_due >= _lingering_credit(conn):
                kicks.append(conn)  # its writer lingers for more credit, and enough is due now
        return taken, kicks

    def _send_credit(self, kicks: list[SenderConn]) -> None:
        for conn in kicks:
            if not self._send_credit_now(conn):
                conn.kick()

    def _send_credit_now(self, conn: SenderConn) -> bool:
        """Send ``conn``'s credit from this thread when it is due at once (what ``control``
        would send without lingering) and its socket takes it without waiting; False leaves
        it to the writer."""
        link = conn.link
        if link is None:
            return False
        with self._cond:
            if self._queue.closed or not conn.live or conn.window != conn.window_sent:
                return False
            if conn.credit_due < max(1, _lingering_credit(conn)):
                return False
            due, conn.credit_due = conn.credit_due, 0
            conn.kick_scheduled = False
        if link.send_now({"credit": due}):
            return True
        with self._cond:
            conn.credit_due += due
        return False

    def _close(self) -> None:
        """Called by ChannelService.close: refuse new items, tell every sender."""
        with self._cond:
            self._queue.close()
            conns = list(self._conns)
        for conn in conns:
            conn.kick()

    # ------------------------------------------------------------------ event loop
    async def serve(self, comm, sender: str, owned: bool = False, capacity: int = 0) -> None:
        """Run one sender's connection until it leaves; called by the service's handler.

        ``owned``: the sender offered to go on in a socket the inbox owns (it waits for the
        inbox's first message on it before sending items). On a plain tcp:// comm the inbox
        accepts, says so in its reply and serves the sender with a ``QueueLink``'s threads;
        otherwise (tls://) the items go on the comm's tornado stream, read on the event loop.
        ``capacity``: the sender's own ``capacity_bytes`` (0: not told), which bounds how much
        credit the inbox lets pile up before it writes it (``control``)."""
        owned = owned and owned_socket.can_take(comm)
        stream = None if owned else wire.stream_of(comm, self.name, self.address)
        conn = SenderConn(sender, comm, self.loop, owned, capacity)
        with self._cond:
            if self._queue.closed:
                raise ChannelError(f"queue channel {self.name!r} at {self.address} is closed")
            self._conns.append(conn)
        try:
            self._rebalance()
            conn.window_sent = conn.window
            await comm.write({"window": conn.window, "owned": True} if owned else {"window": conn.window})
            if stream is None:
                how = await serve_owned(self, conn, comm)
            else:
                how = await serve_stream(self, conn, comm, stream)
        finally:
            self.leave(conn)
            if not comm.closed():
                comm.abort()
        logger.debug("%r: sender %r from %s left: %s", self, sender, conn.peer, how)

    def outcome(self, end: Exception | None) -> tuple[str | None, str]:
        """(the error to send the sender or None, how it left) for what ended reading its items:
        None for its "bye", ``OSError`` (tornado's ``StreamClosedError`` too) for a sender gone,
        anything else for bytes or a message that cannot be trusted."""
        where = f"queue channel {self.name!r} at {self.address}"
        if end is None:
            return None, "closed by sender"
        if isinstance(end, OSError):
            return None, "connection lost"
        if isinstance(end, (wire.WireError, Malformed)):
            fatal = f"malformed message on {where}: {end}"
        else:
            fatal = f"cannot decode a message on {where}: {end!r}"
        return fatal, fatal

    def leave(self, conn: SenderConn) -> None:
        """Take ``conn`` out of the live senders (once) and share the capacity among the rest."""
        with self._cond:
            if not conn.live:
                return
            conn.live = False
            self._conns.remove(conn)
        self._rebalance()

    def _rebalance(self) -> None:
        with self._cond:
            live = [c for c in self._conns if c.live]
            if not live:
                return
            share = max(1, self.capacity_bytes // len(live))
            for conn in live:
                conn.window = share
        for conn in live:
            conn.kick()

    def control(self, conn: SenderConn, force: bool = True) -> tuple[dict | None, bool]:
        """The next message to ``conn``'s sender and whether the inbox is closed: credit returned
        and a changed window since the last call (empty when neither), or once closed, the error
        that tells the sender. Without ``force``, None while the credit due is under a quarter
        of what the sender may have in flight and the window is unchanged: the caller asks
        again, forcing, after a short linger, so that the credit of several takes goes in one
        message instead of waking the sender for each."""
        with self._cond:
            closed = self._queue.closed
            lingering = not force and not closed and conn.window == conn.window_sent
            if lingering and 0 < conn.credit_due < _lingering_credit(conn):
                conn.kick_scheduled = True  # takes meanwhile add credit without a wake-up
                return None, False
            due, conn.credit_due = conn.credit_due, 0
            conn.kick_scheduled = False
            window = conn.window
        if closed:
            return {"error": f"queue channel {self.name!r} at {self.address} was closed by the receiver"}, True
        msg = {}
        if due:
            msg["credit"] = due
        if window != conn.window_sent:
            msg["window"] = conn.window_sent = window
        return msg, False

    def deliver(self, conn: SenderConn, msg) -> None:
        if not isinstance(msg, dict) or not isinstance(msg.get("items"), (list, tuple)):
            raise Malformed(f"expected {{'items': [(seq, nbytes, payload), ...]}}, got {_describe(msg)}")
        entries = msg["items"]
        for entry in entries:
            if (
                not isinstance(entry, (list, tuple))
                or len(entry) != 3
                or not isinstance(entry[0], int)
                or not isinstance(entry[1], int)
                or not isinstance(entry[2], dict)
            ):
                raise Malformed(f"expected an item [seq, nbytes, payload dict], got {_describe(entry)}")
            fit_allocator(entry[1], self.capacity_bytes)
        with self._cond:
            if not self._queue.closed:
                conn.next_seq = self._queue.receive(conn.sender, entries, conn, conn.next_seq)


def _lingering_credit(conn: SenderConn) -> int:
    """Credit under this much waits a little for more before it is written: a quarter of what
    the sender may have in flight."""
    return min(conn.window, conn.sender_capacity or conn.window) // 4


def _describe(obj) -> str:
    text = repr(obj)
    return text if len(text) <= 120 else text[:117] + "..."


# ---------------------------------------------------------------------------- the credit queue
#: Where an item's credit goes back: a remote sender's connection, or nothing in process.
Origin = TypeVar("Origin")


class CreditQueue(Generic[Origin]):
    """The credit-queue core of both queue inboxes, ``QueueInbox`` (remote senders) and ``LocalQueue``
    (in-process): the items waiting for their consumer, each with where its credit goes back, their
    bytes, and what has been received.

    The owner shares :attr:`CreditQueue.cond` with everything else it guards; every method but
    :meth:`wait` expects the caller to hold it (``wait`` too, and releases it while waiting)."""

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

    def take(self, max_items: int | None) -> tuple[list[Item], dict[Origin, int]]:
        """Up to ``max_items`` of the oldest items (all if None), and the bytes taken from each
        origin: the credit due back to it."""
        items = self.items
        n = len(items) if max_items is None else min(max_items, len(items))
        taken: list[Item] = []
        credit: dict[Origin, int] = {}
        for _ in range(n):  # one pass an item: the consumer's side of a tiny item's cost
            item, origin = items.popleft()
            taken.append(item)
            credit[origin] = credit.get(origin, 0) + item.nbytes
        self.queued_bytes -= sum(credit.values())
        return taken, credit

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
