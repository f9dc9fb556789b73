"""Channel layer tests: in-process twins as unit tests, the remote channels on real clusters.

Receivers run as small Dask actors (their sync methods block the worker's actor thread, not
its event loop), senders and publishers as plain tasks or actors on other workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import select
import socket
import struct
import sys
import threading
import time
import zlib

import cloudpickle
import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster, Security
from distributed.comm import connect

from tianji_dask.channels import (
    ChannelPlugin,
    ChannelService,
    LocalQueue,
    LocalTopic,
    QueueSender,
    TopicPublisher,
    wire,
)
from tianji_dask.channels.owned_tcp import owned_socket
from tianji_dask.channels.owned_tcp.receiving import (
    ARRAY_WAIT_S,
    BUFFER_BYTES,
    FILL_AFTER_LARGE_BYTES,
    STRAIGHT_BYTES,
    FrameReader,
    QueueLink,
    ReceiveLoop,
)
from tianji_dask.channels.ports import Item
from tianji_dask.errors import ChannelError
from tianji_dask.runtime.cluster.workers import scheduler_workers

# Workers cannot import this test module: ship its helpers by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KIB = 1024


# ---------------------------------------------------------------------------- helpers
def make_payload(sender: str, seq: int, nbytes: int) -> dict:
    """Deterministic item of about ``nbytes`` bytes: mixed dtypes, shapes and a strided view."""
    rng = np.random.default_rng([zlib.crc32(sender.encode()), seq])
    n = max(1, nbytes // 4 - 16)
    return {
        "obs": rng.standard_normal(n, dtype=np.float32),
        "act": rng.integers(0, 1 << 40, size=(2, 3), dtype=np.int64),
        "done": np.array([seq % 2 == 0, True]),
        "seq": np.array([seq], dtype=np.uint32),
    }


def payload_matches(item: Item) -> bool:
    want = make_payload(item.sender, item.seq, 4 * (len(item.payload["obs"]) + 16))
    got = item.payload
    return set(got) == set(want) and all(
        got[k].dtype == want[k].dtype and got[k].shape == want[k].shape and np.array_equal(got[k], want[k])
        for k in want
    )


class Receiver:
    """Actor that owns one queue inbox on its worker."""

    def __init__(self, name: str, capacity_bytes: int):
        self.name = name
        self.service = ChannelService.current()
        self.inbox = self.service.open_queue(name, capacity_bytes)

    async def address(self) -> str:
        return self.service.address

    async def stats(self) -> dict:
        return self.inbox.stats()

    async def link_threads(self) -> list[str]:
        """Names of the threads serving owned sender sockets in this worker (``queue_link``)."""
        return sorted(t.name for t in threading.enumerate() if t.name.startswith("tianji-queue-"))

    def drain(self, target=None, delay=0.0, idle=None, timeout=30.0) -> dict:
        """Take items until ``target`` items arrived, or nothing came for ``idle`` seconds.
        ``delay`` > 0 makes a slow consumer (one item per ``delay`` seconds)."""
        got, bad, over = [], [], []
        cap = self.inbox.capacity_bytes
        start = last = time.monotonic()
        while time.monotonic() - start < timeout:
            queued = self.inbox.stats()["queued_bytes"]
            if queued > cap:
                over.append(queued)
            items = self.inbox.get(0.05, max_items=1 if delay else None)
            for item in items:
                got.append((item.sender, item.seq, item.nbytes))
                if not payload_matches(item):
                    bad.append((item.sender, item.seq))
            if items:
                last = time.monotonic()
                if delay:
                    time.sleep(delay)
            if target is not None and len(got) >= target:
                break
            if idle is not None and time.monotonic() - last > idle:
                break
        return {"got": got, "bad": bad, "over": over, "stats": self.inbox.stats()}

    def take(self, n: int) -> int:
        """Take up to ``n`` queued items (waiting up to 5 s for the first); how many."""
        return len(self.inbox.get(5.0, max_items=n))

    def close_channel(self) -> None:
        self.service.close(self.name)


class Pusher:
    """Actor that keeps one QueueSender across calls."""

    def __init__(self, address, channel, sender_id, capacity_bytes, **kw):
        self.sender = QueueSender(address, channel, sender_id, capacity_bytes, **kw)
        self.seq = 0

    def push(self, n: int, nbytes: int) -> list:
        out = []
        for _ in range(n):
            out.append(self.sender.push(make_payload(self.sender.sender_id, self.seq, nbytes)))
            self.seq += 1
        return out

    def push_until_error(self, nbytes: int, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.sender.push(make_payload(self.sender.sender_id, self.seq, nbytes))
            except ChannelError as exc:
                return str(exc)
            self.seq += 1
            time.sleep(0.02)
        return ""

    async def stats(self) -> dict:
        return self.sender.stats()

    def close(self) -> None:
        self.sender.close(timeout=10)

    async def send_threads(self) -> list[str]:
        """Names of the threads serving owned connections in this worker: writing items, reading
        credit."""
        return sorted(t.name for t in threading.enumerate() if t.name.startswith("tianji-channel-"))


class Subscriber:
    """Actor that owns one latest-version inbox."""

    def __init__(self, name: str):
        self.service = ChannelService.current()
        self.inbox = self.service.open_latest(name)

    async def address(self) -> str:
        return self.service.address

    def watch(self, last_version: int, timeout: float) -> dict:
        seen, bad = [], []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.inbox.probe()
            if got is None:
                time.sleep(0.002)
                continue
            version, payload = got
            seen.append(version)
            if not (
                np.all(payload["w"] == version)
                and payload["version"] == version
                and isinstance(payload["t"], torch.Tensor)
                and bool((payload["t"] == version).all())
            ):
                bad.append(version)
            if version == last_version:
                break
        return {"seen": seen, "bad": bad, "stats": self.inbox.stats()}


def set_credit_linger(seconds: float) -> float:
    """Set this worker's ``receiving.CREDIT_LINGER_S``; returns the value it had."""
    from tianji_dask.channels.owned_tcp import receiving

    old, receiving.CREDIT_LINGER_S = receiving.CREDIT_LINGER_S, seconds
    return old


def send_items(address, channel, sender_id, n, nbytes, capacity, policy="wait", batch=1 << 20):
    sender = QueueSender(address, channel, sender_id, capacity, full_policy=policy, max_batch_bytes=batch)
    sizes = nbytes if isinstance(nbytes, list) else [nbytes] * n
    accepted = [sender.push(make_payload(sender_id, i, sizes[i])) for i in range(n)]
    sender.close(timeout=30)
    return accepted, sender.stats()


