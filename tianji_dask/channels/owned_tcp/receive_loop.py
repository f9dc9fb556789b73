"""The threads that read every owned sender connection of an inbox, each on a selector.

With a reader thread per sender, a receiving process spends its GIL on handing it from thread to
thread (docs/benchmarks.md has the profile); raw TCP's receiver, one thread on a selector with
non-blocking reads, does not. This module reads that way, on a few such threads: each connection
is a :class:`FrameReader`, a resumable parse of the channel's framing (``wire``) over a socket
that stays in blocking mode for its writer thread and is read here with ``MSG_DONTWAIT``; a large
array is received straight into the buffer it stays in, in as many pieces as the socket holds, or,
on a thread with no other connection to read meanwhile, in one ``recv`` that waits for its rest
(``MSG_WAITALL``): a wake-up and a turn of the GIL a piece less.

A thread runs while it has connections and ends with its last one; the next
:meth:`ReceiveLoop.add` that picks it starts another.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import wire

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
