"""The contract the channels hold distributed and tornado to: every private attribute and every
behaviour beyond their documented API that ``tianji_dask/channels/`` reads, each asserted by name,
so that an upgrade past the bounds in pyproject.toml fails here, naming what changed, and not as
lost bytes in a run."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest
import tornado.iostream
from distributed import Scheduler, Security, Worker, WorkerPlugin
from distributed.comm import Comm, CommClosedError, connect, listen
from distributed.comm.tcp import TCP, TLS
from distributed.core import Server
from distributed.protocol import to_serialize


async def _pair(scheme: str = "tcp", security: Security | None = None) -> tuple[Comm, Comm, object]:
    """Two ends of one comm: (the connecting end, the listening end, the listener)."""
    accepted: asyncio.Queue[Comm] = asyncio.Queue()
    listen_args = security.get_listen_args("worker") if security else {}
    listener = listen(f"{scheme}://127.0.0.1:0", accepted.put, **listen_args)
    await listener.start()
    args = security.get_connection_args("worker") if security else {}
    near = await connect(listener.contact_address, **args)
    far = await asyncio.wait_for(accepted.get(), 10)
    return near, far, listener


def _on_a_pair(check: Callable[[Comm, Comm], Awaitable[None]], scheme: str = "tcp") -> None:
    async def main():
        near, far, listener = await _pair(scheme, Security.temporary() if scheme == "tls" else None)
        try:
            await check(near, far)
        finally:
            near.abort()
            far.abort()
            listener.stop()

    asyncio.run(main())


# ---------------------------------------------------------------------------- tornado, through the comm
def test_a_tcp_comm_is_exactly_distributed_comm_tcp_TCP_and_a_tls_comm_is_not():
    """``owned_socket.can_take``: ``type(comm) is TCP`` tells a plain tcp:// comm, whose socket may
    be taken, from a tls:// one (``TLS`` subclasses ``TCP``), whose bytes only its TLS session reads."""

    async def plain(near, far):
        assert type(near) is TCP and type(far) is TCP

    async def tls(near, far):
        assert type(near) is TLS and type(near) is not TCP and isinstance(near, TCP)

    _on_a_pair(plain)
    _on_a_pair(tls, "tls")


def test_comm_stream_is_a_tornado_IOStream_with_closed_writing_socket():
    """``comm.stream`` (``wire.stream_of``, ``owned_socket``): the tornado stream under a comm,
    with ``closed()``, ``writing()`` and its ``socket``."""

    async def check(near, far):
        stream = near.stream
        assert isinstance(stream, tornado.iostream.IOStream)
        assert stream.closed() is False and stream.writing() is False
        assert isinstance(stream.socket, socket.socket)

    _on_a_pair(check)


def test_stream__read_buffer_size_counts_bytes_read_ahead_and_not_handed_out():
    """``owned_socket.read_ahead``/``take``: the private ``IOStream._read_buffer_size`` is the
    number of bytes tornado read from the socket that no read has taken yet."""

    async def check(near, far):
        assert far.stream._read_buffer_size == 0
        await near.stream.write(b"x" * 100)
        assert await far.stream.read_bytes(10) == b"x" * 10
        for _ in range(100):  # tornado reads what the socket holds ahead of the next read
            if far.stream._read_buffer_size == 90:
                break
            await asyncio.sleep(0.01)
        assert far.stream._read_buffer_size == 90

    _on_a_pair(check)


def test_a_duplicated_socket_outlives_comm_abort_with_the_connection_open():
    """``owned_socket.take``: ``stream.socket.dup()`` then ``comm.abort()`` unregisters the stream
    and closes tornado's descriptor only; the connection goes on through the duplicate."""

    async def check(near, far):
        sock = far.stream.socket.dup()
        far.abort()
        assert far.closed()
        sock.setblocking(True)
        await near.stream.write(b"after abort")
        sock.settimeout(10)
        assert sock.recv(64) == b"after abort"
        sock.sendall(b"and back")
        assert await asyncio.wait_for(near.stream.read_bytes(8), 10) == b"and back"
        sock.close()

    _on_a_pair(check)


