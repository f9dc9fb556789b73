"""Dask actors of the communication benchmark: simulated actors (producers) and buffers
(collectors), one per worker process, for each transport that is measured.

Channel transport (the project's data plane): ``ChannelProducer`` -> ``ChannelCollector``.
Loops run in a thread the host owns, as in ``tianji_dask.runtime.hosts.hosts``; the control methods are
``async def`` so they answer while the loop runs. Protocol, driven from the client::

    coll = client.submit(ChannelCollector, name, capacity, actor=True, workers=[w0]).result()
    done = coll.collect(n, n_senders, timeout)               # ActorFuture; resolves at the n-th item
    for p in producers: p.prepare(coll.address().result(), name, ...).result()   # connected
    for p in producers: p.go(start_at).result()              # all start at start_at (monotonic)
    res = done.result(); stats = [p.finish().result() for p in producers]; coll.finish().result()

Each producer's warm-up item opens its connection before the clock starts, and the collector
drains (discards) items after the n-th until ``finish`` so that no producer stays blocked on
credit. All times are ``time.monotonic()``, one system-wide clock on one machine.

Alternative transports, 1 sender: ``CallSender`` -> ``CallReceiver`` (Dask actor method calls,
``async def`` receiver, a window of calls in flight) and ``QueueProducer`` -> ``QueueCollector``
(``distributed.Queue`` put/get; every item passes through the scheduler).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import time

import numpy as np

from tianji_dask.channels import ChannelService, QueueSender

from .workload import process_cpu_s, sleep_until, timed_sample

_WARMUP_KEY = "warmup"


def message_array(size: int) -> np.ndarray:
    """The message: ``size`` bytes as a read-only uint8 array, made once and sent again and again,
    each time as a view of its own. Channels own what is pushed and must not see it mutated; a
    read-only array is never mutated, so reusing its memory is legal and keeps the producer's cost
    to the sampling step. A new view each time: the channel pickles a run of items in one pickle,
    whose memo would send one array object pushed several times once."""
    arr = np.frombuffer((bytes(range(256)) * (size // 256 + 1))[:size], dtype=np.uint8)
    assert not arr.flags.writeable
    return arr


def _threaded(target, *args) -> concurrent.futures.Future:
    """Run ``target(*args)`` in a new daemon thread; its result or exception in a Future."""
    fut: concurrent.futures.Future = concurrent.futures.Future()

    def main():
        try:
            fut.set_result(target(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
            fut.set_exception(exc)

    threading.Thread(target=main, daemon=True).start()
    return fut


class ChannelProducer:
    """A simulated actor: sample (sleep or spin), then ``QueueSender.push`` one message; repeat."""

    def __init__(self):
        from distributed import get_worker

        self._worker = get_worker()
        self._go = threading.Event()
        self._stop = threading.Event()
        self._start_at = 0.0
        self._ready: concurrent.futures.Future | None = None
        self._done: concurrent.futures.Future | None = None

    async def prepare(
        self,
        address: str,
        channel: str,
        sender_id: str,
        size: int,
        sample_mode: str,
        sample_time: float,
        capacity_bytes: int,
        timeout: float = 60.0,
    ) -> bool:
        """Start the loop thread, connect (one warm-up item), and return once connected."""
        self._ready = concurrent.futures.Future()
        self._done = _threaded(
            self._main, address, channel, sender_id, size, sample_mode, sample_time, capacity_bytes, timeout
        )
        await asyncio.wait_for(asyncio.wrap_future(self._ready), timeout)
        return True

    async def go(self, start_at: float) -> None:
        self._start_at = start_at
        self._go.set()

    async def finish(self) -> dict:
        """Stop the loop, flush and close the sender; the loop's measurements."""
        self._stop.set()
        self._go.set()
        return await asyncio.wrap_future(self._done)

    def _main(self, address, channel, sender_id, size, sample_mode, sample_time, capacity_bytes, timeout) -> dict:
        w = self._worker
        try:
            sender = QueueSender(
                address,
                channel,
                sender_id,
                capacity_bytes,
                loop=w.loop,
                connection_args=w.security.get_connection_args("worker"),
            )
            sender.push({_WARMUP_KEY: np.zeros(1, dtype=np.uint8)})
            deadline = time.monotonic() + timeout
            while sender.stats()["sent_items"] < 1:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{sender!r}: not connected within {timeout} s")
                time.sleep(0.001)
        except BaseException as exc:
            self._ready.set_exception(exc)
            raise
        self._ready.set_result(True)
        data = message_array(size)
        self._go.wait()
        sleep_until(self._start_at)
        blocked0 = sender.stats()["blocked_s"]
        sent = 0
        sample_wall = sample_cpu = push_wall = 0.0
        cpu0 = process_cpu_s()
        t_first = time.monotonic()
        while not self._stop.is_set():
            if sample_time > 0:
                wall, cpu = timed_sample(sample_mode, sample_time)
                sample_wall += wall
                sample_cpu += cpu
            t0 = time.perf_counter()
            sender.push({"data": data[:]})  # a new array object each time, as an actor's chunks are
            push_wall += time.perf_counter() - t0
            sent += 1
        cpu = process_cpu_s() - cpu0
        st = sender.stats()
        sender.close(timeout=30)
        return {
            "t_first": t_first,
            "sent": sent,
            "cpu_s": cpu,
            "sample_wall_s": sample_wall,
            "sample_cpu_s": sample_cpu,
            "push_wall_s": push_wall,
            "blocked_s": st["blocked_s"] - blocked0,
            "wire_messages": st["messages"] - 1,
            "errors": sender.stats()["errors"],
        }


