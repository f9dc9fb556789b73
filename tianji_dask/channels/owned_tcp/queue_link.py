"""One queue sender's connection on a socket the inbox owns: read by the inbox's receive loop,
written by a thread of its own.

On plain tcp:// the inbox takes the sender's socket from tornado (``owned_socket``), so that
receiving a sender's items costs the worker's event loop nothing: the inbox's
:class:`~.receive_loop.ReceiveLoop` reads the channel's framing into buffers of each array's
exact size and hands each message to the inbox, on a few threads for all its senders, and a writer
thread sends the inbox's credit and window updates back in the same framing. The event loop only
starts them and awaits the end (``QueueInbox.serve``).

The writer's first message is the sender's cue to start sending items: until then the sender
sends nothing, which is what lets the inbox take the socket from tornado safely.

Credit that is due at once can also leave from the consumer's own thread (:meth:`QueueLink.
send_now`, without blocking): it then reaches the sender without waiting for the writer thread
to wake and take the GIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import wire
from ..common import finish_soon, logger
from . import owned_socket
from .receive_loop import ReceiveLoop

if TYPE_CHECKING:
    from ..queue_inbox import QueueInbox, SenderConn

#: How long a closed inbox keeps reading (and dropping) a sender's items after telling it, so
#: that the error is read before the connection goes; then the sender is cut off.
CLOSED_GRACE_S = 10.0
#: How long the writer waits for more credit to add to a little that is due (``control``).
CREDIT_LINGER_S = 0.002
#: How long an error reply may take to leave before the connection is cut.
ERROR_SEND_TIMEOUT_S = 5.0


async def serve_owned(inbox: QueueInbox, conn: SenderConn, comm) -> str:
    """Serve ``conn`` on its socket, taken from tornado: read on the inbox's receive loop, its
    credit written by a :class:`QueueLink` thread; returns how the sender left."""
    assert isinstance(conn.wake, threading.Event)  # an owned connection's writer is a thread
    try:
        sock = owned_socket.take(comm)
    except RuntimeError as exc:  # bytes came before the cue: not a sender of this protocol
        where = f"queue channel {inbox.name!r} at {inbox.address}"
        problem = f"malformed message on {where}: sent before its cue ({exc})"
        logger.error("%s (sender %r from %s); closing its connection", problem, conn.sender, conn.peer)
        with contextlib.suppress(Exception):  # best effort; after "owned", in the channel's framing
            await asyncio.wait_for(comm.stream.write(wire.encode_whole({"error": problem})), 5)
        return problem
    link = QueueLink(
        sock,
        inbox.loop,
        conn.wake,
        on_message=functools.partial(inbox.deliver, conn),
        control=functools.partial(inbox.control, conn),
        label=f"{inbox.name} {conn.sender}",
        receive_loop=inbox.receive_loop,
    )
    link.start({"window": conn.window_sent})
    conn.link = link
    try:
        fatal, how = inbox.outcome(await link.reading_ended())
        inbox.leave(conn)
        if fatal is not None:
            logger.error("%s (sender %r from %s); closing its connection", fatal, conn.sender, conn.peer)
        await link.close(fatal)
    except BaseException:
        link.abort()
        raise
    return how


class QueueLink:
    """One owned sender connection: its reading in ``receive_loop`` and its writer thread.

    ``on_message(msg)`` runs on the receive loop's thread for every message but the sender's
    "bye" and may raise to end the connection. ``control(force)`` runs on the writer thread after each
    ``wake``: it returns the next credit/window message (empty when nothing is due; None,
    unless forced, when the writer should wait :data:`CREDIT_LINGER_S` for more credit first)
    and whether the inbox is closed, in which case that message is the sender's error and the
    link ends after :data:`CLOSED_GRACE_S`.
    """

    def __init__(
        self,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        wake: threading.Event,
        on_message: Callable[[dict], None],
        control: Callable[[bool], tuple[dict | None, bool]],
        label: str,
        receive_loop: ReceiveLoop,
    ):
        self._sock = sock
        self._loop = loop
        self._wake = wake
        self._on_message = on_message
        self._control = control
        self._receive_loop = receive_loop
        self._stopping = threading.Event()
        self._send_lock = threading.Lock()  # one message at a time on the socket, whole
        self._unsent = b""  # the rest of a message send_now began, for the writer to finish
        self._first: dict = {}
        self._error: str | None = None
        self._read_end: Exception | None = None  # what ended reading; None: the sender's "bye"
        self._reader_done: asyncio.Future[None] = loop.create_future()
        self._writer_done: asyncio.Future[None] = loop.create_future()
        self._writer = threading.Thread(target=self._write_loop, name=f"tianji-queue-write {label}", daemon=True)

    def start(self, first: dict) -> None:
        """Start reading and the writer; ``first`` is the writer's first message, the sender's
        cue."""
        self._first = first
        self._receive_loop.add(self._sock, self._on_message, self._reading_stopped)
        self._writer.start()

    async def reading_ended(self) -> Exception | None:
        """Wait until the reader stopped: None after the sender's "bye", else what ended it
        (``OSError``: the sender is gone; anything else: its bytes or message were bad)."""
        await asyncio.shield(self._reader_done)
        return self._read_end

    async def close(self, error: str | None = None) -> None:
        """End the link: send ``error`` to the sender first, if given, then shut the socket down,
        wait for reading to end, join the writer and close the socket. Call once, after
        :meth:`reading_ended`."""
        self._error = error
        self._stopping.set()
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._writer_done), ERROR_SEND_TIMEOUT_S + 1)
        except TimeoutError:  # the writer is stuck in a send to a sender that reads nothing
            owned_socket.shut_down(self._sock)
            await asyncio.shield(self._writer_done)
        owned_socket.shut_down(self._sock)
        await asyncio.shield(self._reader_done)
        self._writer.join()  # it has only its return left
        self._sock.close()

    def send_now(self, msg: dict) -> bool:
        """Send ``msg`` from the calling thread if that takes no waiting: True when it is sent
        (or its rest left to the writer thread, which was woken), or the connection is gone;
        False when nothing was sent (the socket is busy or full): the caller keeps ``msg``."""
        if not self._send_lock.acquire(blocking=False):
            return False
        try:
            if self._unsent or self._stopping.is_set():
                return False
            data = wire.encode_whole(msg)
            try:
                sent = self._sock.send(data, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return False
            except OSError:
                return True  # the reader sees the connection end too
            if sent < len(data):
                self._unsent = data[sent:]
                self._wake.set()
            return True
        finally:
            self._send_lock.release()

    def abort(self) -> None:
        """Shut the socket down so that reading and the writer end soon; for a cancelled
        ``serve``."""
        self._stopping.set()
        self._wake.set()
        owned_socket.shut_down(self._sock)

    # ------------------------------------------------------------------ threads
    def _reading_stopped(self, end: Exception | None) -> None:
        self._read_end = end
        finish_soon(self._loop, self._reader_done)

    def _write_loop(self) -> None:
        try:
            self._send(self._first)
            while not self._stopping.is_set():
                self._wake.wait()
                self._wake.clear()
                if self._stopping.is_set():
                    break
                self._send(None)  # the rest of what send_now began, if any
                msg, closed = self._control(False)
                if msg is None:  # only a little credit due: let more takes add to it first
                    self._stopping.wait(CREDIT_LINGER_S)
                    msg, closed = self._control(True)
                if msg:
                    self._send(msg)
                if closed:
                    self._stopping.wait(CLOSED_GRACE_S)
                    owned_socket.shut_down(self._sock)
                    return
        except OSError:
            pass  # the sender is gone, or close() cut the socket: the reader sees it too
        finally:
            if self._error is not None:
                with contextlib.suppress(OSError):
                    self._sock.settimeout(ERROR_SEND_TIMEOUT_S)
                    self._send({"error": self._error})
            finish_soon(self._loop, self._writer_done)

    def _send(self, msg: dict | None) -> None:
        """Finish what :meth:`send_now` began, then send ``msg`` (None: nothing more)."""
        with self._send_lock:
            if self._unsent:
                self._sock.sendall(self._unsent)
                self._unsent = b""
            if msg is not None:
                self._sock.sendall(wire.encode_whole(msg))