def publish_versions(subscribers, n, nbytes, connect_timeout=None, pause=0.0):
    pub = TopicPublisher([tuple(s) for s in subscribers], connect_timeout=connect_timeout)
    errors = []
    for v in range(n):
        payload = {
            "w": np.full(nbytes // 8, v, dtype=np.float64),
            "t": torch.full((16,), float(v)),
            "version": v,
        }
        try:
            pub.publish(v, payload)
        except ChannelError as exc:
            errors.append(str(exc))
        if pause:
            time.sleep(pause)
    pub.close(timeout=30)
    return pub.stats(), errors


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def check_order(got, senders):
    """Per sender, sequence numbers strictly increase."""
    for s in senders:
        seqs = [seq for sender, seq, _ in got if sender == s]
        assert seqs == sorted(set(seqs)), f"sender {s}: out of order or duplicated: {seqs[:20]}"


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        c.register_plugin(ChannelPlugin())
        yield c


@pytest.fixture
def workers(client):
    client.wait_for_workers(3, timeout=60)
    return sorted(scheduler_workers(client))


def actor(client, cls, worker, *args, **kw):
    return client.submit(cls, *args, actor=True, workers=[worker], **kw).result(timeout=30)


# ---------------------------------------------------------------------------- local twins
def test_local_queue_order_capacity_and_gaps():
    q = LocalQueue(capacity_bytes=10 * KIB, full_policy="drop_oldest")
    sizes = []
    for i in range(10):
        assert q.push({"x": np.full(KIB // 8, i, dtype=np.int64)}) is True
        sizes.append(KIB)
    items = q.poll(max_items=3)
    assert [it.seq for it in items] == [0, 1, 2] and items[0].sender == "local"
    assert all(np.all(it.payload["x"] == it.seq) for it in items)
    for i in range(10, 20):  # 7 queued + 10 new in 10 KiB: the 7 oldest go
        q.push({"x": np.full(KIB // 8, i, dtype=np.int64)})
    st = q.stats()
    assert st["dropped"] == 7 and st["queued_bytes"] == 10 * KIB and st["max_queued_bytes"] <= 10 * KIB
    rest = q.get(timeout=1)
    assert [it.seq for it in rest] == list(range(10, 20))
    st = q.stats()
    assert st["seq_gaps"] == 7 and st["received_items"] == 13 and st["queued_items"] == 0
    with pytest.raises(ValueError, match="10241 bytes exceeds capacity_bytes=10240"):
        q.push({"x": np.zeros(10 * KIB + 1, dtype=np.uint8)})
    assert q.get(timeout=0.05) == []
    q.close()
    with pytest.raises(ChannelError):
        q.push({"x": np.zeros(1)})


def test_local_topic_conflation():
    topic = LocalTopic()
    a = topic.subscribe()
    assert a.probe() is None
    topic.publish(1, {"v": 1})
    topic.publish(2, {"v": 2})
    b = topic.subscribe()  # a late subscriber sees the last version at once
    assert a.probe() == (2, {"v": 2}) and a.probe() is None
    assert b.probe() == (2, {"v": 2})
    topic.publish(1, {"v": 1})  # older than what was seen: ignored
    assert a.probe() is None and a.stats()["stale"] == 1
    topic.publish(5, {"v": 5})
    assert a.probe()[0] == 5 and b.probe()[0] == 5
    assert a.stats()["replaced"] == 1 and topic.stats()["conflated"] == 1
    assert topic.stats()["published"] == 4


# ---------------------------------------------------------------------------- queues
@pytest.mark.integration
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "nbytes",
    [20 * KIB, 96 * KIB, [20 * KIB if i // 3 % 2 else 96 * KIB for i in range(60)]],
    ids=["small-pickled", "large-frames", "runs-of-each"],
)
def test_queue_order_and_payload_integrity(client, workers, nbytes):
    """Items below SMALL_ITEM_BYTES travel as one pickle a message, larger ones as frames: both
    in order, whole, and counted alike, also where runs of each follow each other."""
    name = f"q-order-{nbytes if isinstance(nbytes, int) else 'mixed'}"
    recv = actor(client, Receiver, workers[0], name, 8 << 20)
    addr = recv.address().result()
    assert addr == workers[0]
    # Small batches so the 60 items travel in many messages of one or several items each.
    fut = client.submit(
        send_items,
        addr,
        name,
        "s0",
        60,
        nbytes,
        1 << 20,
        batch=64 * KIB,
        workers=[workers[1]],
        pure=False,
    )
    out = recv.drain(target=60, timeout=40).result()
    accepted, sstats = fut.result(timeout=40)
    assert all(accepted)
    assert out["bad"] == [] and out["over"] == []
    assert [seq for _, seq, _ in out["got"]] == list(range(60))
    st = out["stats"]
    assert st["received_items"] == 60 and st["seq_gaps"] == 0 and st["senders"] == {"s0": 60}
    assert st["received_bytes"] == sstats["sent_bytes"] == sum(nb for *_, nb in out["got"])
    assert sstats["sent_items"] == 60 and 60 >= sstats["messages"] > 1
    assert sstats["errors"] == 0  # outstanding_bytes may stay > 0: close() does not wait for credit
    recv.close_channel().result()


def test_a_large_items_arrays_go_to_the_socket_as_they_are_and_a_small_runs_inside_the_header():
    big = {"obs": np.arange(96 * KIB, dtype=np.uint8), "t": 3}
    prelude_and_header, *buffers = wire.encode({"items": [(0, 96 * KIB, big)]}, out_of_band=True)
    assert len(buffers) == 1 and np.shares_memory(np.asarray(buffers[0]), big["obs"])  # no copy
    assert prelude_and_header.startswith(wire.MAGIC) and len(prelude_and_header) < 1024
    small = [(i, 100, {"obs": np.full(100, i, dtype=np.uint8)}) for i in range(50)]
    [one] = wire.encode({"items": small}, out_of_band=False)
    assert len(one) > 50 * 100


@pytest.mark.parametrize("out_of_band", [True, False])
def test_arrays_of_every_kind_come_out_of_the_framing_equal_with_dtype_shape_and_writability(out_of_band):
    arrays = {
        "f4_2d": np.arange(12, dtype=np.float32).reshape(3, 4),
        "big_endian": np.arange(5, dtype=">i8"),
        "datetime": np.array(["2026-12-03T07:00", "2026-12-04T08:30"], dtype="datetime64[ns]"),
        "unicode": np.array(["pong", "cartpole"]),
        "scalar": np.array(3.5),
        "empty": np.zeros((0, 4), np.int16),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
        "strided": np.arange(20, dtype=np.int64)[::3],
        "structured": np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]),
        "objects": np.array([{"x": 1}, None], dtype=object),
        "read_only": np.frombuffer(bytes(range(16)), dtype=np.uint8),
    }
    masked = np.ma.masked_array([1, 2, 3], mask=[0, 1, 0])
    prelude_and_header, *buffers = wire.encode(
        {"items": [(0, 1, {**arrays, "masked": masked})]}, out_of_band=out_of_band
    )
    header = prelude_and_header[wire.PRELUDE_BYTES + wire.SIZE_BYTES * len(buffers) :]
    received = [np.frombuffer(bytes(b), dtype=np.uint8).copy() for b in buffers]  # as the reader makes them
    [(_, _, got)] = wire.decode(header, received)["items"]
    for name, sent in arrays.items():
        assert got[name].dtype == sent.dtype and got[name].shape == sent.shape, name
        assert np.array_equal(got[name], sent) if name != "objects" else list(got[name]) == list(sent), name
    assert got["f4_2d"].flags.writeable and got["f4_2d"].flags.c_contiguous
    assert not got["read_only"].flags.writeable  # as pickle keeps it
    assert isinstance(got["masked"], np.ma.MaskedArray) and got["masked"].mask.tolist() == [False, True, False]


def read_messages(sock: socket.socket, n: int, timeout: float = 10.0) -> list[dict]:
    """The next ``n`` messages of the channel's framing on ``sock``, read as the receive loop
    reads them (``FrameReader``), waiting for the socket with ``select``."""
    reader, got = FrameReader(sock), []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"{len(got)} of {n} messages within {timeout} s"
        select.select([sock], [], [], remaining)
        got += reader.pump()
    return got


def send_and_wait_until_held(a: socket.socket, b: socket.socket, data: bytes) -> None:
    """Send ``data`` on ``a`` and return once all of it waits in ``b``, unread."""
    a.sendall(data)
    while len(b.recv(len(data), socket.MSG_PEEK)) < len(data):
        time.sleep(0.01)


def test_frame_reader_fills_little_after_a_large_array_so_the_next_payload_is_not_copied_twice():
    a, b = socket.socketpair()
    with a, b:
        reader = FrameReader(b, buffer_bytes=4 * FILL_AFTER_LARGE_BYTES)
        large = {
            "items": [(0, 8 * FILL_AFTER_LARGE_BYTES, {"x": np.arange(8 * FILL_AFTER_LARGE_BYTES, dtype=np.uint8)})]
        }
        message = b"".join(bytes(piece) for piece in wire.encode(large, out_of_band=True))
        send_and_wait_until_held(a, b, message * 2)  # a fill then takes all it asks for
        assert reader.pump(max_bytes=1) == [] and reader.buffered == 4 * FILL_AFTER_LARGE_BYTES  # a whole buffer
        [first] = reader.pump(max_bytes=len(message) - 4 * FILL_AFTER_LARGE_BYTES + 1)
        assert np.array_equal(first["items"][0][2]["x"], large["items"][0][2]["x"])
        assert reader.buffered == FILL_AFTER_LARGE_BYTES  # the next prelude, not a buffer's worth of payload
        [second] = reader.pump()
        assert np.array_equal(second["items"][0][2]["x"], large["items"][0][2]["x"])


def test_frame_reader_receives_a_rest_over_straight_bytes_into_its_array_even_under_a_buffers_size():
    size = 48 * KIB
    assert STRAIGHT_BYTES < size < BUFFER_BYTES
    a, b = socket.socketpair()
    with a, b:
        reader = FrameReader(b)
        item = {"items": [(0, size, {"x": np.arange(size, dtype=np.uint8)})]}
        message = b"".join(bytes(piece) for piece in wire.encode(item, out_of_band=True))
        send_and_wait_until_held(a, b, message * 3)
        assert reader.pump(max_bytes=1) == [] and reader.buffered == BUFFER_BYTES
        # the first message from the buffer, the second's rest in one read straight into its array
        assert len(reader.pump(max_bytes=1)) == 2 and reader.buffered == 0
        assert reader.pump(max_bytes=1) == [] and reader.buffered == FILL_AFTER_LARGE_BYTES
        [third] = reader.pump()
        assert np.array_equal(third["items"][0][2]["x"], item["items"][0][2]["x"])


def large_message_cut(size: int, held: int) -> tuple[dict, bytes, bytes]:
    """A message of one ``size``-byte array, its bytes cut after the header and ``held`` bytes
    of the array: (message, first part, rest)."""
    msg = {"items": [(0, size, {"x": np.arange(size, dtype=np.uint8)})]}
    data = b"".join(bytes(piece) for piece in wire.encode(msg, out_of_band=True))
    cut = len(data) - size + held
    return msg, data[:cut], data[cut:]


def test_frame_reader_told_to_wait_receives_an_arrays_rest_inside_one_call_and_otherwise_never_waits():
    msg, first, rest = large_message_cut(256 * KIB, held=8 * KIB)
    a, b = socket.socketpair()
    with a, b:
        reader = FrameReader(b, array_wait_s=30)
        send_and_wait_until_held(a, b, first)
        assert reader.pump() == []  # not told to wait: what the socket holds, then back
        half = len(rest) // 2
        sender = threading.Thread(target=lambda: (a.sendall(rest[:half]), time.sleep(0.1), a.sendall(rest[half:])))
        sender.start()
        [got] = reader.pump(wait_for_arrays=True)  # the rest came while it waited
        sender.join()
        assert np.array_equal(got["items"][0][2]["x"], msg["items"][0][2]["x"])


def test_receive_loop_waiting_for_a_stopped_senders_array_reads_a_connection_added_meanwhile():
    """A thread alone with its connection waits inside recv for the rest of an array; a sender
    stopped halfway (a suspended job) holds a connection added to that thread meanwhile up by
    at most ARRAY_WAIT_S a turn, never until the stopped one goes on."""
    loop, messages, ends = ReceiveLoop("wait", threads=1), queue.Queue(), queue.Queue()
    msg, first, rest = large_message_cut(1024 * KIB, held=64 * KIB)
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    with a, b, c, d:
        loop.add(b, messages.put, lambda end: ends.put(end))
        a.sendall(first)  # and stops halfway through its array
        time.sleep(0.2)  # the thread is inside its waiting recv by now
        loop.add(d, messages.put, lambda end: ends.put(end))
        c.sendall(wire.encode_whole({"credit": 7}))
        assert messages.get(timeout=20 * ARRAY_WAIT_S + 2) == {"credit": 7}
        a.sendall(rest)
        got = messages.get(timeout=5)
        assert np.array_equal(got["items"][0][2]["x"], msg["items"][0][2]["x"])
        for sock in (a, c):
            sock.sendall(wire.encode_whole({"bye": True}))
        assert [ends.get(timeout=5), ends.get(timeout=5)] == [None, None]


def test_credit_sent_from_the_consumers_thread_never_blocks_and_arrives_whole_when_the_socket_fills():
    async def main():
        with socket.create_server(("127.0.0.1", 0)) as server:  # TCP: a full socket takes part of a message
            a = socket.create_connection(server.getsockname())
            b, _ = server.accept()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * KIB)
        wake = threading.Event()
        link = QueueLink(
            a, asyncio.get_running_loop(), wake, lambda msg: None, lambda force: ({}, False), "t", ReceiveLoop("t")
        )
        link.start({"window": 1})
        assert read_messages(b, 1) == [{"window": 1}]
        accepted, refused, credit = [], 0, 0
        deadline = time.monotonic() + 10
        while refused < 100 and time.monotonic() < deadline:  # the peer reads nothing: it fills
            credit += 1
            if link.send_now({"credit": credit}):
                accepted.append(credit)
            elif accepted:  # refused (the writer may still hold the socket at first): kept by the caller
                refused += 1
        assert refused == 100 and len(accepted) > 10  # none of the calls waited for the peer
        got = [msg["credit"] for msg in read_messages(b, len(accepted))]  # the writer finishes a begun one
        assert got == accepted
        b.shutdown(socket.SHUT_WR)
        assert isinstance(await link.reading_ended(), ConnectionError)
        await link.close()
        b.close()

    asyncio.run(main())


def test_frame_reader_resumes_messages_cut_anywhere_and_never_waits():
    messages = [
        {"items": [(0, 100, {"x": np.full(100, 7, dtype=np.uint8)})] * 30},  # small items, one pickle
        {"items": [(1, 96 * KIB, {"obs": np.arange(96 * KIB, dtype=np.uint8), "t": 1})]},
        {"items": [(2, 8, {"a": np.ones(4, np.uint8), "b": np.zeros(0, np.uint8)})]},  # an empty buffer
        {"credit": 5},
        {"items": [(i, 70 * KIB, {"v": np.full(70 * KIB, i, dtype=np.uint8)}) for i in range(3, 5)]},
    ]
    stream = b"".join(
        bytes(piece) for m in messages for piece in wire.encode(m, out_of_band="items" in m and m is not messages[0])
    )
    a, b = socket.socketpair()
    with a, b:
        reader = FrameReader(b, buffer_bytes=16 * KIB)
        got: list[dict] = []
        assert reader.pump() == []  # nothing there: no wait
        cuts = [1, 3, 12, 13, 40, 700, 5000, 20 * KIB, 7, 100 * KIB, 1, 64 * KIB]
        at = 0
        for i in range(10_000):
            if at >= len(stream):
                break
            n = cuts[i % len(cuts)]
            a.sendall(stream[at : at + n])
            at += n
            got += reader.pump()
        assert reader.pump() == [] and len(got) == len(messages)
        for sent, received in zip(messages, got, strict=True):
            assert sent.keys() == received.keys()
            if "credit" in sent:
                assert received == sent
                continue
            for (seq, nb, p), (rseq, rnb, rp) in zip(sent["items"], received["items"], strict=True):
                assert (seq, nb) == (rseq, rnb) and p.keys() == rp.keys()
                assert all(np.array_equal(p[k], rp[k]) for k in p if isinstance(p[k], np.ndarray))
        a.sendall(b"XXXX" + bytes(8))  # bytes of no framing
        with pytest.raises(wire.WireError, match="not a queue channel message"):
            reader.pump()
    a, b = socket.socketpair()
    with a, b:
        reader = FrameReader(b, buffer_bytes=16 * KIB)
        a.sendall(stream[: len(stream) // 2])
        a.close()
        with pytest.raises(ConnectionError, match="closed"):
            while True:
                reader.pump()


def test_receive_loop_reads_its_sockets_on_one_thread_that_ends_with_the_last_one():
    loop, messages, ends = ReceiveLoop("t", threads=1), queue.Queue(), queue.Queue()
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    with a, c, d:
        b.close()
        loop.add(b, messages.put, lambda end: ends.put(("b", end)))  # closed before it is read
        loop.add(d, messages.put, lambda end: ends.put(("d", end)))
        name, end = ends.get(timeout=5)
        assert name == "b" and isinstance(end, ConnectionError)
        for credit in range(3):
            c.sendall(wire.encode_whole({"credit": credit}))
        assert [messages.get(timeout=5) for _ in range(3)] == [{"credit": k} for k in range(3)]
        assert [t.name for t in threading.enumerate()].count("tianji-queue-read t") == 1
        c.sendall(wire.encode_whole({"bye": True}))
        assert ends.get(timeout=5) == ("d", None) and messages.empty()
        assert wait_until(lambda: "tianji-queue-read t" not in [t.name for t in threading.enumerate()], 5)
        e, f = socket.socketpair()  # a later connection starts the thread again
        with e, f:
            loop.add(f, messages.put, lambda end: ends.put(("f", end)))
            e.close()
            name, end = ends.get(timeout=5)
            assert name == "f" and isinstance(end, ConnectionError)


def test_receive_loop_spreads_connections_over_its_threads_each_read_in_order_by_one():
    loop, ends = ReceiveLoop("t2", threads=2), queue.Queue()
    got: dict[int, list[tuple[int, str]]] = {k: [] for k in range(4)}
    pairs = [socket.socketpair() for _ in range(4)]
    for k, (_, b) in enumerate(pairs):
        loop.add(b, lambda msg, k=k: got[k].append((msg["credit"], threading.current_thread().name)),
                 lambda end, k=k: ends.put((k, end)))  # fmt: skip
    assert sorted(t.name for t in threading.enumerate() if t.name.startswith("tianji-queue-read t2")) == [
        "tianji-queue-read t2 0",
        "tianji-queue-read t2 1",
    ]
    for credit in range(200):
        for a, _ in pairs:
            a.sendall(wire.encode_whole({"credit": credit}))
    for a, _ in pairs:
        a.sendall(wire.encode_whole({"bye": True}))
    assert sorted(ends.get(timeout=5) for _ in pairs) == [(k, None) for k in range(4)]
    for k in range(4):
        assert [credit for credit, _ in got[k]] == list(range(200))  # all, in order
        assert len({name for _, name in got[k]}) == 1  # on one thread
    assert {got[k][0][1] for k in range(4)} == {"tianji-queue-read t2 0", "tianji-queue-read t2 1"}  # two each
    assert wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("tianji-queue-read t2")], 5)
    for a, b in pairs:
        a.close()
        b.close()
    with pytest.raises(ValueError, match="at least one thread"):
        ReceiveLoop("t0", threads=0)


def test_wire_send_writes_every_piece_whole_across_partial_sendmsgs():
    a, b = socket.socketpair()
    with a, b:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * KIB)  # many partial sendmsg calls
        items = [(i, 300 * KIB, {"x": np.full(300 * KIB, i, dtype=np.uint8)}) for i in range(4)]
        pieces = wire.encode({"items": items}, out_of_band=True)
        assert len(pieces) == 5
        writer = threading.Thread(target=wire.send, args=(a, pieces))
        writer.start()
        [msg] = read_messages(b, 1)
        writer.join(10)
        assert [seq for seq, _, _ in msg["items"]] == [0, 1, 2, 3]
        assert all(np.array_equal(p["x"], np.full(300 * KIB, i, dtype=np.uint8)) for i, _, p in msg["items"])


class _SlowInbox:
    """A receiver speaking the queue wire protocol (queue_inbox) over a real comm, reading one
    message at a time with a pause between reads and returning credit for each at once: the
    sender's last messages are still in its socket when it closes, with credit unread
    beside them. ``owned``: it takes its end of the socket as the inbox does on tcp:// and sends
    its cue together with a window update, ``window_after_cue`` (both reach the sender in one
    segment, before it takes its own end)."""

    WINDOW = 1 << 30

    def __init__(self, pause: float, owned: bool = False, window_after_cue: int = 1 << 29):
        self.pause = pause
        self.owned = owned
        self.window_after_cue = window_after_cue
        self.items: list[int] = []
        self.bye = False
        self.error: str | None = None
        self.done = asyncio.Event()

    async def handle(self, comm) -> None:
        try:
            hello = await comm.read()
            assert hello["kind"] == "queue", hello
            if self.owned:
                await comm.write({"window": self.WINDOW, "owned": True})
                await asyncio.to_thread(self._serve_owned, owned_socket.take(comm))
                return
            await comm.write({"window": self.WINDOW})
            while not self._took(msg := await wire.read(comm.stream)):
                await comm.write({"credit": sum(nb for _, nb, _ in msg["items"])})
                await asyncio.sleep(self.pause)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            self.error = repr(exc)
        finally:
            await comm.close()
            self.done.set()

    def _serve_owned(self, sock: socket.socket) -> None:
        with sock:
            sock.sendall(
                wire.encode_whole({"window": self.WINDOW}) + wire.encode_whole({"window": self.window_after_cue})
            )
            reader = FrameReader(sock)
            while True:
                select.select([sock], [], [], 30)
                for msg in reader.pump():
                    if self._took(msg):
                        return
                    sock.sendall(wire.encode_whole({"credit": sum(nb for _, nb, _ in msg["items"])}))
                    time.sleep(self.pause)

    def _took(self, msg: dict) -> bool:
        """Record ``msg``'s items; True for the "bye"."""
        self.bye = bool(msg.get("bye"))
        self.items.extend(seq for seq, _, _ in msg.get("items", ()))
        return self.bye


@contextlib.contextmanager
def listening(handle):
    """A comm listener on 127.0.0.1 with ``handle`` for each connection, on an event loop of its
    own thread: yields the loop and the listener's address; stops both on the way out."""
    from distributed.comm import listen

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start():
        listener = listen("tcp://127.0.0.1:0", handle)
        await listener.start()
        return listener

    listener = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield loop, listener.contact_address
    finally:
        loop.call_soon_threadsafe(listener.stop)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("owned", [False, True], ids=["stream", "owned-socket"])
def test_queue_close_waits_for_a_slow_receiver_to_take_the_last_message(owned):
    inbox = _SlowInbox(pause=0.15, owned=owned)
    with listening(inbox.handle) as (loop, address):
        n = 8  # 8 x 4 MiB: more than the socket buffers of both ends hold
        sender = QueueSender(address, "slow", "s0", 64 << 20, loop=loop, connection_args={})
        for i in range(n):
            assert sender.push(make_payload("s0", i, 4 << 20))
        sender.close(timeout=30)
        asyncio.run_coroutine_threadsafe(asyncio.wait_for(inbox.done.wait(), 30), loop).result(35)
        assert inbox.items == list(range(n)) and inbox.bye, (inbox.items, inbox.bye, inbox.error)
        assert inbox.error is None, inbox.error
        assert sender.stats()["errors"] == 0, sender.stats()
        # the window update that came with the cue was applied, not lost in tornado's buffer
        assert sender.stats()["window"] == (inbox.window_after_cue if owned else inbox.WINDOW)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("owned", [False, True], ids=["stream", "owned-socket"])
@pytest.mark.parametrize("nbytes", [KIB, 256 * KIB, 768 * KIB], ids=["small", "large", "half-a-batch"])
def test_an_item_that_does_not_pickle_fails_the_channel_naming_it_after_the_items_before_it(owned, nbytes):
    inbox = _SlowInbox(pause=0.0, owned=owned)
    with listening(inbox.handle) as (loop, address):
        sender = QueueSender(address, "unpicklable", "s0", 64 << 20, loop=loop, connection_args={})
        for i in range(3):
            assert sender.push(make_payload("s0", i, nbytes))
        assert wait_until(lambda: inbox.items == [0, 1, 2], 10), inbox.items
        sender.push({**make_payload("s0", 3, nbytes), "fn": lambda: None})
        assert wait_until(lambda: sender.stats()["errors"] == 1, 10), sender.stats()
        with pytest.raises(ChannelError, match=r"item 3 cannot be serialized .*payloads hold arrays"):
            sender.push(make_payload("s0", 4, nbytes))
        sender.close(timeout=5)
        assert inbox.items == [0, 1, 2]
        assert not [t.name for t in threading.enumerate() if t.name.endswith(" unpicklable s0")]


class _DeafInbox:
    """A receiver that owns its end of the socket as the inbox does on tcp://, sends its cue and
    then reads nothing until ``release`` is set."""

    def __init__(self):
        self.release = threading.Event()

    async def handle(self, comm) -> None:
        await comm.read()
        await comm.write({"window": 1 << 30, "owned": True})
        sock = owned_socket.take(comm)
        sock.sendall(wire.encode_whole({"window": 1 << 30}))
        await asyncio.to_thread(self.release.wait, 30)
        sock.close()


@pytest.mark.timeout(60)
def test_a_close_that_times_out_says_so_not_that_the_connection_was_lost():
    """close(timeout) against a receiver that takes nothing: the sender's threads then see their
    socket shut down, and the channel's error must still say what happened."""
    inbox = _DeafInbox()
    with listening(inbox.handle) as (loop, address):
        try:
            sender = QueueSender(address, "deaf", "s0", 64 << 20, loop=loop, connection_args={})
            for i in range(8):  # 8 x 4 MiB: more than the socket buffers of both ends hold
                assert sender.push(make_payload("s0", i, 4 << 20))
            start_s = time.monotonic()
            sender.close(timeout=1.0)  # cancels the sender's run and waits for its teardown
            assert time.monotonic() - start_s < 10
            assert sender.stats()["errors"] == 1, sender.stats()
            assert not [t.name for t in threading.enumerate() if t.name.endswith(" deaf s0")]
            with pytest.raises(ChannelError, match="closed before everything queued was written"):
                sender.push(make_payload("s0", 8, KIB))
        finally:
            inbox.release.set()


@pytest.mark.timeout(60)
def test_drop_oldest_keeps_the_newest_large_items_droppable_while_the_receiver_takes_nothing():
    """Once the sockets are full, items of half a batch or more wait here: each new push drops
    the oldest of them, not itself."""
    inbox = _DeafInbox()
    with listening(inbox.handle) as (loop, address):
        try:
            sender = QueueSender(address, "deaf", "s2", 64 << 20, "drop_oldest", loop=loop, connection_args={})
            assert sender.push(make_payload("s2", 0, 768 * KIB))
            assert wait_until(lambda: sender.stats()["sent_items"] == 1, 10)  # its writer thread runs
            kept = [sender.push(make_payload("s2", i, 768 * KIB)) for i in range(1, 200)]
            assert all(kept), kept.index(False)
            assert sender.stats()["dropped"] > 0, sender.stats()
            sender.close(timeout=0.5)
        finally:
            inbox.release.set()


@pytest.mark.timeout(60)
def test_a_close_that_times_out_on_a_stopped_event_loop_returns_after_its_timeout():
    """A worker's loop that stopped runs no teardown: close must not wait for one."""
    inbox = _DeafInbox()
    with listening(inbox.handle) as (loop, address):
        sender = QueueSender(address, "deaf", "s1", 64 << 20, loop=loop, connection_args={})
        for i in range(8):
            assert sender.push(make_payload("s1", i, 4 << 20))
        loop.call_soon_threadsafe(loop.stop)
        assert wait_until(lambda: not loop.is_running(), 10)
        start_s = time.monotonic()
        sender.close(timeout=0.5)
        elapsed_s = time.monotonic() - start_s
        # the loop again, for the teardown and for listening() to stop the listener and the loop
        threading.Thread(target=loop.run_forever, daemon=True).start()
        inbox.release.set()
        assert wait_until(lambda: not [t for t in threading.enumerate() if t.name.endswith(" deaf s1")], 10)
    assert elapsed_s < 3, elapsed_s


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_queue_many_to_one(client, workers):
    # The inbox's capacity is shared by its live senders: each gets a third of it as window,
    # much less than its own 1 MiB capacity, so items also wait on the sender side.
    cap, item = 256 * KIB, 16 * KIB
    recv = actor(client, Receiver, workers[0], "q-many", cap)
    addr = recv.address().result()
    senders = ["a", "b", "c"]
    futs = [
        client.submit(send_items, addr, "q-many", s, 80, item, 1 << 20, workers=[w], pure=False)
        for s, w in zip(senders, workers)  # "a" sends from the receiver's own worker
    ]
    out = recv.drain(target=240, delay=0.001, timeout=45).result()
    results = client.gather(futs)
    assert all(all(acc) for acc, _ in results)
    assert out["bad"] == []
    # seen once in CI (232 of 240 after 45 s), never reproduced since: say where items stopped
    assert len(out["got"]) == 240, {
        "inbox": out["stats"],
        "senders": [st for _, st in results],
        "got_per_sender": {s: sum(g[0] == s for g in out["got"]) for s in senders},
    }
    check_order(out["got"], senders)
    assert out["stats"]["senders"] == {s: 80 for s in senders} and out["stats"]["seq_gaps"] == 0
    # Documented bound while senders join: capacity x (1 + 1/2 + 1/3).
    assert out["stats"]["max_queued_bytes"] <= cap * 11 / 6
    recv.close_channel().result()


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_queue_items_larger_than_window_share_still_flow(client, workers):
    # 2 senders share a 64 KiB inbox (32 KiB windows) with 40 KiB items: each item may go
    # only when nothing else of its sender is in flight, one at a time.
    recv = actor(client, Receiver, workers[0], "q-big", 64 * KIB)
    addr = recv.address().result()
    futs = [
        client.submit(send_items, addr, "q-big", s, 10, 40 * KIB, 256 * KIB, workers=[w], pure=False)
        for s, w in zip(["x", "y"], workers[1:])
    ]
    out = recv.drain(target=20, timeout=40).result()
    client.gather(futs)
    assert len(out["got"]) == 20 and out["bad"] == []
    check_order(out["got"], ["x", "y"])
    assert out["stats"]["max_queued_bytes"] <= 2 * 40 * KIB
    recv.close_channel().result()


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_queue_backpressure_wait(client, workers):
    cap = 256 * KIB
    recv = actor(client, Receiver, workers[0], "q-wait", cap)
    addr = recv.address().result()
    fut = client.submit(send_items, addr, "q-wait", "w", 40, 32 * KIB, cap, "wait", workers=[workers[1]], pure=False)
    out = recv.drain(target=40, delay=0.02, timeout=40).result()
    accepted, sstats = fut.result(timeout=40)
    assert all(accepted) and len(out["got"]) == 40 and out["bad"] == []
    assert out["over"] == [] and out["stats"]["max_queued_bytes"] <= cap
    assert sstats["blocked_s"] > 0 and sstats["dropped"] == 0
    recv.close_channel().result()


def test_credit_leaves_from_the_consumers_thread_once_a_quarter_is_due_while_the_writer_lingers(client, workers):
    """A little credit waits (the link's writer lingers for more); once a quarter of the
    window is due, the consumer's take sends it at once instead of leaving it to the linger."""
    window, item_bytes = 16 << 20, 1 << 20
    recv = actor(client, Receiver, workers[0], "q-linger", window)
    addr = recv.address().result()
    pusher = actor(client, Pusher, workers[1], addr, "q-linger", "p", window)
    old = client.run(set_credit_linger, 30.0, workers=[workers[0]])[workers[0]]
    try:
        assert all(pusher.push(8, item_bytes).result(timeout=30))
        assert wait_until(lambda: recv.stats().result()["queued_items"] == 8, 20)
        outstanding = pusher.stats().result()["outstanding_bytes"]
        assert outstanding > 7 * item_bytes
        assert recv.take(1).result() == 1  # under a quarter: the writer lingers for more
        time.sleep(0.5)
        assert pusher.stats().result()["outstanding_bytes"] == outstanding
        assert recv.take(4).result() == 4  # a quarter due now
        assert wait_until(lambda: pusher.stats().result()["outstanding_bytes"] < 4 * item_bytes, 5)
    finally:
        client.run(set_credit_linger, old, workers=[workers[0]])
        pusher.close().result(timeout=30)  # its "bye" ends the link, the lingering writer too
        recv.close_channel().result()
    assert wait_until(lambda: recv.link_threads().result() == [], 10)


@pytest.mark.integration
@pytest.mark.timeout(60)
@pytest.mark.parametrize("nbytes", [16 * KIB, 96 * KIB], ids=["small", "half-a-batch"])
def test_queue_backpressure_drop_oldest(client, workers, nbytes):
    cap, n = 8 * nbytes, 100
    name = f"q-drop-{nbytes}"
    recv = actor(client, Receiver, workers[0], name, cap)
    addr = recv.address().result()
    fut = client.submit(
        send_items, addr, name, "d", n, nbytes, cap, "drop_oldest", batch=2 * nbytes, workers=[workers[1]], pure=False
    )
    out = recv.drain(delay=0.01, idle=3.0, timeout=40).result()
    accepted, sstats = fut.result(timeout=40)
    got_seqs = [seq for _, seq, _ in out["got"]]
    assert out["bad"] == [] and out["over"] == [] and out["stats"]["max_queued_bytes"] <= cap
    assert got_seqs == sorted(set(got_seqs))
    assert sstats["dropped"] > 0
    assert len(got_seqs) + sstats["dropped"] == n
    assert sum(accepted) + accepted.count(False) == n
    # A dropped item at the very end leaves no gap the receiver can see.
    trailing = n - 1 - max(got_seqs)
    assert out["stats"]["seq_gaps"] == sstats["dropped"] - trailing
    assert out["stats"]["seq_gaps"] == sum(b - a - 1 for a, b in zip([-1] + got_seqs, got_seqs))
    recv.close_channel().result()


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_queue_error_when_channel_closed_or_unknown(client, workers):
    recv = actor(client, Receiver, workers[1], "q-close", 1 << 20)
    addr = recv.address().result()
    pusher = actor(client, Pusher, workers[2], addr, "q-close", "p", 1 << 20)
    assert pusher.push(3, KIB).result() == [True] * 3
    assert len(recv.drain(target=3, timeout=20).result()["got"]) == 3
    recv.close_channel().result()
    msg = pusher.push_until_error(KIB, 20).result()
    assert "closed" in msg and addr in msg and "q-close" in msg

    ghost = actor(client, Pusher, workers[2], addr, "no-such-channel", "g", 1 << 20)
    msg = ghost.push_until_error(KIB, 20).result()
    assert "no open channel 'no-such-channel'" in msg and addr in msg

    nobody = actor(client, Pusher, workers[0], "tcp://127.0.0.1:9", "x", "n", 1 << 20, connect_timeout=0.5)
    msg = nobody.push_until_error(KIB, 20).result()
    assert "cannot connect" in msg and "tcp://127.0.0.1:9" in msg


async def _raw_exchange(address: str, messages: list) -> list:
    """Speak the wire protocol by hand: a dict through distributed's comm (the handshake), bytes
    as they are on its stream (the queue's own framing after it); returns what the receiver
    answered to each. Once the receiver said "owned", its answers are in the queue's framing,
    the first of them the cue to go on, which is checked and not returned."""
    comm = await connect(address)
    replies = []
    owned = False
    try:
        for msg in messages:
            if isinstance(msg, bytes):
                await comm.stream.write(msg)
            else:
                await comm.write(msg)
            reply = await asyncio.wait_for(wire.read(comm.stream) if owned else comm.read(), 10)
            if isinstance(reply, dict) and reply.get("owned"):
                owned = True
                cue = await asyncio.wait_for(wire.read(comm.stream), 10)
                assert cue == {"window": reply["window"]}, cue
            replies.append(reply)
    except Exception as exc:  # noqa: BLE001 - the receiver may close right after its error reply
        replies.append(repr(exc))
    finally:
        comm.abort()
    return replies


async def _die_now():
    os._exit(1)


def raw_exchange(address, messages):
    return asyncio.run(_raw_exchange(address, messages))


@pytest.mark.integration
@pytest.mark.timeout(60)
@pytest.mark.parametrize("owned", [False, True], ids=["stream", "owned-socket"])
def test_malformed_messages_are_refused_not_fatal(client, workers, owned):
    """Bad handshakes and bad messages get an error naming the channel, on the comm's stream
    (a sender that does not offer its socket) and on a socket the inbox owns alike."""
    recv = actor(client, Receiver, workers[0], "q-mal", 1 << 20)
    addr = recv.address().result()
    hs = {"op": "tianji_channel", "reply": False}

    def run(messages):
        return client.submit(raw_exchange, addr, messages, workers=[workers[1]], pure=False).result(30)

    (reply, *_) = run([dict(hs, sender="x", kind="queue")])
    assert "without a 'channel'" in reply["error"]
    (reply, *_) = run([dict(hs, channel="q-mal", sender="x", kind="bogus")])
    assert "unknown kind" in reply["error"]
    (reply, *_) = run([dict(hs, channel="q-mal", kind="latest", sender="x")])
    assert "not a 'latest' channel" in reply["error"]
    queue = dict(hs, channel="q-mal", kind="queue", owned=owned)

    def framed(msg: dict) -> bytes:
        return wire.encode_whole(msg)

    window, reply, *_ = run([dict(queue, sender="x"), framed({"items": [[0, "x", 1]]})])
    assert window == ({"window": 1 << 20, "owned": True} if owned else {"window": 1 << 20})
    assert "malformed message" in reply["error"] and "q-mal" in reply["error"]
    assert "expected an item [seq, nbytes, payload dict]" in reply["error"]
    _, reply, *_ = run([dict(queue, sender="y"), {"items": [[0, 5, {"a": 1}]]}])  # distributed's framing
    assert "malformed message" in reply["error"] and "not a queue channel message" in reply["error"]
    prelude = struct.pack("<4sII", wire.MAGIC, 12, 0)
    _, reply, *_ = run([dict(queue, sender="z"), prelude + b"not a pickle"])
    assert "malformed message" in reply["error"] and "its header does not unpickle" in reply["error"]
    _, reply, *_ = run([dict(queue, sender="w"), struct.pack("<4sII", wire.MAGIC, 1 << 30, 0)])
    assert "malformed message" in reply["error"] and "out of bounds" in reply["error"]
    # The worker and the channel still work.
    fut = client.submit(send_items, addr, "q-mal", "ok", 5, KIB, 1 << 20, workers=[workers[2]], pure=False)
    out = recv.drain(target=5, timeout=20).result()
    fut.result(timeout=20)
    assert len(out["got"]) == 5 and out["bad"] == []
    assert wait_until(lambda: recv.stats().result()["connected"] == 0, 10), "sender not removed"
    assert wait_until(lambda: recv.link_threads().result() == [], 10), recv.link_threads().result()
    recv.close_channel().result()


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_on_tcp_the_inbox_owns_each_senders_socket_and_its_threads_end_with_the_connection(client, workers):
    """On a plain tcp:// cluster each sender's socket is taken from tornado at both ends: the
    inbox reads all of them on its receive loop's two threads (the first sender on the first, the
    next on the other) and writes each one's credit from a thread of its own, and the sender
    writes its items from a thread of its own and reads its credit on another; a sender's
    threads end when it says bye, a reading thread with its last connection."""
    recv = actor(client, Receiver, workers[0], "q-own", 1 << 20)
    addr = recv.address().result()
    pusher = actor(client, Pusher, workers[1], addr, "q-own", "p", 1 << 20)
    assert pusher.push(3, 96 * KIB).result() == [True] * 3
    assert len(recv.drain(target=3, timeout=20).result()["got"]) == 3
    assert recv.link_threads().result() == ["tianji-queue-read q-own 0", "tianji-queue-write q-own p"]
    assert pusher.send_threads().result() == ["tianji-channel-credit q-own p", "tianji-channel-send q-own p"]
    fut = client.submit(send_items, addr, "q-own", "s", 30, 20 * KIB, 1 << 20, workers=[workers[2]], pure=False)
    out = recv.drain(target=30, timeout=20).result()
    assert fut.result(timeout=20)[1]["errors"] == 0 and out["bad"] == []
    # the sender that said bye is gone, its thread too; the other one is still served
    assert wait_until(
        lambda: recv.link_threads().result() == ["tianji-queue-read q-own 0", "tianji-queue-write q-own p"], 10
    ), recv.link_threads().result()
    recv.close_channel().result()
    msg = pusher.push_until_error(KIB, 20).result()
    assert "closed" in msg and "q-own" in msg
    assert wait_until(lambda: recv.link_threads().result() == [], 10), recv.link_threads().result()
    assert pusher.send_threads().result() == []
    assert recv.stats().result()["connected"] == 0


# ---------------------------------------------------------------------------- topics
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_topic_conflation_two_subscribers(client, workers):
    subs = [actor(client, Subscriber, w, "params") for w in workers[1:]]
    pairs = [(s.address().result(), "params") for s in subs]
    n = 200
    watches = [s.watch(n - 1, 40) for s in subs]
    stats, errors = client.submit(publish_versions, pairs, n, 256 * KIB, workers=[workers[0]], pure=False).result(45)
    assert errors == []
    for w in watches:
        out = w.result(timeout=45)
        assert out["seen"] and out["seen"][-1] == n - 1
        assert out["seen"] == sorted(set(out["seen"])), "probe went back to an older version"
        assert out["bad"] == []
        assert out["stats"]["version"] == n - 1
    assert stats["published"] == n and stats["errors"] == 0
    assert stats["sent"] + stats["conflated"] == n * len(subs)
    assert stats["conflated"] > 0


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_topic_failed_subscriber_does_not_stop_others(client, workers):
    sub = actor(client, Subscriber, workers[1], "params-2")
    good = (sub.address().result(), "params-2")
    dead = ("tcp://127.0.0.1:9", "params-2")
    watch = sub.watch(49, 40)
    stats, errors = client.submit(
        publish_versions, [good, dead], 50, KIB, 0.5, 0.04, workers=[workers[0]], pure=False
    ).result(45)
    out = watch.result(timeout=45)
    assert out["seen"][-1] == 49 and out["bad"] == []
    assert stats["errors"] == 1 and len(errors) == 1  # reported once, by one publish
    assert "tcp://127.0.0.1:9" in errors[0] and "params-2" in errors[0]
    assert stats["subscribers"] == 1


# ---------------------------------------------------------------------------- peer death
@pytest.mark.integration
@pytest.mark.timeout(90)
def test_queue_error_after_receiving_worker_dies(client, workers):
    victim = workers[2]
    recv = actor(client, Receiver, victim, "q-dead", 1 << 20)
    addr = recv.address().result()
    pusher = actor(client, Pusher, workers[1], addr, "q-dead", "p", 1 << 20)
    assert pusher.push(3, KIB).result() == [True] * 3
    assert len(recv.drain(target=3, timeout=20).result()["got"]) == 3
    client.run(_die_now, workers=[victim], wait=False)  # hard kill, no task retry
    msg = pusher.push_until_error(KIB, 30).result()
    assert "connection lost" in msg and addr in msg and "q-dead" in msg
    assert pusher.stats().result()["errors"] == 1
    client.wait_for_workers(3, timeout=60)  # the nanny restarts it for the next tests


# ---------------------------------------------------------------------------- TLS
@pytest.mark.integration
@pytest.mark.timeout(90)
def test_tls_cluster_moves_items():
    sec = Security.temporary()
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            protocol="tls://",
            security=sec,
        ) as cluster,
        Client(cluster, security=sec) as c,
    ):
        c.register_plugin(ChannelPlugin())
        ws = sorted(scheduler_workers(c))
        assert all(w.startswith("tls://") for w in ws)
        recv = actor(c, Receiver, ws[0], "q-tls", 1 << 20)
        addr = recv.address().result()
        assert addr.startswith("tls://")
        fut = c.submit(send_items, addr, "q-tls", "t", 20, 8 * KIB, 256 * KIB, workers=[ws[1]], pure=False)
        out = recv.drain(target=20, timeout=40).result()
        accepted, sstats = fut.result(timeout=40)
        assert all(accepted) and out["bad"] == [] and len(out["got"]) == 20
        assert [seq for _, seq, _ in out["got"]] == list(range(20))
        # on tls:// the items stay on the comm's TLS stream, read on the event loop
        pusher = actor(c, Pusher, ws[1], addr, "q-tls", "p", 256 * KIB)
        assert pusher.push(2, KIB).result() == [True, True]
        assert len(recv.drain(target=2, timeout=20).result()["got"]) == 2
        assert recv.stats().result()["connected"] == 1 and recv.link_threads().result() == []
        assert pusher.send_threads().result() == []
        sub = actor(c, Subscriber, ws[1], "params-tls")
        watch = sub.watch(9, 30)
        stats, errors = c.submit(
            publish_versions, [(sub.address().result(), "params-tls")], 10, KIB, workers=[ws[0]], pure=False
        ).result(40)
        assert errors == [] and watch.result(timeout=40)["seen"][-1] == 9
