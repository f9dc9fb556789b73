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
threads of its own write the items and read the credit (``owned_tcp.sender_threads``). With
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
import threading

from distributed.comm import connect

from tianji_dask.errors import ChannelError

from . import wire
from .comm_stream import StreamSend
from .common import (
    FULL_POLICIES,
    HANDLER_OP,
    QUEUE_KIND,
    SMALL_ITEM_BYTES,
    call_soon,
    logger,
    on_event_loop,
    payload_nbytes,
    resolve_loop,
)
from .malloc import fit_allocator
from .owned_tcp.sender_threads import SenderThreads
from .ports import QueueSenderStats
from .send_window import SendWindow

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
