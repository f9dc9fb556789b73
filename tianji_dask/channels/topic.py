"""Publishing end of a topic: one publisher to many subscribers, newest version wins.

Call protocol (in the learner's own thread, or on the event loop: nothing here blocks)::

    pub = TopicPublisher([(actor_worker_address, "params"), ...])
    pub.publish(version, {k: v.detach().cpu() for k, v in model.state_dict().items()})
    pub.add_subscriber(new_address, "params")   # a late subscriber gets the last version at once
    pub.remove_subscriber(old_address, "params")
    pub.close()

Per subscriber there is at most one pending version: publishing replaces a pending (not yet
written) older one, so a slow subscriber costs skipped versions, never memory.  Payload values
are numpy arrays or CPU torch tensors (zero-copy frames) plus small msgpack-able values; they
belong to the channel after ``publish`` and must not be mutated in place afterwards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket
import threading
import time
import uuid

from distributed.comm import connect
from distributed.protocol import to_serialize

from tianji_dask.errors import ChannelError

from .common import HANDLER_OP, LATEST_KIND, call_soon, logger, on_event_loop, resolve_loop
from .ports import TopicPublisherStats


class _Subscriber:
    __slots__ = ("address", "channel", "pending", "kick_scheduled", "wake", "future", "error", "reported", "sent")

    def __init__(self, address: str, channel: str):
        self.address = address
        self.channel = channel
        self.pending: tuple[int, dict] | None = None
        self.kick_scheduled = False
        self.wake: asyncio.Event | None = None
        self.future: concurrent.futures.Future[None] | None = None
        self.error: str | None = None
        self.reported = False
        self.sent = 0

    def label(self) -> str:
        return f"topic channel {self.channel!r} at {self.address}"


class TopicPublisher:
    """Pushes versioned payloads to subscribers' ``LatestInbox``es; ``publish`` never blocks.

    A subscriber whose connection fails is dropped (``stats()["errors"]``, ``["failed"]``) and the
    next ``publish`` raises one ChannelError naming it, after handing the version to the others;
    ``add_subscriber`` with the same pair reconnects it.
    """

    def __init__(
        self,
        subscribers: list[tuple[str, str]],
        loop=None,
        connection_args: dict | None = None,
        *,
        connect_timeout: float | None = None,
    ):
        self._loop, self._connection_args = resolve_loop(loop, connection_args)
        self._connect_timeout = connect_timeout
        self.publisher_id = f"publisher-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._lock = threading.Lock()
        self._subs: dict[tuple[str, str], _Subscriber] = {}
        self._last: tuple[int, dict] | None = None
        self._closing = False
        self._published = 0
        self._sent = 0
        self._conflated = 0
        self._errors = 0
        for address, channel in subscribers:
            self.add_subscriber(address, channel)

    def __repr__(self) -> str:
        return f"<TopicPublisher {self.publisher_id} to {len(self._subs)} subscribers>"

    # ------------------------------------------------------------------ caller's thread
    def add_subscriber(self, address: str, channel: str) -> None:
        """Connect a subscriber (no-op if it is already connected); it receives the last
        published version right away."""
        key = (address, channel)
        with self._lock:
            if self._closing:
                raise ChannelError(f"topic channel {channel!r} at {address}: publisher closed")
            old = self._subs.get(key)
            if old is not None and old.error is None:
                return
            sub = _Subscriber(address, channel)
            sub.pending = self._last
            self._subs[key] = sub
            try:
                sub.future = asyncio.run_coroutine_threadsafe(self._run(sub), self._loop)
            except RuntimeError as exc:
                sub.error = f"{sub.label()}: cannot start: {exc}"
                self._errors += 1

    def remove_subscriber(self, address: str, channel: str) -> None:
        """Stop publishing to a subscriber (one that is gone, or moved to another address);
        unknown pairs are ignored. Its connection is closed without a pending version."""
        with self._lock:
            sub = self._subs.pop((address, channel), None)
            if sub is None:
                return
            if sub.error is None:
                sub.error = f"{sub.label()}: removed"
                sub.pending = None
                sub.reported = True  # removed on purpose: not a failure to report
        if sub.wake is not None:
            call_soon(self._loop, sub.wake.set)

    def publish(self, version: int, payload: dict) -> None:
        """Make ``(version, payload)`` the newest version for every subscriber."""
        if not isinstance(payload, dict):
            raise TypeError(f"topic payloads are dicts, got {type(payload).__name__}")
        kicks = []
        failures = []
        with self._lock:
            if self._closing:
                raise ChannelError(f"{self!r} is closed")
            self._published += 1
            self._last = (int(version), payload)
            for sub in self._subs.values():
                if sub.error is not None:
                    if not sub.reported:
                        sub.reported = True
                        failures.append(sub.error)
                    continue
                if sub.pending is not None:
                    self._conflated += 1
                sub.pending = self._last
                if not sub.kick_scheduled:
                    sub.kick_scheduled = True
                    kicks.append(sub)
        for sub in kicks:
            if not call_soon(self._loop, self._kick, sub):
                self._fail(sub, "the event loop is closed (worker shutting down)")
        if failures:
            raise ChannelError("; ".join(failures))

    def stats(self) -> TopicPublisherStats:
        with self._lock:
            return {
                "published": self._published,
                "sent": self._sent,
                "conflated": self._conflated,
                "errors": self._errors,
                "subscribers": sum(1 for s in self._subs.values() if s.error is None),
                "failed": [s.error for s in self._subs.values() if s.error is not None],
            }

    def close(self, timeout: float = 5.0) -> None:
        """Write each subscriber's pending version (for at most ``timeout`` seconds in all),
        then close the comms.  Idempotent; from an event-loop thread it only starts closing."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            subs = list(self._subs.values())
        for sub in subs:
            call_soon(self._loop, self._kick, sub)
        if on_event_loop():
            return
        deadline = time.monotonic() + timeout
        for sub in subs:
            if sub.future is None:
                continue
            try:
                sub.future.result(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                sub.future.cancel()
                logger.warning("%s: close() timed out; pending version dropped", sub.label())
            except Exception:  # noqa: BLE001 - already recorded by _fail; close stays quiet by contract
                pass

    def _fail(self, sub: _Subscriber, reason) -> None:
        with self._lock:
            if sub.error is None:
                sub.error = str(reason) if isinstance(reason, ChannelError) else f"{sub.label()}: {reason}"
                sub.pending = None
                self._errors += 1
        if sub.wake is not None:
            call_soon(self._loop, sub.wake.set)

    # ------------------------------------------------------------------ event loop
    def _kick(self, sub: _Subscriber) -> None:
        if sub.wake is not None:
            sub.wake.set()

    async def _run(self, sub: _Subscriber) -> None:
        sub.wake = asyncio.Event()
        sub.wake.set()  # a version may be pending already
        comm = None
        watcher = None
        try:
            try:
                comm = await connect(sub.address, timeout=self._connect_timeout, **self._connection_args)
            except Exception as exc:
                raise ChannelError(f"{sub.label()}: cannot connect: {exc}") from exc
            await comm.write(
                {
                    "op": HANDLER_OP,
                    "reply": False,
                    "channel": sub.channel,
                    "sender": self.publisher_id,
                    "kind": LATEST_KIND,
                }
            )
            reply = await comm.read()
            if not (isinstance(reply, dict) and reply.get("ok")):
                reason = reply.get("error") if isinstance(reply, dict) else None
                raise ChannelError(f"{sub.label()}: refused: {reason or repr(reply)}")
            watcher = asyncio.create_task(self._watch(sub, comm))
            while True:
                await sub.wake.wait()
                sub.wake.clear()
                with self._lock:
                    item, sub.pending = sub.pending, None
                    sub.kick_scheduled = False
                    closing = self._closing
                    if sub.error is not None:
                        return
                if item is not None:
                    await comm.write({"version": item[0], "payload": to_serialize(item[1])})
                    with self._lock:
                        sub.sent += 1
                        self._sent += 1
                    sub.wake.set()  # re-check: a newer version may have come during the write
                elif closing:
                    break
            watcher.cancel()
            await comm.write({"bye": True})
            await comm.close()
        except asyncio.CancelledError:
            self._fail(sub, "closed before the pending version was written")
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the writer is the subscriber's error
            self._fail(sub, exc if isinstance(exc, ChannelError) else f"connection lost: {exc!r}")
        finally:
            if watcher is not None:
                watcher.cancel()
            if comm is not None and not comm.closed():
                comm.abort()

    async def _watch(self, sub: _Subscriber, comm) -> None:
        """Subscribers only write to report a closed channel; EOF means they are gone."""
        try:
            msg = await comm.read()
            reason = msg.get("error") if isinstance(msg, dict) else repr(msg)
            self._fail(sub, f"subscriber closed the connection: {reason}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the watcher is the subscriber's error
            self._fail(sub, f"connection lost (subscribing worker gone?): {exc!r}")
