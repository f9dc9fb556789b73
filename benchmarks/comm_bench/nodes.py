"""The communication benchmark on nodes with network stacks of their own (``jobqueue/netns_nodes.py``):
its cluster made of workers started inside the nodes, and raw TCP between those same worker
processes as the physical anchor.

Raw TCP protocol, as ``rawtcp.py``'s on one machine: each sender connects, then samples and
``sendall``s its message until the receiver, which reads every sender into a preallocated buffer,
holds ``n`` messages and closes the connections; a sender stops at the closed socket. All times
are ``time.monotonic()``, one clock for every namespace of the machine.

    receiver = client.submit(RawReceiver, actor=True, workers=[w0]).result()
    port = receiver.listen(host).result()
    got = receiver.receive(n, size, senders)                                   # ActorFuture
    sent = [client.submit(raw_send, host, port, size, st, start_at, workers=[w]) for w in ws]
"""

from __future__ import annotations

import os
import selectors
import socket
import time

from .cases import CommBenchConfig
from .cluster import BenchCluster

SOCKET_TIMEOUT_S = 120.0


class RawReceiver:
    """A Dask actor: one TCP listener, then ``senders`` connections read until ``n`` messages."""

    def listen(self, host: str) -> int:
        self.sock = socket.create_server((host, 0), backlog=128)
        return self.sock.getsockname()[1]

    def receive(self, n: int, size: int, senders: int) -> dict:
        import numpy as np

        self.sock.settimeout(SOCKET_TIMEOUT_S)
        sel = selectors.DefaultSelector()
        conns = []
        for _ in range(senders):
            conn, _ = self.sock.accept()
            conn.setblocking(False)
            conns.append(conn)
            sel.register(conn, selectors.EVENT_READ, [memoryview(np.empty(size, np.uint8)), 0])
        self.sock.close()
        total, messages, t_first = 0, 0, None
        try:
            while messages < n:
                ready = sel.select(SOCKET_TIMEOUT_S)
                if not ready:
                    raise TimeoutError(f"no bytes for {SOCKET_TIMEOUT_S:.0f} s after {messages} of {n} messages")
                for key, _ in ready:
                    buf, filled = key.data
                    got = key.fileobj.recv_into(buf[filled:])
                    if got == 0:
                        raise ConnectionError(f"a sender closed after {messages} of {n} messages")
                    if t_first is None:
                        t_first = time.monotonic()
                    total += got
                    filled += got
                    if filled == size:
                        messages, filled = messages + 1, 0
                    key.data[1] = filled
            t_n = time.monotonic()
        finally:
            for c in conns:
                c.close()  # the senders see a reset or a broken pipe: their signal to stop
        return {"bytes": total, "messages": messages, "t_first_byte": t_first, "t_n": t_n}


def raw_send(host: str, port: int, size: int, sample_time: float, start_at: float) -> dict:
    """One sender: sample (sleep), then one message, until the receiver closes the connection."""
    msg = bytes(size)
    sent, t_first = 0, None
    with socket.create_connection((host, port), timeout=SOCKET_TIMEOUT_S) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        time.sleep(max(0.0, start_at - time.monotonic()))
        try:
            while True:
                if sample_time:
                    time.sleep(sample_time)
                if t_first is None:
                    t_first = time.monotonic()
                s.sendall(msg)
                sent += 1
        except OSError:  # the receiver has its n messages and closed
            pass
    return {"sent": sent, "t_first": t_first}


class NodesCluster(BenchCluster):
    """The benchmark's cluster made of ``workers`` workers already started in the nodes: worker
    0 (by name) receives, the others are the actors."""

    def __init__(self, cfg: CommBenchConfig, scheduler: str, workers: int):
        super().__init__(cfg)
        self.scheduler = scheduler
        self.n_workers = workers

    def __enter__(self):
        from distributed import Client

        from tianji_dask.channels import ChannelPlugin

        self.client = Client(self.scheduler, timeout=60)
        self.client.wait_for_workers(self.n_workers, timeout=120)
        self.client.register_plugin(ChannelPlugin())
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        self.workers = sorted(info, key=lambda a: info[a]["name"])
        self.pids = self.client.run(os.getpid)
        return self

    def __exit__(self, *exc):
        self.client.close()

    def host(self, worker: str) -> str:
        return worker.split("://")[1].rsplit(":", 1)[0]

    def run_raw(self, size: int, messages: int, actors: int = 1, sample_time: float = 0.0) -> dict:
        """Raw TCP from the first ``actors`` actor workers into worker 0: the receiver's result,
        with ``collection_time`` (the n-th message's arrival less the first send's start)."""
        recv_w, send_ws = self.workers[0], self.workers[1 : 1 + actors]
        host = self.host(recv_w)
        receiver = self.client.submit(RawReceiver, actor=True, workers=[recv_w], pure=False).result()
        port = receiver.listen(host).result()
        got = receiver.receive(messages, size, actors)
        start_at = time.monotonic() + 0.2 + 0.01 * actors
        sends = [
            self.client.submit(raw_send, host, port, size, sample_time, start_at, workers=[w], pure=False)
            for w in send_ws
        ]
        r = got.result(timeout=self.cfg.case_timeout_s)
        firsts = [s["t_first"] for s in self.client.gather(sends) if s["t_first"] is not None]
        return {**r, "collection_time": r["t_n"] - min(firsts)}
