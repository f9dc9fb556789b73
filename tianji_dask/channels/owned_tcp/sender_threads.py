"""A queue sender's end of an owned tcp:// connection: once the inbox's cue came, the sender takes
its socket from tornado (``owned_socket``) and a thread of its own writes the items (``sendmsg``,
what is ready up to ``max_batch_bytes`` a call) and the "bye", another reads the credit; the
event loop only starts them and awaits their end."""

from __future__ import annotations

import asyncio
import selectors
import socket
import threading
from typing import TYPE_CHECKING

from tianji_dask.errors import ChannelError

from .. import wire
from ..common import BYE_TIMEOUT_S, finish_soon, logger
from ..send_window import SendWindow
from . import owned_socket
from .receive_loop import FrameReader

if TYPE_CHECKING:
    from ..queue_sender import QueueSender


class SenderThreads:
    """The writer and credit threads of one sender's owned connection."""

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
