"""One conformance suite for every transport behind the queue ports (``channels/ports.py``):
owned sockets on tcp://, the comm's stream on tls:// and the in-process ``LocalQueue``.

Each ``check_*`` function states one property of a transport: order, credit (a full window makes
``push`` wait until the consumer takes), integrity (bytes and arrays of every size arrive equal),
close. They run against each transport below, and against deliberately broken transports
(:class:`ReorderingQueue`, :class:`CreditlessQueue`, :class:`BitFlippingQueue`), where they must
fail: a suite that passes a broken transport would prove nothing. A sender killed in the middle
of a message (a real process, SIGKILL) and a malformed message apply to the remote transports.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from distributed import Security
from distributed.comm import connect, listen
from test_channels import make_payload, wait_until
from test_channels import payload_matches as channel_payload_matches

from tianji_dask.channels import LocalQueue, QueueInbox, QueueSender, wire
from tianji_dask.channels.ports import Inbox, Item, Sender
from tianji_dask.errors import ChannelError

MIB = 1 << 20


# ---------------------------------------------------------------------------- transports
@dataclass
class RemoteTransport:
    """Inboxes served by a comm listener on an event loop of its own thread, as a worker's
    ``ChannelService`` serves them: tcp:// (the inbox and sender take the socket) or tls://
    (both stay on the comm's stream)."""

    scheme: str
    security: Security | None = None
    inboxes: dict[str, QueueInbox] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        listen_args = self.security.get_listen_args("worker") if self.security else {}
        self.connection_args = self.security.get_connection_args("worker") if self.security else {}

        async def start():
            listener = listen(f"{self.scheme}://127.0.0.1:0", self._handle, **listen_args)
            await listener.start()
            return listener

        self._listener = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self.address = self._listener.contact_address

    async def _handle(self, comm) -> None:
        hello = await comm.read()
        inbox = self.inboxes[hello["channel"]]
        try:
            await inbox.serve(
                comm, hello["sender"], owned=hello.get("owned") is True, capacity=hello.get("capacity", 0)
            )
        except ChannelError as exc:  # closed: the sender is told, as ChannelService tells it
            await comm.write({"error": str(exc)})
            await comm.close()

    def open(self, name: str, capacity_bytes: int, full_policy: str = "wait") -> Inbox:
        inbox = QueueInbox(name, capacity_bytes, self.loop, self.address)
        self.inboxes[name] = inbox
        return inbox

    def sender(self, name: str, sender_id: str, capacity_bytes: int, full_policy: str = "wait") -> Sender:
        return QueueSender(
            self.address,
            name,
            sender_id,
            capacity_bytes,
            full_policy=full_policy,
            loop=self.loop,
            connection_args=self.connection_args,
        )

    def close_inbox(self, name: str) -> None:
        self.inboxes[name]._close()

    def stop(self) -> None:
        for inbox in self.inboxes.values():
            inbox._close()
        self.loop.call_soon_threadsafe(self._listener.stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class LocalTransport:
    """The serial mode's in-process queue: one object is both ends, its capacity the sender's."""

    queue_class: type[LocalQueue] = LocalQueue

    def __init__(self) -> None:
        self.queues: dict[str, LocalQueue] = {}

    def open(self, name: str, capacity_bytes: int, full_policy: str = "wait") -> Inbox:
        self.queues[name] = self.queue_class(capacity_bytes, full_policy)
        return self.queues[name]

    def sender(self, name: str, sender_id: str, capacity_bytes: int, full_policy: str = "wait") -> Sender:
        queue = self.queues[name]
        queue.capacity_bytes = min(queue.capacity_bytes, capacity_bytes)
        return queue

    def close_inbox(self, name: str) -> None:
        self.queues[name].close()

    def stop(self) -> None:
        pass


Transport = RemoteTransport | LocalTransport


@contextlib.contextmanager
def transport_for(kind: str) -> Iterator[Transport]:
    if kind == "local":
        transport: Transport = LocalTransport()
    elif kind == "tls":
        transport = RemoteTransport("tls", Security.temporary())
    else:
        transport = RemoteTransport("tcp")
    try:
        yield transport
    finally:
        transport.stop()


@pytest.fixture(params=["tcp", "tls", "local"], ids=["owned-tcp", "comm-tls", "local"])
def transport(request) -> Iterator[Transport]:
    with transport_for(request.param) as t:
        yield t


@pytest.fixture(params=["tcp", "tls"], ids=["owned-tcp", "comm-tls"])
def remote(request) -> Iterator[RemoteTransport]:
    with transport_for(request.param) as t:
        assert isinstance(t, RemoteTransport)
        yield t


# ---------------------------------------------------------------------------- the checks
def take(inbox: Inbox, n: int, timeout: float = 30.0) -> list[Item]:
    """``n`` items from ``inbox`` (fewer if they do not come within ``timeout``)."""
    got: list[Item] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += inbox.get(0.05, max_items=n - len(got))
    return got


def payload(sender_id: str, seq: int, nbytes: int) -> dict:
    """``make_payload``'s item, marked with who pushed it (the in-process queue names no sender)."""
    return {**make_payload(sender_id, seq, nbytes), "sid": sender_id}


def payload_matches(item: Item, sender_id: str) -> bool:
    """The item is the one ``sender_id`` pushed as its ``payload["seq"]``, equal to the last bit."""
    fields = {k: v for k, v in item.payload.items() if k != "sid"}
    return channel_payload_matches(item._replace(sender=sender_id, seq=int(fields["seq"][0]), payload=fields))


def check_order(t: Transport) -> None:
    """Two senders' items arrive each in the order pushed, every one, small and large mixed."""
    inbox = t.open("order", 64 * MIB)
    senders = [t.sender("order", sid, 16 * MIB) for sid in ("a", "b")]
    sizes = [(1 << 10) if k % 3 else (256 << 10) for k in range(40)]
    for seq, nbytes in enumerate(sizes):
        for s, sid in zip(senders, ("a", "b")):
            assert s.push(payload(sid, seq, nbytes))
    got = take(inbox, 2 * len(sizes))
    assert len(got) == 2 * len(sizes) and inbox.stats()["seq_gaps"] == 0
    for sid in {item.sender for item in got}:  # the in-process queue is one sender, "local"
        seqs = [item.seq for item in got if item.sender == sid]
        assert seqs == list(range(len(seqs))), f"sender {sid}: {seqs[:12]}"
    for sid in ("a", "b"):
        sent = [item.payload["seq"][0] for item in got if item.payload["sid"] == sid]
        assert sent == list(range(len(sizes))), f"pushed by {sid}: {sent[:12]}"
    assert all(payload_matches(item, item.payload["sid"]) for item in got)


def check_integrity(t: Transport) -> None:
    """Bytes and arrays of many dtypes and shapes arrive equal: tiny items (a byte) and large ones
    (several MB), alone and in runs."""
    inbox = t.open("integrity", 64 * MIB)
    sender = t.sender("integrity", "s", 32 * MIB)
    rng = np.random.default_rng(7)
    sent = [
        {"b": b"\x01"},
        {"tiny": np.array([3], np.uint8)},
        {"raw": rng.bytes(1000), "f8": rng.standard_normal((7, 3))},
        {"frames": rng.integers(0, 255, (4, 84, 84), np.uint8), "mask": rng.random(9) > 0.5},
        {"large": rng.standard_normal(6 * MIB // 8), "i2": np.arange(-5, 5, dtype=">i2")},
        *({"run": np.full(17, k, np.int32)} for k in range(50)),
    ]
    for payload in sent:
        assert sender.push({k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in payload.items()})
    got = take(inbox, len(sent))
    assert len(got) == len(sent)
    for item, want in zip(got, sent):
        assert set(item.payload) == set(want), item.seq
        for k, v in want.items():
            have = item.payload[k]
            if isinstance(v, bytes):
                assert have == v, (item.seq, k)
            else:
                assert have.dtype == v.dtype and have.shape == v.shape and np.array_equal(have, v), (item.seq, k)


def check_credit(t: Transport) -> None:
    """A sender whose window is full waits in ``push`` until the consumer takes an item, then goes
    on; its outstanding bytes never exceed its capacity."""
    item_bytes = 256 << 10
    capacity = 4 * item_bytes + 4096
    inbox = t.open("credit", 64 * MIB)
    sender = t.sender("credit", "s", capacity)
    for seq in range(4):
        assert sender.push(make_payload("s", seq, item_bytes))
    assert wait_until(lambda: inbox.stats()["queued_items"] == 4, 10), inbox.stats()
    pushed = threading.Event()
    pusher = threading.Thread(target=lambda: (sender.push(make_payload("s", 4, item_bytes)), pushed.set()))
    pusher.start()
    try:
        assert not pushed.wait(0.5), "push into a full window returned before the consumer took anything"
        assert sender.stats()["outstanding_bytes"] <= capacity
        assert len(inbox.get(5.0, max_items=1)) == 1
        assert pushed.wait(10), "push did not go on after the consumer took an item"
    finally:
        if not pushed.is_set():
            inbox.get(0.1)  # let the pusher finish
        pusher.join(10)
    assert sender.stats()["blocked_s"] >= 0.4 and sender.stats()["dropped"] == 0
    assert [item.seq for item in take(inbox, 4)] == [1, 2, 3, 4]


def check_close(t: Transport) -> None:
    """``close`` delivers what was pushed before it; a push after it, or after the inbox closed,
    raises ChannelError."""
    inbox = t.open("close", 64 * MIB)
    sender = t.sender("close", "s", 16 * MIB)
    for seq in range(20):
        assert sender.push(make_payload("s", seq, 64 << 10))
    sender.close(timeout=30)
    got = take(inbox, 20)
    assert [item.seq for item in got] == list(range(20)) and all(payload_matches(item, "s") for item in got)
    with pytest.raises(ChannelError):
        sender.push(make_payload("s", 20, 1 << 10))
    t.open("closed", MIB)
    other = t.sender("closed", "o", MIB)
    assert other.push(make_payload("o", 0, 1 << 10))
    t.close_inbox("closed")

    def refused() -> bool:
        try:
            other.push(make_payload("o", 1, 1 << 10))
        except ChannelError:
            return True
        return False

    assert wait_until(refused, 20), "pushes still accepted after the inbox closed"


CHECKS: list[Callable[[Transport], None]] = [check_order, check_integrity, check_credit, check_close]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_transport_conforms(transport, check):
    check(transport)


# ---------------------------------------------------------------------------- broken transports
class ReorderingQueue(LocalQueue):
    """Hands out each pair of items the wrong way round."""

    def _take(self, max_items):
        taken = super()._take(max_items)
        for k in range(0, len(taken) - 1, 2):
            taken[k], taken[k + 1] = taken[k + 1], taken[k]
        return taken


class CreditlessQueue(LocalQueue):
    """Never makes a sender wait: its capacity is not enforced."""

    def push(self, payload):
        capacity, self.capacity_bytes = self.capacity_bytes, 1 << 62
        try:
            return super().push(payload)
        finally:
            self.capacity_bytes = capacity


class BitFlippingQueue(LocalQueue):
    """Flips one bit of the first array of each large item it hands out."""

    def _take(self, max_items):
        taken = super()._take(max_items)
        for item in taken:
            arrays = [v for v in item.payload.values() if isinstance(v, np.ndarray) and v.nbytes > 1024]
            if arrays:
                arrays[0].view(np.uint8).reshape(-1)[100] ^= 1
        return taken


@pytest.mark.parametrize(
    ("broken", "check"),
    [(ReorderingQueue, check_order), (CreditlessQueue, check_credit), (BitFlippingQueue, check_integrity)],
    ids=["reordered", "no-credit", "flipped-bit"],
)
def test_the_suite_fails_a_transport_that_breaks_order_credit_or_integrity(broken, check):
    transport = LocalTransport()
    transport.queue_class = broken
    with pytest.raises(AssertionError):
        check(transport)


# ---------------------------------------------------------------------------- remote only
_HALF_A_MESSAGE = """
import asyncio, sys
import numpy as np
from distributed import Security
from distributed.comm import connect
from tianji_dask.channels import wire

async def main(address, certs):
    args = {}
    if certs:
        sec = Security(tls_ca_file=certs + "/ca.pem", tls_worker_cert=certs + "/cert.pem",
                       tls_worker_key=certs + "/key.pem", require_encryption=True)
        args = sec.get_connection_args("worker")
    comm = await connect(address, **args)
    await comm.write({"op": "tianji_channel", "reply": False, "channel": "kill", "sender": "victim",
                      "kind": "queue", "owned": True})
    if (await comm.read()).get("owned"):
        await wire.read(comm.stream)  # the cue
    head, array = wire.encode({"items": [(0, 4 << 20, {"x": np.ones(4 << 20, np.uint8)})]}, out_of_band=True)
    await comm.stream.write(head)
    await comm.stream.write(bytes(array)[: 1 << 20])
    print("HALF SENT", flush=True)
    await asyncio.sleep(120)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def write_certificates(security: Security | None, directory: Path) -> str:
    """The temporary certificates of ``security`` as files for another process ('' for none)."""
    if security is None:
        return ""
    (directory / "ca.pem").write_text(security.tls_ca_file)
    (directory / "cert.pem").write_text(security.tls_worker_cert)
    (directory / "key.pem").write_text(security.tls_worker_key)
    return str(directory)


@pytest.mark.timeout(120)
def test_a_sender_killed_in_the_middle_of_a_message_is_a_lost_connection_not_data(remote, tmp_path):
    inbox = remote.open("kill", 32 * MIB)
    certs = write_certificates(remote.security, tmp_path)
    command = [sys.executable, "-c", _HALF_A_MESSAGE, remote.address, certs]
    victim = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert victim.stdout is not None and victim.stdout.readline().strip() == "HALF SENT"
        assert wait_until(lambda: inbox.stats()["connected"] == 1, 10)
        other = remote.sender("kill", "ok", 4 * MIB)
        for seq in range(10):
            assert other.push(make_payload("ok", seq, 96 << 10))
        got = take(inbox, 10)
        assert [item.sender for item in got] == ["ok"] * 10 and all(payload_matches(item, "ok") for item in got)
        victim.send_signal(signal.SIGKILL)  # the kernel closes its socket in the middle of the message
        victim.wait(10)
        assert wait_until(lambda: inbox.stats()["connected"] == 1, 10), inbox.stats()  # only "ok" is left
        assert other.push(make_payload("ok", 10, 1 << 10))
        assert [item.seq for item in take(inbox, 1)] == [10]
        stats = inbox.stats()
        assert stats["senders"] == {"ok": 11} and stats["queued_items"] == 0, stats
    finally:
        victim.kill()
        victim.wait(10)


async def _send_raw(address: str, connection_args: dict, data: bytes) -> dict:
    """Shake hands as a queue sender, then send ``data`` as it is; the inbox's answer to it."""
    comm = await connect(address, **connection_args)
    try:
        await comm.write(
            {"op": "tianji_channel", "reply": False, "channel": "raw", "sender": "bad", "kind": "queue", "owned": True}
        )
        reply = await comm.read()
        owned = reply.get("owned") is True
        if owned:
            await wire.read(comm.stream)  # the cue
        await comm.stream.write(data)
        while True:  # credit (``{"window": ...}``) may come before the answer
            reply = await asyncio.wait_for(wire.read(comm.stream) if owned else comm.read(), 10)
            if "window" not in reply:
                return reply
    finally:
        comm.abort()


@pytest.mark.timeout(60)
def test_a_malformed_message_gets_a_clear_error_and_the_inbox_goes_on(remote):
    inbox = remote.open("raw", 4 * MIB)
    good = remote.sender("raw", "good", MIB)
    assert good.push(make_payload("good", 0, 1 << 10))
    reply = asyncio.run(_send_raw(remote.address, remote.connection_args, b"not a queue message, just bytes"))
    assert "malformed message" in reply["error"] and "not a queue channel message" in reply["error"], reply
    assert good.push(make_payload("good", 1, 1 << 10))
    got = take(inbox, 2)
    assert [(item.sender, item.seq) for item in got] == [("good", 0), ("good", 1)]
    assert wait_until(lambda: inbox.stats()["connected"] == 1, 10), inbox.stats()


def test_a_local_payload_that_is_not_a_dict_gets_a_clear_error_and_the_queue_goes_on():
    queue = LocalQueue(MIB)
    with pytest.raises(TypeError, match="channel payloads are dicts, got list"):
        queue.push([1, 2])  # type: ignore[arg-type]
    assert queue.push({"x": np.ones(3)}) and len(queue.poll()) == 1
