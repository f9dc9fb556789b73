"""The queue channel's own framing, sender to inbox, once the handshake is done.

distributed's comm carries the handshake and, the other way, the inbox's credit; the items go
on the same stream with a framing of their own, which costs a fraction of distributed's
(``to_frames``/``from_frames``: msgpack, ``serialize``, ``sizeof`` of every payload) and reads a
large item's arrays straight into the buffers they stay in. A message::

    "TJQ1"  u32 header bytes  u32 buffers  u64 bytes of each buffer  header  buffers...

The header is a pickle (protocol 5) of the message dict; a large item's contiguous arrays leave
it as out-of-band buffers, written as they are and read into buffers of their exact size.
Small items stay inside the header (one pickle for the run, :data:`~.common.SMALL_ITEM_BYTES`).
A plain contiguous array is pickled as its buffer, dtype string and shape (:func:`_reduce_array`),
in a third of the time numpy's own reduction takes, which pickles the dtype object.

On plain tcp:// the inbox takes the socket from tornado after the handshake (``owned_socket``)
and reads this framing on its receive loop (``owned_tcp.receiving.FrameReader``); its credit then comes
back in this framing too, on the same socket, which the sender takes from tornado as well and
reads on a thread with a ``FrameReader`` of its own. On tls:// both directions stay on the
tornado stream.

**Bytes.** An item counts against a channel's capacity with :func:`payload_nbytes`, the sender's
number, used by both ends.

**The allocator.** glibc allocator settings for processes that move large messages.

Dask starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``.  Setting any glibc threshold turns
off glibc's dynamic mmap threshold, so every buffer of 128 KiB or more is a fresh ``mmap`` and
its ``munmap`` on free: a 512 KiB message costs 128 page faults on each side (docs/benchmarks.md
has what that costs a receive).  Small messages keep Dask's setting (it holds a
CartPole learner's process under its memory budget); the first large message a process
handles raises the thresholds, at run time through ``mallopt``, just enough for that size to
be served from the reused heap, with a trim threshold that keeps what a channel may hold in
flight mapped (its capacity, and a few buffers more): a lower one returns the heap to the system
each time a consumer catches up, and the next messages fault every page of it in again.
"""

from __future__ import annotations

import copyreg
import ctypes
import ctypes.util
import io
import pickle
import socket
import struct
import sys
import threading

import numpy as np
from dask.sizeof import sizeof

from tianji_dask.errors import ChannelError

MAGIC = b"TJQ1"
_PRELUDE = struct.Struct("<4sII")
_SIZE = struct.Struct("<Q")
PRELUDE_BYTES = _PRELUDE.size
SIZE_BYTES = _SIZE.size
MAX_HEADER_BYTES = 64 << 20
MAX_BUFFERS = 1 << 16
MAX_BUFFER_BYTES = 1 << 36
_MAX_IOV = 512  # pieces handed to one sendmsg, under the kernel's IOV_MAX of 1024
#: A rest of a piece at least this large, left by a partial ``sendmsg``, goes by ``sendall``,
#: whose loop over a full socket runs in C.
SENDALL_BYTES = 64 << 10


class WireError(ValueError):
    """Bytes that are not a message of this framing."""


def stream_of(comm, channel: str, address: str):
    """The tornado stream under ``comm`` (tcp:// and tls://), which the items go on; a
    ``ChannelError`` naming the channel for a comm without one (inproc://)."""
    stream = getattr(comm, "stream", None)
    if stream is None:
        raise ChannelError(
            f"queue channel {channel!r} at {address}: a {type(comm).__name__} comm has no stream; "
            "channels run over tcp:// or tls:// clusters"
        )
    return stream


