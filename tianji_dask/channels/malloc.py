"""glibc allocator settings for processes that move large messages.

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

import ctypes
import ctypes.util
import sys
import threading

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
