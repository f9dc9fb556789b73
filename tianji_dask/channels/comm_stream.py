"""The comm transport (tls://): both ends of a queue connection on the comm's tornado stream, on
the event loop. The items go in the channel's own framing (``wire``), the inbox's credit back in
distributed's (``comm.write``/``comm.read``). Plain tcp:// connections go on sockets the two ends
own instead (:mod:`~tianji_dask.channels.owned_tcp`)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from . import wire
from .common import BYE_TIMEOUT_S, logger
from .owned_tcp.receiving import CLOSED_GRACE_S

if TYPE_CHECKING:
    from .queue_inbox import QueueInbox, SenderConn
    from .queue_sender import QueueSender, SendWindow


# ---------------------------------------------------------------------------- the inbox's end
async def serve_stream(inbox: QueueInbox, conn: SenderConn, comm, stream) -> str:
    """Serve ``conn`` on the event loop: its items on the comm's tornado stream, credit back
    through ``comm.write``; returns how the sender left."""
    writer = asyncio.create_task(_credit_writer(inbox, conn))
    try:
        while True:
            try:
                msg = await wire.read(stream)
                if msg.get("bye"):
                    fatal, how = inbox.outcome(None)
                    break
                inbox.deliver(conn, msg)
            except Exception as exc:  # noqa: BLE001 - outcome sorts a lost sender from bad bytes
                fatal, how = inbox.outcome(exc)
                break
    finally:
        inbox.leave(conn)
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
    if fatal is not None:
        logger.error("%s (sender %r from %s); closing its connection", fatal, conn.sender, conn.peer)
        if not comm.closed():
            with contextlib.suppress(Exception):  # best effort: the sender may be gone already
                await asyncio.wait_for(comm.write({"error": fatal}), 5)
    if not comm.closed():
        await comm.close()
    return how


async def _credit_writer(inbox: QueueInbox, conn: SenderConn) -> None:
    """The only writer on ``conn.comm`` while it is served on the event loop: credit and
    window updates, coalesced so that at most one write per sender is pending."""
    assert isinstance(conn.wake, asyncio.Event)
    comm = conn.comm
    while True:
        await conn.wake.wait()
        conn.wake.clear()
        msg, closed = inbox.control(conn)
        if msg:
            await comm.write(msg)
        if closed:
            # Keep reading (and discarding) so the error is not lost to a reset; a sender
            # that ignores it is cut off after a grace period.
            await asyncio.sleep(CLOSED_GRACE_S)
            comm.abort()
            return


# ---------------------------------------------------------------------------- the sender's end
class StreamSend:
    """A sender's connection on the event loop: writes its items and the "bye", reads credit."""

    def __init__(self, sender: QueueSender, window: SendWindow, wake: asyncio.Event):
        self._sender = sender
        self._window = window
        self._wake = wake

    async def run(self, comm, stream) -> None:
        """Write until everything queued before ``close`` is written, then say bye; return early
        when the channel failed."""
        window = self._window
        reader = asyncio.create_task(self._read_credit(comm))
        try:
            while True:
                with window.cond:
                    batch, batch_bytes = window.take_batch()
                if batch:
                    await write(stream, self._sender.encode_batch(batch))
                    window.count_written(len(batch), batch_bytes)
                    continue
                with window.cond:
                    if window.error is not None:
                        return
                    if window.closing and not window.pending:
                        break
                await self._wake.wait()
                self._wake.clear()
            await self._say_bye(comm, stream, reader)
        finally:
            reader.cancel()

    async def _say_bye(self, comm, stream, reader: asyncio.Task) -> None:
        """Close handshake: "bye", then go on reading (and dropping) credit until the receiver,
        having read everything before the "bye", closes its end (see ``queue_sender.SenderThreads``).
        Cancelling the reader is no way out: distributed's ``TCP.read`` aborts the comm when
        cancelled."""
        with self._window.cond:
            self._window.bye_sent = True
        await write(stream, wire.encode({"bye": True}, out_of_band=False))
        try:
            await asyncio.wait_for(asyncio.shield(reader), BYE_TIMEOUT_S)
        except TimeoutError:
            logger.warning("%r: the receiver did not close within %.0f s of 'bye'", self._sender, BYE_TIMEOUT_S)
        await comm.close()

    async def _read_credit(self, comm) -> None:
        """Apply the receiver's credit and window messages, in distributed's framing on ``comm``."""
        try:
            while self._sender.apply(await comm.read()):
                self._wake.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the reader is the channel's error
            with self._window.cond:
                said_bye = self._window.bye_sent
            if not said_bye:  # after "bye" the receiver closing its end is the normal end
                self._sender.fail(f"connection lost (receiving worker gone?): {exc!r}")


async def write(stream, pieces: list) -> None:
    """Write ``pieces`` in order; returns once the stream has handed them to the socket, or
    raises its error (``StreamClosedError``: the receiver is gone)."""
    done = await asyncio.gather(*[stream.write(piece) for piece in pieces], return_exceptions=True)
    for outcome in done:
        if isinstance(outcome, BaseException):
            raise outcome