class ChannelCollector:
    """A simulated buffer: one ``QueueInbox``; its loop takes items until it holds ``n``."""

    def __init__(self, channel: str, capacity_bytes: int):
        self._service = ChannelService.current()
        self._channel = channel
        self.inbox = self._service.open_queue(channel, capacity_bytes)
        self._stop = threading.Event()
        self._collected: concurrent.futures.Future | None = None
        self._done: concurrent.futures.Future | None = None

    async def address(self) -> str:
        return self._service.address

    async def collect(self, n: int, n_senders: int, timeout: float) -> dict:
        """Wait for one warm-up item per sender, then take items until ``n`` arrived; returns the
        monotonic time of the n-th and this process's CPU seconds spent receiving them."""
        self._collected = concurrent.futures.Future()
        self._done = _threaded(self._main, n, n_senders, timeout)
        return await asyncio.wrap_future(self._collected)

    async def finish(self) -> dict:
        """Stop draining, close the channel; the inbox's counters."""
        self._stop.set()
        drained = await asyncio.wrap_future(self._done)
        stats = self.inbox.stats()
        self._service.close(self._channel)
        return {"drained": drained, **stats}

    def _main(self, n, n_senders, timeout) -> int:
        inbox = self.inbox
        try:
            deadline = time.monotonic() + timeout
            warm = 0
            while warm < n_senders:
                for item in inbox.get(0.1):
                    if _WARMUP_KEY not in item.payload:
                        raise RuntimeError("a message arrived before the start")
                    warm += 1
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{warm} of {n_senders} senders connected within {timeout} s")
            cpu0 = process_cpu_s()
            count = 0
            while count < n:
                count += len(inbox.get(0.1))
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{count} of {n} messages within {timeout} s")
            t_n, cpu_n = time.monotonic(), process_cpu_s()
        except BaseException as exc:
            self._collected.set_exception(exc)
            raise
        self._collected.set_result({"t_n": t_n, "cpu_s": cpu_n - cpu0, "received": count})
        drained = 0
        while not self._stop.is_set():
            drained += len(inbox.get(0.05))
        return drained


class CallReceiver:
    """Receives messages as ``async def add`` actor calls (run on the worker's event loop)."""

    def __init__(self):
        self._n = 0
        self._count = 0
        self._done: asyncio.Event | None = None
        self._cpu0 = self._t_n = self._cpu_n = None

    async def start(self, n: int) -> None:
        self._n, self._count = n, 0
        self._done = asyncio.Event()
        self._cpu0 = process_cpu_s()

    async def add(self, msg: dict) -> None:
        self._count += 1
        if self._count == self._n:
            self._t_n, self._cpu_n = time.monotonic(), process_cpu_s()
            self._done.set()

    async def wait(self, timeout: float) -> dict:
        await asyncio.wait_for(self._done.wait(), timeout)
        return {"t_n": self._t_n, "cpu_s": self._cpu_n - self._cpu0, "received": self._count}


class CallSender:
    """Sends ``n`` messages as ``receiver.add(msg)`` actor calls, ``window`` calls in flight,
    from an ``async def`` loop (the fastest actor-call pattern measured in the Dask notes)."""

    async def send(self, receiver, n: int, size: int, window: int = 16) -> dict:
        data = message_array(size)

        async def call():
            await receiver.add({"data": data})

        pending: set = set()
        cpu0 = process_cpu_s()
        t_first = time.monotonic()
        for _ in range(n):
            if len(pending) >= window:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for d in done:
                    d.result()
            pending.add(asyncio.ensure_future(call()))
        for d in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(d, BaseException):
                raise d
        return {"t_first": t_first, "sent": n, "cpu_s": process_cpu_s() - cpu0}


async def _maybe_await(x):
    return await x if inspect.isawaitable(x) else x


class QueueProducer:
    """Puts ``n`` messages into a ``distributed.Queue``, one awaited put after another."""

    async def send(self, name: str, n: int, size: int) -> dict:
        from distributed import Queue, get_client

        q = Queue(name, client=get_client())
        data = message_array(size)
        cpu0 = process_cpu_s()
        t_first = time.monotonic()
        for _ in range(n):
            await _maybe_await(q.put(data))
        return {"t_first": t_first, "sent": n, "cpu_s": process_cpu_s() - cpu0}


class QueueCollector:
    """Gets ``n`` messages from a ``distributed.Queue``, one awaited get after another."""

    async def collect(self, name: str, n: int) -> dict:
        from distributed import Queue, get_client

        q = Queue(name, client=get_client())
        cpu0 = process_cpu_s()
        for _ in range(n):
            await _maybe_await(q.get())
        return {"t_n": time.monotonic(), "cpu_s": process_cpu_s() - cpu0, "received": n}
