"""Pieces shared by every channel module: the wire constants and the event-loop helpers."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

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