def test_stream_read_bytes_read_into_and_write_move_bytes_on_a_comm():
    """``wire.read`` and ``comm_stream.write``: ``read_bytes(n)``, ``read_into(buffer)`` and
    ``write(data)`` (awaitable) on the stream of a tcp:// and a tls:// comm."""

    async def check(near, far):
        await near.stream.write(b"head" + bytes(range(16)))
        assert await far.stream.read_bytes(4) == b"head"
        buffer = bytearray(16)
        assert await far.stream.read_into(buffer) == 16 and bytes(buffer) == bytes(range(16))

    _on_a_pair(check)
    _on_a_pair(check, "tls")


# ---------------------------------------------------------------------------- distributed
def test_comm_read_write_close_abort_closed_peer_address_and_CommClosedError():
    """The comm API the handshake, the topic and the tls:// credit use."""

    async def check(near, far):
        await near.write({"op": "x", "n": 1})
        assert await far.read() == {"op": "x", "n": 1}
        assert isinstance(far.peer_address, str) and far.peer_address.startswith("tcp://")
        await near.close()
        assert near.closed()
        with pytest.raises(CommClosedError):
            await far.read()

    _on_a_pair(check)


def test_to_serialize_wraps_a_topic_payload_that_a_comm_carries():
    """``topic``: a version's payload goes as ``to_serialize(payload)`` and arrives as the dict."""

    async def check(near, far):
        await near.write({"version": 3, "payload": to_serialize({"w": b"abc"})})
        assert await far.read() == {"version": 3, "payload": {"w": b"abc"}}

    _on_a_pair(check)


def test_a_server_hands_a_handler_the_comm_and_the_handshakes_keys_and_keeps_the_comm():
    """``ChannelService.handle_comm``: for ``{"op": name, "reply": False, ...}`` distributed's
    ``Server._handle_comm`` calls ``handlers[name](comm, **the other keys)`` and leaves the comm to
    the handler for as long as it runs."""
    assert hasattr(Server, "_handle_comm")

    async def main():
        seen: asyncio.Queue = asyncio.Queue()

        async def handler(comm, channel=None, **extra):
            await seen.put((channel, extra))
            await comm.write({"ok": True})
            assert await comm.read() == {"more": 1}  # the comm stays the handler's
            await comm.write({"ok": 2})

        server = Server({"tianji_channel": handler})
        await server.listen("tcp://127.0.0.1:0")
        comm = await connect(server.address)
        try:
            await comm.write({"op": "tianji_channel", "reply": False, "channel": "q", "sender": "s"})
            assert await comm.read() == {"ok": True}
            await comm.write({"more": 1})
            assert await comm.read() == {"ok": 2}
            assert await seen.get() == ("q", {"sender": "s"})
        finally:
            comm.abort()
            await server.close()

    asyncio.run(main())


def test_a_workers_loop_handlers_contact_address_and_security_are_there():
    """``ChannelService``/``resolve_loop``: ``worker.loop.asyncio_loop``, ``worker.handlers``,
    ``worker.contact_address``, ``worker.security.get_connection_args("worker")``."""

    async def main():
        async with (
            Scheduler(host="127.0.0.1", dashboard_address=":0") as scheduler,
            Worker(scheduler.address, nthreads=1) as worker,
        ):
            assert worker.loop.asyncio_loop is asyncio.get_running_loop()
            assert isinstance(worker.handlers, dict) and "get_data" in worker.handlers
            assert isinstance(worker.contact_address, str) and worker.address.startswith("tcp://")
            assert {"ssl_context", "require_encryption"} <= set(worker.security.get_connection_args("worker"))

    asyncio.run(main())


def test_a_worker_plugin_may_be_idempotent():
    """``ChannelPlugin.idempotent``: registering it again is a no-op, not a teardown."""
    assert "idempotent" in vars(WorkerPlugin) or hasattr(WorkerPlugin, "idempotent")
