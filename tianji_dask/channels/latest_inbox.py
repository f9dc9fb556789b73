"""Receiving end of a topic subscription: keeps only the newest version.

Call protocol (in the subscribing role's loop, once per step)::

    inbox = ChannelService.current().open_latest("params")
    # hand ChannelService.current().address and "params" to the publisher (add_subscriber)
    got = inbox.probe()                 # never blocks
    if got is not None:
        version, state = got            # newer than anything probed before

Wire protocol on each publisher's comm::

    publisher  -> {"op": "tianji_channel", "reply": False, "channel", "sender", "kind": "latest"}
    subscriber -> {"ok": True}  or  {"error": text}
    publisher  -> {"version": int, "payload": dict}   (repeated)
    publisher  -> {"bye": True}, then closes
    subscriber -> {"error": text}   only when the channel is closed here
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from distributed.comm import CommClosedError

from tianji_dask.errors import ChannelError

from .common import call_soon, logger

CLOSE_DRAIN_S = 10.0  # how long the publishers may read the close error before their comms are cut


class LatestInbox:
    """Receiver side of a topic; create it with ``ChannelService.open_latest``.

    Several publishers may feed one inbox; the highest version wins and an older version that
    arrives late is ignored (``stats()["stale"]``)."""

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop, address: str):
        self.name = name
        self.address = address
        self._loop = loop
        self._slot = LatestSlot()
        self._closed = False
        self._comms: set = set()
        self._background: set = set()

    def __repr__(self) -> str:
        return f"<LatestInbox {self.name!r} at {self.address}>"

    def probe(self) -> tuple[int, dict] | None:
        """(version, payload) if a version newer than the last probed one arrived, else None."""
        return self._slot.probe()

    def stats(self) -> dict:
        return {**self._slot.stats(), "publishers": len(self._comms), "closed": self._closed}

    def _store(self, version: int, payload: dict) -> None:
        self._slot.offer(version, payload)

    def _close(self) -> None:
        """Called by ChannelService.close: tell every publisher, then cut them off."""
        self._closed = True
        self._slot.clear()
        call_soon(self._loop, self._start_notify)

    # ------------------------------------------------------------------ event loop
    def _start_notify(self) -> None:
        task = asyncio.ensure_future(self._notify_closed())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _notify_closed(self) -> None:
        text = f"topic channel {self.name!r} at {self.address} was closed by the subscriber"
        comms = list(self._comms)
        for comm in comms:
            with contextlib.suppress(Exception):  # best effort: the publisher may be gone already
                await asyncio.wait_for(comm.write({"error": text}), 5)
        # Readers keep draining so the error is not lost to a reset; stragglers are cut off.
        await asyncio.sleep(CLOSE_DRAIN_S)
        for comm in comms:
            comm.abort()

    async def serve(self, comm, sender: str) -> None:
        """Read one publisher's versions until it leaves; called by the service's handler."""
        if self._closed:
            raise ChannelError(f"topic channel {self.name!r} at {self.address} is closed")
        self._comms.add(comm)  # before the reply, so a concurrent close() still reaches it
        try:
            await comm.write({"ok": True})
            while True:
                try:
                    msg = await comm.read()
                except (CommClosedError, OSError):
                    return
                except Exception as exc:  # noqa: BLE001 - undecodable frames: the stream can't be trusted
                    problem = f"cannot decode a message: {exc!r}"
                    break
                if isinstance(msg, dict) and msg.get("bye"):
                    return
                if (
                    not isinstance(msg, dict)
                    or not isinstance(msg.get("version"), int)
                    or not isinstance(msg.get("payload"), dict)
                ):
                    problem = f"expected {{'version': int, 'payload': dict}}, got {msg!r:.120}"
                    break
                if not self._closed:
                    self._store(msg["version"], msg["payload"])
            problem = f"topic channel {self.name!r} at {self.address}: {problem}"
            logger.error("%s (publisher %r from %s); closing its connection", problem, sender, comm.peer_address)
            with contextlib.suppress(Exception):  # best effort: the publisher may be gone already
                await asyncio.wait_for(comm.write({"error": problem}), 5)
        finally:
            self._comms.discard(comm)
            if not comm.closed():
                await comm.close()


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