def _array_from_buffer(buffer, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """The array :func:`_reduce_array` pickled: a view of ``buffer`` (the receiver's own)."""
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def _reduce_array(array: np.ndarray):
    dtype = array.dtype
    plain = dtype.fields is None and dtype.subdtype is None and not dtype.hasobject
    if not (plain and array.flags.c_contiguous and array.nbytes):
        return array.__reduce_ex__(5)
    data = array.reshape(-1).view(np.uint8) if dtype.kind in "mM" else array  # dates have no buffer format
    return _array_from_buffer, (pickle.PickleBuffer(data), dtype.str, array.shape)  # type: ignore[arg-type]


class _Pickler(pickle.Pickler):
    dispatch_table = {**copyreg.dispatch_table, np.ndarray: _reduce_array}  # exact type: subclasses keep theirs


def encode(msg: dict, *, out_of_band: bool) -> list[bytes | memoryview]:
    """``msg`` as the pieces to write in order: the prelude and header as one bytes object, then
    each out-of-band buffer as a view of the array it came from (no copy)."""
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=buffers.append if out_of_band else None).dump(msg)
    header = out.getvalue()
    views = [b.raw() for b in buffers]
    sizes = b"".join(_SIZE.pack(v.nbytes) for v in views)
    return [_PRELUDE.pack(MAGIC, len(header), len(views)) + sizes + header, *views]


def encode_whole(msg: dict) -> bytes:
    """``msg`` as one bytes object, everything inside its header: for credit, window and error
    messages, which carry no arrays."""
    return b"".join(encode(msg, out_of_band=False))


def send(sock: socket.socket, pieces: list[bytes | memoryview]) -> None:
    """Write ``pieces`` (from :func:`encode`: bytes and byte views) on a socket that a thread owns
    for writing, with as few system calls as the kernel allows: one ``sendmsg`` of all of them,
    which a blocking socket completes unless a signal interrupts it."""
    if len(pieces) <= _MAX_IOV:
        sent = sock.sendmsg(pieces)
        if sent == sum(map(len, pieces)):
            return
    else:
        sent = 0
    views = [memoryview(piece) for piece in pieces]
    while views:
        while sent and views:
            if sent >= views[0].nbytes:
                sent -= views.pop(0).nbytes
            else:
                views[0] = views[0][sent:]
                sent = 0
        while views and not views[0].nbytes:
            views.pop(0)
        if views and views[0].nbytes >= SENDALL_BYTES:
            sock.sendall(views.pop(0))
        if views:
            sent = sock.sendmsg(views[:_MAX_IOV])


async def read(stream) -> dict:
    """The next message from a tornado ``stream``. Raises :class:`WireError` for bytes of another
    framing or sizes out of bounds, ``StreamClosedError`` when the peer is gone."""
    header_bytes, n = check_prelude(await stream.read_bytes(_PRELUDE.size))
    sizes = check_sizes(await stream.read_bytes(_SIZE.size * n)) if n else []
    header = await stream.read_bytes(header_bytes)
    buffers = []
    for size in sizes:
        buffer = np.empty(size, dtype=np.uint8)  # not zero-filled: the stream fills it
        if size:
            await stream.read_into(buffer.data)
        buffers.append(buffer)
    return decode(header, buffers)


def check_prelude(prelude: bytes | bytearray) -> tuple[int, int]:
    magic, header_bytes, n = _PRELUDE.unpack(prelude)
    if magic != MAGIC:
        raise WireError(f"not a queue channel message (it starts {magic!r}, not {MAGIC!r})")
    if header_bytes > MAX_HEADER_BYTES or n > MAX_BUFFERS:
        raise WireError(f"a header of {header_bytes} bytes with {n} buffers is out of bounds")
    return header_bytes, n


def check_sizes(packed: bytes | bytearray) -> list[int]:
    sizes = [s for (s,) in _SIZE.iter_unpack(packed)]
    if any(s > MAX_BUFFER_BYTES for s in sizes):
        raise WireError(f"a buffer of {max(sizes)} bytes is out of bounds")
    return sizes


