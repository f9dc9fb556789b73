"""Sending end of a many-to-one queue channel, with credit-based flow control.

Call protocol::

    sender = QueueSender(inbox_address, "traj", sender_id="actor-3", capacity_bytes=32 << 20)
    while running:                      # in the role's own thread, never on the event loop
        ok = sender.push({"obs": obs, "act": act})   # False only when drop_oldest dropped it
    sender.close()

Wire protocol on one comm to the receiving worker (see ``queue_inbox`` for the other side)::

    sender   -> {"op": "tianji_channel", "reply": False, "channel", "sender", "kind": "queue",
                 "owned": True, "capacity": its capacity_bytes}
    receiver -> {"window": bytes, "owned": True}  or  {"window": bytes}  or  {"error": text}
    with "owned" (plain tcp://: the receiver took its end of the socket from tornado, to read it
    on threads of its own), every later message of the receiver is in the channel's framing too:
    receiver -> {"window": bytes}                              (the cue: until then the sender
                                                              sends nothing more)
    then, in the channel's own framing (``wire``; without "owned", distributed's comm the other way):
    sender   -> {"items": [(seq, nbytes, payload), ...]}      (repeated, up to max_batch_bytes and
                                                              max_batch_items: a run of items under
                                                              SMALL_ITEM_BYTES in one pickle, or of
                                                              larger ones, their arrays out of band;
                                                              one item of half a batch or more when
                                                              push encoded it)
    receiver -> {"credit": bytes, "window": bytes}           (either key optional, repeated)
    sender   -> {"bye": True}, then reads (and drops) credit until the receiver closes, then closes

With "owned", the sender too takes its end of the socket from tornado once the cue came, and
threads of its own write the items and read the credit (:class:`SenderThreads`). With
``full_policy="wait"``, ``push`` encodes an item of half a batch or more for that thread when
nothing waits before it, so that the writer's Python a message is next to nothing. Without
"owned" (tls://), everything goes through the event loop (``comm_stream``). The window, the
queues and the counts all these parts share are a ``SendWindow``.

Arrays handed to ``push`` belong to the channel: they are serialized zero-copy, later, on that
thread or the event loop, so the caller must not mutate them after the call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import selectors
import socket
import threading
import time
from collections import deque

from distributed.comm import connect

from tianji_dask.errors import ChannelError

from . import wire
from .comm_stream import StreamSend
from .common import (
    BYE_TIMEOUT_S,
    FULL_POLICIES,
    HANDLER_OP,
    QUEUE_KIND,
    SMALL_ITEM_BYTES,
    call_soon,
    finish_soon,
    logger,
    on_event_loop,
    resolve_loop,
)
from .owned_tcp import owned_socket
from .owned_tcp.receiving import FrameReader
from .ports import QueueSenderStats
from .wire import fit_allocator, payload_nbytes

TEARDOWN_S = 5.0  # how long a close that timed out waits for the cancelled run to let go of its socket


class QueueSender:
    """One sender's end of a queue channel; ``push`` may be called from any non-event-loop thread.

    Outstanding bytes are items queued here but not yet written plus items written but not yet
    taken by the receiving consumer.  They never exceed ``capacity_bytes``; when a push would
    exceed it, ``full_policy="wait"`` blocks the pushing thread until credit returns (counted in
    ``stats()["blocked_s"]``) and ``"drop_oldest"`` discards the oldest unwritten items (counted in
    ``dropped``; their sequence numbers are skipped so the receiver sees the gap).  When every
    outstanding byte is already written, ``drop_oldest`` drops the new item instead; that still
    consumes a sequence number, so ``dropped`` equals the receiver's ``seq_gaps`` once a later
    item has arrived.  (Generalized: when even dropping every unwritten item would not make
    room, the new item is dropped and the unwritten ones are kept.)

    Keyword-only extras: ``connect_timeout`` (seconds; default ``distributed.comm.timeouts.connect``)
    and ``max_batch_items`` (items per message).  Close senders you no longer use: the
    connection keeps the object alive until ``close``.

    The receiver may announce a smaller window (its capacity shared among its live senders):
    then items wait here, still counted as outstanding.  An item larger than the window is
    written only once nothing else of this sender is in flight.
    """

    def __init__(
        self,
        address: str,
        channel: str,
        sender_id: str,
        capacity_bytes: int,
        full_policy: str = "wait",
        max_batch_bytes: int = 1 << 20,
        loop=None,
        connection_args: dict | None = None,
        *,
        connect_timeout: float | None = None,
        max_batch_items: int = 4096,
    ):
        if full_policy not in FULL_POLICIES:
            raise ValueError(f"full_policy must be one of {FULL_POLICIES}, got {full_policy!r}")
        if capacity_bytes <= 0 or max_batch_bytes <= 0:
            raise ValueError("capacity_bytes and max_batch_bytes must be positive")
        self.address = address
        self.channel = channel
        self.sender_id = sender_id
        self.capacity_bytes = int(capacity_bytes)
        self.full_policy = full_policy
        self.max_batch_bytes = int(max_batch_bytes)
        # A run of small items is one pickle, a couple of microseconds an item at each end: the
        # cap keeps one message from holding a loop for more than a few milliseconds. It is high
        # because a wire message has a cost of its own far above an item's (docs/benchmarks.md).
        self.max_batch_items = int(max_batch_items)
        self._loop, self._connection_args = resolve_loop(loop, connection_args)
        self._connect_timeout = connect_timeout
        self._where = f"queue channel {channel!r} at {address}"
        self._window = SendWindow(
            self._where, self.capacity_bytes, full_policy, self.max_batch_bytes, self.max_batch_items
        )
        self._kick_scheduled = False  # guarded by the window's condition
        self._future: concurrent.futures.Future[None] | None = None  # of _run, set by the first push
        self._run_started = threading.Event()
        self._run_ended = threading.Event()  # _run's teardown is done: socket closed, threads joined
        self._wake: asyncio.Event | None = None  # of the event loop's writer (tls://)

    def __repr__(self) -> str:
        return f"<QueueSender {self.sender_id!r} -> {self.channel!r} at {self.address}>"

    # ------------------------------------------------------------------ caller's thread
    def push(self, payload: dict) -> bool:
        """Queue one item; returns at once while credit allows (see the class docstring).

        Returns False when ``drop_oldest`` had to drop this very item.  Raises ChannelError once
        the connection broke or the channel was closed, ValueError for an item larger than
        ``capacity_bytes``, RuntimeError when ``wait`` would have to block an event loop.
        """
        nbytes = payload_nbytes(payload)
        fit_allocator(nbytes, self.capacity_bytes)
        if nbytes > self.capacity_bytes:
            raise ValueError(f"item of {nbytes} bytes exceeds capacity_bytes={self.capacity_bytes} of {self._where}")
        window = self._window
        with window.cond:
            if window.error is not None or window.closing:  # the check inline: push is per item
                window.check_usable()
            if self._future is None:
                self._start()
            if not window.add(nbytes, payload, self):
                return False
            if window.writer_thread:
                window.cond.notify_all()
                return True
            kick = not self._kick_scheduled
            self._kick_scheduled = True
        if kick and not call_soon(self._loop, self._on_kick):
            self.fail("the event loop is closed (worker shutting down)")
            raise ChannelError(str(window.error))
        return True

    def stats(self) -> QueueSenderStats:
        return self._window.stats()

    def close(self, timeout: float = 5.0) -> None:
        """Write what is still queued (for at most ``timeout`` seconds), then close the comm.
        After a timeout the rest is dropped and the channel's error says so; close returns once
        the connection is shut down and its threads ended (at most ``TEARDOWN_S`` later).

        Idempotent; never raises for a broken connection (see ``stats()["errors"]``).  From an
        event-loop thread it only starts the flush and returns."""
        window = self._window
        with window.cond:
            already = window.closing
            window.closing = True
            window.cond.notify_all()  # pushers blocked in "wait" raise ChannelError
            future = self._future
        if already or future is None:
            return
        call_soon(self._loop, self._on_kick)
        if on_event_loop():
            return
        try:
            future.result(timeout)
        except TimeoutError:
            future.cancel()  # the run's teardown shuts the socket down and records why
            logger.warning("%r: close() timed out after %.1f s with items unwritten", self, timeout)
            started = self._run_started.is_set() and self._loop.is_running()  # else no teardown comes
            if started and not self._run_ended.wait(TEARDOWN_S):
                logger.warning("%r: the cancelled run had not let go of its socket after %.0f s", self, TEARDOWN_S)
        except Exception:  # noqa: BLE001 - already recorded by fail; close stays quiet by contract
            pass

    def _start(self) -> None:
        """Start the connection on the event loop; the caller holds the window's condition."""
        try:
            self._future = asyncio.run_coroutine_threadsafe(self._run(), self._loop)
        except RuntimeError as exc:  # loop closed
            self._window.fail(f"cannot start: {exc}")
            raise ChannelError(str(self._window.error)) from None

    # ------------------------------------------------------------------ the connection's parts
    def fail(self, reason: ChannelError | str) -> None:
        """The channel's first error: unwritten items are released, pushers and writer woken."""
        self._window.fail(reason)
        if self._wake is not None:
            call_soon(self._loop, self._wake.set)

    def apply(self, msg) -> bool:
        """Apply one message of the receiver: credit and window; False (the channel failed)
        for its error or anything that is not a message dict."""
        if not isinstance(msg, dict) or "error" in msg:
            reason = msg.get("error") if isinstance(msg, dict) else repr(msg)
            self.fail(f"receiver closed the connection: {reason}")
            return False
        self._window.credit(msg)
        return True

    def encode_batch(self, batch: list[tuple[int, int, dict]]) -> list:
        """``batch`` as one message's pieces; a ``ChannelError`` naming the item that does not pickle."""
        try:
            return wire.encode({"items": batch}, out_of_band=batch[0][1] >= SMALL_ITEM_BYTES)
        except Exception as exc:  # noqa: BLE001 - whatever the pickler raises
            bad = next((seq for seq, _, payload in batch if not _pickles(payload)), batch[0][0])
            raise ChannelError(
                f"{self._where}: item {bad} cannot be serialized ({exc!r}); "
                "payloads hold arrays, tensors and plain picklable values"
            ) from None

    # ------------------------------------------------------------------ event loop
    def _on_kick(self) -> None:
        with self._window.cond:
            self._kick_scheduled = False
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        self._run_started.set()
        try:
            await self._connect_and_write()
        finally:
            self._run_ended.set()

    async def _connect_and_write(self) -> None:
        """Connect, shake hands, then write on the owned socket's threads (tcp://) or on the
        event loop (tls://) until closed; any failure becomes the channel's error."""
        self._wake = wake = asyncio.Event()
        comm = None
        try:
            try:
                comm = await connect(self.address, timeout=self._connect_timeout, **self._connection_args)
            except Exception as exc:
                raise ChannelError(f"{self._where}: cannot connect: {exc}") from exc
            stream, owned = await self._handshake(comm)
            if owned:
                await SenderThreads(self, self._window, self._loop).run(comm, stream)
            else:
                await StreamSend(self, self._window, wake).run(comm, stream)
        except asyncio.CancelledError:
            self.fail("closed before everything queued was written")
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the writer is the channel's error
            self.fail(exc if isinstance(exc, ChannelError) else f"connection lost: {exc!r}")
        finally:
            if comm is not None and not comm.closed():
                comm.abort()

    async def _handshake(self, comm) -> tuple[object, bool]:
        """Offer the inbox an owned socket and read its window: (the comm's stream, whether the
        inbox took the offer, in which case its cue, in the channel's framing, came too)."""
        await comm.write(
            {
                "op": HANDLER_OP,
                "reply": False,
                "channel": self.channel,
                "sender": self.sender_id,
                "kind": QUEUE_KIND,
                "owned": True,
                "capacity": self.capacity_bytes,
            }
        )
        reply = await comm.read()
        stream = wire.stream_of(comm, self.channel, self.address)
        owned = isinstance(reply, dict) and reply.get("owned") is True
        if owned:  # the cue, on the socket the receiver now owns
            reply = await wire.read(stream)
        if not isinstance(reply, dict) or "window" not in reply:
            reason = reply.get("error") if isinstance(reply, dict) else None
            raise ChannelError(f"{self._where}: refused: {reason or repr(reply)}")
        with self._window.cond:
            self._window.window = int(reply["window"])
        return stream, owned


