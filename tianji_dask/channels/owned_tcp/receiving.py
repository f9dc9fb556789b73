"""The inbox's side of the owned tcp:// connections: a receive loop that reads every sender, and
each sender's link, whose thread writes its credit back.

On plain tcp:// the inbox takes each sender's socket from tornado (``owned_socket``), so that
receiving costs the worker's event loop nothing; the event loop only starts the threads and
awaits the end (``QueueInbox.serve``).

**Reading.** With a reader thread per sender, a receiving process spends its GIL on handing it
from thread to thread (docs/benchmarks.md has the profile); raw TCP's receiver, one thread on a
selector with non-blocking reads, does not. :class:`ReceiveLoop` reads that way, on a few such
threads: each connection is a :class:`FrameReader`, a resumable parse of the channel's framing
(``wire``) over a socket that stays in blocking mode for its writer thread and is read here with
``MSG_DONTWAIT``; a large array is received straight into the buffer it stays in, in as many
pieces as the socket holds, or, on a thread with no other connection to read meanwhile, in one
``recv`` that waits for its rest (``MSG_WAITALL``): a wake-up and a turn of the GIL a piece less.
A thread runs while it has connections and ends with its last one; the next
:meth:`ReceiveLoop.add` that picks it starts another.

**Writing back.** A :class:`QueueLink`'s writer thread sends the inbox's credit and window updates
in the same framing. Its first message is the sender's cue to start sending items: until then
the sender sends nothing, which is what lets the inbox take the socket from tornado safely.
Credit that is due at once can also leave from the consumer's own thread
(:meth:`QueueLink.send_now`, without blocking): it then reaches the sender without waiting for
the writer thread to wake and take the GIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import selectors
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import wire
from ..common import finish_soon, logger
from . import owned_socket

if TYPE_CHECKING:
    from ..queue_inbox import QueueInbox, SenderConn

#: Bytes one ``recv`` for the small parts of messages asks for (several small messages at once).
BUFFER_BYTES = 64 << 10
#: A rest of a part at least this large is received straight into the part: one system call
#: costs less than copying it out of the buffer, a copy that holds the GIL.
STRAIGHT_BYTES = 16 << 10
#: Bytes the fill after a large array asks for: the next message's prelude and header, a little
#: more, rather than a buffer's worth of its payload received here and copied again.
FILL_AFTER_LARGE_BYTES = 4 << 10
#: Bytes read from one connection before the others get their turn, within one wake-up.
TURN_BYTES = 4 << 20
#: Threads of an inbox's receive loop (each connection read by one).
RECEIVE_THREADS = 2
#: Longest a ``recv`` waits for the rest of an array (``pump(wait_for_arrays=True)``) before the
#: thread goes back to its selector: a sender stopped halfway through an array (a suspended job)
#: holds up a connection added to the thread meanwhile by no more than this.
ARRAY_WAIT_S = 0.05


class FrameReader:
    """The channel's messages from a blocking socket, read without ever waiting: :meth:`pump`
    reads what the socket holds and returns the messages it completed; a message cut by an empty
    socket resumes where it stopped at the next call."""

    def __init__(self, sock: socket.socket, buffer_bytes: int = BUFFER_BYTES, array_wait_s: float = ARRAY_WAIT_S):
        self._sock = sock
        # bounds a waiting recv only: MSG_DONTWAIT reads and the writer's sends are not affected
        seconds, micros = divmod(max(1, round(array_wait_s * 1e6)), 1_000_000)
        with contextlib.suppress(OSError):  # a socket closed already ends at its first read
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("@ll", seconds, micros))
        self._buffer = bytearray(buffer_bytes)
        self._view = memoryview(self._buffer)
        self._start = 0  # buffered, unread bytes are _buffer[_start:_end]
        self._end = 0
        self._fill_bytes = buffer_bytes
        self._straight_bytes = min(STRAIGHT_BYTES, buffer_bytes)
        self._prelude = bytearray(wire.PRELUDE_BYTES)  # read again for every message
        self._reset()

    @property
    def buffered(self) -> int:
        """Bytes received but not yet parsed."""
        return self._end - self._start

    def _reset(self) -> None:
        self._stage = "prelude"
        self._part = memoryview(self._prelude)  # what is being filled, from _offset on
        self._offset = 0
        self._header_bytes = 0
        self._sizes_raw = bytearray()
        self._sizes: list[int] = []
        self._header = bytearray()
        self._arrays: list[np.ndarray] = []
        self._next_array = 0

    def pump(self, max_bytes: int = TURN_BYTES, wait_for_arrays: bool = False) -> list[dict]:
        """The messages completed by reading what the socket holds now (at most about
        ``max_bytes``). With ``wait_for_arrays``, the rest of an array whose header came is
        waited for inside one ``recv`` (the sender is writing it; at most ``array_wait_s`` a
        call) instead of read in the pieces the socket holds at each wake-up. Raises
        ``ConnectionError`` when the peer closed the connection and :class:`wire.WireError` for
        bytes that are not a message."""
        messages: list[dict] = []
        read = 0
        while read < max_bytes:
            got = self._fill_part(wait_for_arrays)
            if got is None:
                break
            read += got
            if self._offset == self._part.nbytes and self._part_done():
                messages.append(wire.decode(self._header, self._arrays))
                self._reset()
        return messages

    def _part_done(self) -> bool:
        """Go on to the next part of the message; True when there is none (it is complete)."""
        self._offset = 0
        if self._stage == "prelude":
            self._header_bytes, n = wire.check_prelude(self._prelude)
            if n:
                self._stage, self._sizes_raw = "sizes", bytearray(wire.SIZE_BYTES * n)
                self._part = memoryview(self._sizes_raw)
                return False
        elif self._stage == "sizes":
            self._sizes = wire.check_sizes(self._sizes_raw)
        elif self._stage == "header":
            self._arrays = [np.empty(size, dtype=np.uint8) for size in self._sizes]  # filled below
        if self._stage in ("prelude", "sizes"):
            self._stage, self._header = "header", bytearray(self._header_bytes)
            self._part = memoryview(self._header)
            return False
        self._stage = "arrays"
        while self._next_array < len(self._arrays):
            array = self._arrays[self._next_array]
            self._next_array += 1
            if array.nbytes:
                self._part = array.data
                return False
        return True

    def _fill_part(self, wait_for_arrays: bool) -> int | None:
        """Move bytes into the current part, from the buffer or the socket; how many it moved,
        None when the socket holds nothing more now."""
        target = self._part
        need = target.nbytes - self._offset
        have = self._end - self._start
        if have or not need:
            n = min(have, need)
            target[self._offset : self._offset + n] = self._view[self._start : self._start + n]
            self._start += n
            self._offset += n
            return 0
        if need >= self._straight_bytes:
            waits = wait_for_arrays and self._stage == "arrays"
            got = self._recv(target[self._offset :], socket.MSG_WAITALL if waits else socket.MSG_DONTWAIT)
            if got is None:
                return None
            self._offset += got
            if self._offset == target.nbytes:
                self._fill_bytes = min(FILL_AFTER_LARGE_BYTES, len(self._buffer))
            return got
        got = self._recv(self._view[: max(need, self._fill_bytes)])
        if got is None:
            return None
        self._fill_bytes = len(self._buffer)
        self._start, self._end = 0, got
        return got

    def _recv(self, into: memoryview, flags: int = socket.MSG_DONTWAIT) -> int | None:
        try:
            n = self._sock.recv_into(into, into.nbytes, flags)
        except BlockingIOError:
            return None
        if not n:
            raise ConnectionError("the peer closed the connection")
        return n


@dataclass
class _Connection:
    reader: FrameReader
    on_message: Callable[[dict], None]
    on_end: Callable[[Exception | None], None]


class ReceiveLoop:
    """Reads the registered sockets on up to ``threads`` threads, each connection on one (the one
    reading the fewest when it is added): each message goes to its connection's ``on_message``
    (on that thread; it may raise to end the connection), and a connection's end to its
    ``on_end`` once, with None after the sender's "bye", else what ended it (``OSError``: the
    sender is gone; anything else: bad bytes or a message ``on_message`` refused). A connection
    is no longer read once ended; its socket stays the caller's.

    Reading moves the bytes with the GIL released, parsing and handing on hold it: a second
    thread overlaps one connection's copies with another's Python, where many threads would only
    hand the GIL around (docs/benchmarks.md)."""

    def __init__(self, label: str, threads: int = RECEIVE_THREADS):
        if threads < 1:
            raise ValueError(f"a receive loop needs at least one thread, not {threads}")
        self._lock = threading.Lock()
        self._threads = [_ReadThread(label if threads == 1 else f"{label} {k}") for k in range(threads)]

    def add(
        self, sock: socket.socket, on_message: Callable[[dict], None], on_end: Callable[[Exception | None], None]
    ) -> None:
        """Start reading ``sock`` (from any thread)."""
        with self._lock:
            thread = min(self._threads, key=_ReadThread.connections)
            thread.add(sock, _Connection(FrameReader(sock), on_message, on_end))


class _ReadThread:
    """One thread reading its connections on a selector; it runs while it has connections and
    ends with the last one, the next :meth:`add` starting another."""

    def __init__(self, label: str):
        self._label = label
        self._lock = threading.Lock()
        self._pending: list[tuple[socket.socket, _Connection]] = []
        self._count = 0  # connections added and not yet ended
        self._wake: socket.socket | None = None  # while the thread runs: write a byte to wake it

    def connections(self) -> int:
        with self._lock:
            return self._count

    def add(self, sock: socket.socket, conn: _Connection) -> None:
        with self._lock:
            self._pending.append((sock, conn))
            self._count += 1
            if self._wake is not None:
                with contextlib.suppress(OSError):  # a full wake socket is awake enough
                    self._wake.send(b"\0", socket.MSG_DONTWAIT)
                return
            woken, self._wake = socket.socketpair()
        woken.setblocking(False)
        threading.Thread(target=self._run, args=(woken,), name=f"tianji-queue-read {self._label}", daemon=True).start()

    def _run(self, woken: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(woken, selectors.EVENT_READ, None)
        try:
            while True:
                with self._lock:
                    pending, self._pending = self._pending, []
                for sock, conn in pending:
                    try:
                        selector.register(sock, selectors.EVENT_READ, conn)
                    except (OSError, ValueError, KeyError) as exc:  # closed before its turn came
                        self._ended(conn, exc if isinstance(exc, OSError) else ConnectionError(repr(exc)))
                with self._lock:
                    if not self._count:
                        assert self._wake is not None
                        self._wake.close()
                        self._wake = None
                        return
                for key, _ in selector.select():
                    conn = key.data
                    if conn is None:
                        with contextlib.suppress(BlockingIOError):
                            woken.recv(4096)
                        continue
                    end = _read(conn, self._count == 1)
                    if end is not _GOING_ON:
                        selector.unregister(key.fileobj)
                        self._ended(conn, end)
        finally:
            selector.close()
            woken.close()

    def _ended(self, conn: _Connection, end: Exception | None) -> None:
        with self._lock:
            self._count -= 1
        conn.on_end(end)


_GOING_ON = object()


def _read(conn: _Connection, alone: bool):
    """Read what ``conn``'s socket holds and hand on its messages; _GOING_ON, or how it ended.
    ``alone``: it is its thread's only connection, so the thread may wait inside a ``recv``
    for the rest of an array, nothing else to read meanwhile."""
    try:
        for msg in conn.reader.pump(wait_for_arrays=alone):
            if msg.get("bye"):
                return None
            conn.on_message(msg)
    except Exception as exc:  # noqa: BLE001 - handed to on_end, which decides
        return exc
    return _GOING_ON


# ---------------------------------------------------------------------------- one sender's link
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
    """One owned sender connection: its reading on the inbox's :class:`ReceiveLoop` and its writer thread.

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