def decode(header: bytes | bytearray, buffers: list[np.ndarray]) -> dict:
    try:
        msg = pickle.loads(header, buffers=buffers)
    except Exception as exc:  # noqa: BLE001 - any failure means the bytes were not a message
        raise WireError(f"its header does not unpickle ({exc!r})") from None
    if not isinstance(msg, dict):
        raise WireError(f"its header unpickles to a {type(msg).__name__}, not a message dict")
    return msg


# ---------------------------------------------------------------------------- bytes
def payload_nbytes(payload: dict) -> int:
    """Bytes an item counts against channel capacity: array/tensor/buffer sizes, plus
    ``dask.sizeof`` of anything else.  Sender and receiver use the sender's number, so the
    credit accounting of both ends agrees exactly."""
    if not isinstance(payload, dict):
        raise TypeError(f"channel payloads are dicts, got {type(payload).__name__}")
    total = 0
    for value in payload.values():
        nbytes = getattr(value, "nbytes", None)  # numpy, torch (Tensor.nbytes), memoryview
        if isinstance(nbytes, int):
            total += nbytes
        elif isinstance(value, (bytes, bytearray)):
            total += len(value)
        else:
            total += int(sizeof(value))
    return total


# ---------------------------------------------------------------------------- the allocator
LARGE_MESSAGE_BYTES = 128 << 10  # glibc's default mmap threshold
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_KEEP_BUFFERS = 8  # the trim threshold lets this many buffers of the largest size stay mapped
_KEEP_MAX_BYTES = 512 << 20  # and at most this much in all

_lock = threading.Lock()
_mmap_threshold = 0  # what this module last set; 0 = untouched
_in_flight_fit = 0  # the most in-flight bytes the trim threshold was set for
_libc = None


def _mallopt():
    global _libc
    if _libc is None:
        if not sys.platform.startswith("linux"):
            _libc = False
        else:
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _libc = libc.mallopt if hasattr(libc, "mallopt") else False
            except OSError:
                _libc = False
    return _libc


def fit_allocator(nbytes: int, in_flight_bytes: int = 0) -> int:
    """Make buffers of ``nbytes`` come from the heap and keep ``in_flight_bytes`` (the channel's
    capacity) of freed heap mapped; returns the mmap threshold in force (0 when nothing was
    changed: small message, or not glibc).  Cheap after the first call."""
    if nbytes < LARGE_MESSAGE_BYTES or (nbytes <= _mmap_threshold // 2 and in_flight_bytes <= _in_flight_fit):
        return _mmap_threshold
    return _raise_thresholds(nbytes, in_flight_bytes)


def threshold_for(nbytes: int) -> int:
    """The mmap threshold that keeps buffers of ``nbytes`` on the heap: the next power of two
    at or above twice the size, at most glibc's ceiling (larger buffers stay mmapped)."""
    return min(_MMAP_THRESHOLD_MAX, 1 << (2 * nbytes - 1).bit_length())


def trim_threshold_for(mmap_threshold: int, in_flight_bytes: int) -> int:
    """Free heap kept mapped: what is in flight and a few of the largest buffers, within bounds."""
    return min(_KEEP_MAX_BYTES, in_flight_bytes + mmap_threshold * _KEEP_BUFFERS)


def _raise_thresholds(nbytes: int, in_flight_bytes: int) -> int:
    global _mmap_threshold, _in_flight_fit
    with _lock:
        want = max(threshold_for(nbytes), _mmap_threshold)
        in_flight = max(in_flight_bytes, _in_flight_fit)
        if want == _mmap_threshold and in_flight == _in_flight_fit:
            return _mmap_threshold
        mallopt = _mallopt()
        if not mallopt:
            return 0
        if mallopt(_M_MMAP_THRESHOLD, want) != 1:
            return _mmap_threshold
        mallopt(_M_TRIM_THRESHOLD, trim_threshold_for(want, in_flight))
        _mmap_threshold, _in_flight_fit = want, in_flight
        return want
