"""Pieces shared by every channel module: byte accounting, the wire constants, the event-loop
helpers and the newest-version slot."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from dask.sizeof import sizeof

logger = logging.getLogger("tianji_dask.channels")

#: ``worker.handlers`` key the channel service answers on.
HANDLER_OP = "tianji_channel"
QUEUE_KIND = "queue"
LATEST_KIND = "latest"
FULL_POLICIES = ("wait", "drop_oldest")
# A run of items smaller than this travels inside one pickle (``wire``): copying this much costs
# less than handing each item's arrays to the socket as buffers of their own.
SMALL_ITEM_BYTES = 64 << 10
BYE_TIMEOUT_S = 60.0  # how long a closing sender waits for the receiver to read its last messages


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


def on_event_loop() -> bool:
    """True when called from a thread that is running an asyncio loop, where blocking would
    stall every coroutine of that loop (the worker's comms included)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def resolve_loop(loop: Any, connection_args: dict | None) -> tuple[asyncio.AbstractEventLoop, dict]:
    """Fill in the defaults of the sending classes: the current Dask worker's asyncio loop and
    its worker-role connection arguments (TLS context included).  Outside a worker, ``loop``
    is required and the connection arguments default to none (plain tcp://)."""
    worker = None
    if loop is None or connection_args is None:
        from distributed import get_worker

        try:
            worker = get_worker()
        except ValueError:
            if loop is None:
                raise ValueError(
                    "no Dask worker in this context: pass loop= (an asyncio loop running in "
                    "another thread) and connection_args="
                ) from None
    if loop is None:
        assert worker is not None  # found above, or the ValueError was raised
        loop = worker.loop
    loop = getattr(loop, "asyncio_loop", loop)  # accept a tornado IOLoop too
    if connection_args is None:
        connection_args = worker.security.get_connection_args("worker") if worker else {}
    return loop, dict(connection_args)


def call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> bool:
    """``loop.call_soon_threadsafe`` that reports a closed loop (worker shutting down) as
    False instead of raising in the caller's thread."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        return False
    return True


def finish_soon(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
    """From any thread: mark ``future`` (of ``loop``) done, unless it is already (a thread's end
    that the event loop awaits)."""

    def finish() -> None:
        if not future.done():
            future.set_result(None)

    call_soon(loop, finish)


class LatestSlot:
    """The newest-version-wins slot behind both ``LatestInbox`` and ``LocalSubscription``.

    ``offer(version, payload)`` from the delivering side (a version not newer than the one
    held is counted ``stale`` and ignored); ``probe()`` from the consuming thread returns the
    newest version once and then drops the payload. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._version: int | None = None  # newest arrived
        self._payload: dict | None = None  # held only until probed
        self._fresh = False
        self._probed_version: int | None = None
        self._received = 0
        self._replaced = 0
        self._stale = 0

    def offer(self, version: int, payload: dict) -> bool:
        """Store a version; True when it replaced an unprobed one (conflation)."""
        with self._lock:
            self._received += 1
            if self._version is not None and version <= self._version:
                self._stale += 1
                return False
            replaced = self._fresh
            self._replaced += replaced
            self._version, self._payload, self._fresh = version, payload, True
            return replaced

    def probe(self) -> tuple[int, dict] | None:
        with self._lock:
            if not self._fresh:
                return None
            self._fresh = False
            self._probed_version = self._version
            payload, self._payload = self._payload, None
            assert self._version is not None and payload is not None  # fresh: a version was offered
            return self._version, payload

    def clear(self) -> None:
        with self._lock:
            self._fresh = False
            self._payload = None

    def stats(self) -> dict:
        with self._lock:
            return {
                "received": self._received,
                "replaced": self._replaced,
                "version": self._version,
                "probed_version": self._probed_version,
                "stale": self._stale,
            }