def _pickles(payload: dict) -> bool:
    try:
        wire.encode({"items": [(0, 0, payload)]}, out_of_band=True)
    except Exception:  # noqa: BLE001 - whatever the pickler raises
        return False
    return True


class SendWindow:
    """A queue sender's window: what it holds and what it has in flight, under one condition.

    The pushing threads, the connection's writer (a thread of its own on an owned tcp:// socket, the
    event loop on tls://) and whoever applies the receiver's credit share one :class:`SendWindow`;
    :class:`QueueSender` explains the rules it keeps. Its fields
    are those parts' common state: they read and write them holding :attr:`SendWindow.cond` (the
    writer thread pops :attr:`SendWindow.ready` without it, see :class:`SenderThreads`)."""

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
            pieces = wire.encode({"items": [(self.next_seq, nbytes, payload)]}, out_of_band=True)
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


class SenderThreads:
    """A queue sender's end of an owned tcp:// connection: once the inbox's cue came, the sender takes
    its socket from tornado (``owned_socket``) and a thread of its own writes the items (``sendmsg``,
    what is ready up to ``max_batch_bytes`` a call) and the "bye", another reads the credit; the
    event loop only starts them and awaits their end."""

    def __init__(self, sender: QueueSender, window: SendWindow, loop: asyncio.AbstractEventLoop):
        self._sender = sender
        self._window = window
        self._loop = loop

    async def run(self, comm, stream) -> None:
        """Take the socket from tornado, then write the items and the "bye" from one thread and
        read the credit on another, until both ended; closes the socket."""
        sender, window = self._sender, self._window
        while owned_socket.read_ahead(comm):  # what the inbox sent just after its cue (a window)
            if not sender.apply(await wire.read(stream)):
                return
        sock = owned_socket.take(comm)
        written: asyncio.Future[None] = self._loop.create_future()
        read: asyncio.Future[None] = self._loop.create_future()
        label = f"{sender.channel} {sender.sender_id}"
        threads = [
            threading.Thread(target=run, args=(sock, end), name=f"tianji-channel-{role} {label}", daemon=True)
            for run, end, role in ((self._write_loop, written, "send"), (self._credit_loop, read, "credit"))
        ]
        with window.cond:
            window.writer_thread = True
        for thread in threads:
            thread.start()
        try:
            await asyncio.shield(written)
            with window.cond:
                said_bye = window.bye_sent
            if said_bye:
                try:
                    await asyncio.wait_for(asyncio.shield(read), BYE_TIMEOUT_S)
                except TimeoutError:
                    logger.warning("%r: the receiver did not close within %.0f s of 'bye'", sender, BYE_TIMEOUT_S)
        except asyncio.CancelledError:  # close() timed out: say so before the threads see the shutdown
            sender.fail("closed before everything queued was written")
            raise
        finally:
            owned_socket.shut_down(sock)  # ends whichever thread still waits on the socket
            await asyncio.shield(asyncio.gather(written, read))
            for thread in threads:
                thread.join()  # each has only its return left
            sock.close()

    def _write_loop(self, sock: socket.socket, done: asyncio.Future[None]) -> None:
        """Write until everything queued before ``close`` is written, then the "bye"; return
        early when the channel failed. The messages ``push`` encoded go without a turn of the
        window's condition; only when there are none does the writer take a batch of pending
        items under it, or wait."""
        window = self._window
        try:
            while True:
                if window.ready:
                    self._write_ready(sock)
                    continue
                batch: list[tuple[int, int, dict]] = []
                batch_bytes = 0
                with window.cond:
                    while True:
                        if window.ready:
                            break
                        batch, batch_bytes = window.take_batch()
                        if batch or window.error is not None or (window.closing and not window.pending):
                            break
                        window.cond.wait()
                    if not (window.ready or batch):
                        if window.error is not None:
                            return
                        window.bye_sent = True
                        break
                if batch:
                    wire.send(sock, self._sender.encode_batch(batch))
                    window.count_written(len(batch), batch_bytes)
            wire.send(sock, wire.encode({"bye": True}, out_of_band=False))
        except (OSError, ChannelError) as exc:
            self._sender.fail(exc if isinstance(exc, ChannelError) else f"connection lost: {exc!r}")
            owned_socket.shut_down(sock)
        finally:
            finish_soon(self._loop, done)

    def _write_ready(self, sock: socket.socket) -> None:
        """Write the messages ``push`` encoded, up to ``max_batch_bytes`` of them (at least one)
        in one system call."""
        window = self._window
        ready = window.ready
        try:
            pieces, nbytes = ready.popleft()
            items = 1
            while ready and nbytes + ready[0][1] <= window.max_batch_bytes:
                more, more_bytes = ready.popleft()
                pieces = pieces + more
                nbytes += more_bytes
                items += 1
        except IndexError:  # the channel failed meanwhile and cleared them
            return
        wire.send(sock, pieces)
        window.count_written(items, nbytes, messages=items)

    def _credit_loop(self, sock: socket.socket, done: asyncio.Future[None]) -> None:
        """Apply the receiver's credit and window messages until it closes its end, which after
        the "bye" is the normal end. Reading on after the "bye" matters: a socket closed with
        unread data resets the connection, which discards the part of the last messages the
        receiver has not read yet. The messages are parsed as the inbox parses its senders'
        (``FrameReader``), the thread waiting on a selector between them."""
        reader = FrameReader(sock)
        selector = selectors.DefaultSelector()
        selector.register(sock, selectors.EVENT_READ)
        try:
            while True:
                selector.select()
                for msg in reader.pump():
                    if not self._sender.apply(msg):
                        owned_socket.shut_down(sock)  # the receiver's error: nothing more can be delivered
                        return
        except (OSError, wire.WireError) as exc:  # ConnectionError: the receiver closed its end
            with self._window.cond:
                said_bye = self._window.bye_sent
            if not said_bye:
                self._sender.fail(f"connection lost (receiving worker gone?): {exc!r}")
                owned_socket.shut_down(sock)
        finally:
            selector.close()
            finish_soon(self._loop, done)
