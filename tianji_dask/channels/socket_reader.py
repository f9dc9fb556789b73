"""Exact-size reads from a blocking socket, for a thread that owns the socket.

Small reads (a message's prelude and header) are served from a buffer filled by one ``recv`` of
whatever has arrived, so a run of small messages costs one system call per buffer, not per
read. A large read goes straight into the caller's buffer with ``MSG_WAITALL``: the kernel
returns once all of it is there, so a large array costs one wake-up of the thread (and one
taking of the GIL) instead of one per TCP segment.

Right after a large read the next fill asks for only :data:`FILL_AFTER_LARGE_BYTES`: the next
message is probably large too, and a full buffer's worth of its payload would be received into
the buffer and then copied again, with the GIL held, into the array it belongs in.
"""

from __future__ import annotations

import socket

#: Bytes one ``recv`` for small reads asks for; a read at least this large bypasses the buffer.
BUFFER_BYTES = 64 << 10
#: Bytes the fill after a large read asks for: a message's prelude and header, a little more.
FILL_AFTER_LARGE_BYTES = 4 << 10


class SocketReader:
    """Reads exactly as many bytes as asked from ``sock``; ``ConnectionError`` when the peer
    closes the connection first (``OSError`` for other socket errors)."""

    def __init__(self, sock: socket.socket, buffer_bytes: int = BUFFER_BYTES):
        self._sock = sock
        self._buffer = bytearray(buffer_bytes)
        self._view = memoryview(self._buffer)
        self._start = 0  # buffered, unread bytes are _buffer[_start:_end]
        self._end = 0
        self._fill_bytes = len(self._buffer)  # what the next fill asks for (at least)

    @property
    def buffered(self) -> int:
        """Bytes received but not yet read."""
        return self._end - self._start

    def read(self, n: int) -> bytes | bytearray:
        """The next ``n`` bytes."""
        if n <= self._end - self._start:
            data = bytes(self._view[self._start : self._start + n])
            self._start += n
            return data
        out = bytearray(n)
        self.readinto(memoryview(out))
        return out

    def readinto(self, target: memoryview) -> None:
        """Fill ``target`` (a writable byte view) with the next ``len(target)`` bytes."""
        n = target.nbytes
        have = min(n, self._end - self._start)
        target[:have] = self._view[self._start : self._start + have]
        self._start += have
        if have == n:
            return
        if n - have < len(self._buffer):  # a small rest: refill the buffer and copy from it
            self._fill(n - have)
            target[have:] = self._view[: n - have]
            self._start = n - have
            return
        while have < n:
            got = self._sock.recv_into(target[have:], n - have, socket.MSG_WAITALL)
            if not got:
                raise ConnectionError("the peer closed the connection")
            have += got
        self._fill_bytes = min(FILL_AFTER_LARGE_BYTES, len(self._buffer))

    def _fill(self, at_least: int) -> None:
        """Empty the buffer and receive at least ``at_least`` bytes into it."""
        self._start = self._end = 0
        limit = max(at_least, self._fill_bytes)
        self._fill_bytes = len(self._buffer)
        while self._end < at_least:
            got = self._sock.recv_into(self._view[self._end : limit])
            if not got:
                raise ConnectionError("the peer closed the connection")
            self._end += got
