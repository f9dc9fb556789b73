"""Taking a plain tcp:// comm's socket away from tornado, so that a thread can own it.

Tornado's ``IOStream`` keeps watching a socket for reads even while nothing is reading it and
reads whatever arrives into its own buffer, so a second reader beside it (a thread on the same
file descriptor) loses bytes to it. :func:`take` ends tornado's part for good: it duplicates
the descriptor and aborts the comm, which unregisters the descriptor from the event loop and
closes tornado's copy, while the connection lives on through the duplicate. Bytes the peer sends
meanwhile stay in the socket for the new owner; :func:`take` refuses a stream that holds bytes it
already read ahead (:func:`read_ahead`: read them through the comm first) or has not yet written.
The queue channel uses it at both ends: the inbox takes its end once the sender waits for its cue
(so nothing is read ahead), the sender once the cue came, after reading through the comm what the
inbox sent next (a window update).

TLS comms are not taken: their bytes are only meaningful through the TLS session tornado holds.
"""

from __future__ import annotations

import contextlib
import socket

from distributed.comm import Comm
from distributed.comm.tcp import TCP


def can_take(comm: Comm) -> bool:
    """True for an open plain tcp:// comm (not tls://, not inproc://)."""
    return type(comm) is TCP and comm.stream is not None and not comm.stream.closed()


def read_ahead(comm: Comm) -> int:
    """How many bytes of ``comm`` tornado has read from the socket and not yet handed out: they
    must be read through the comm before :func:`take`."""
    stream = getattr(comm, "stream", None)
    return 0 if stream is None else stream._read_buffer_size


def take(comm: Comm) -> socket.socket:
    """The blocking socket of ``comm``, now the caller's alone; ``comm`` is closed (aborted)
    without closing the connection. Raises ``ConnectionError`` when the comm is already closed
    and ``RuntimeError`` when tornado holds unread or unwritten bytes of it."""
    if not can_take(comm):
        raise ConnectionError(f"{comm!r} is closed or not a plain tcp:// comm")
    assert isinstance(comm, TCP) and comm.stream is not None  # can_take checked both
    stream = comm.stream
    if stream._read_buffer_size or stream.writing():
        raise RuntimeError(
            f"{comm!r} has {stream._read_buffer_size} bytes read ahead"
            + (" and bytes not yet written" if stream.writing() else "")
        )
    sock = stream.socket.dup()
    comm.abort()
    sock.setblocking(True)  # the duplicate shares tornado's non-blocking flag: clear it
    return sock


def shut_down(sock: socket.socket) -> None:
    """Shut a taken socket down both ways, which ends any thread blocked on it; quiet when it is
    already shut down or the peer reset it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
