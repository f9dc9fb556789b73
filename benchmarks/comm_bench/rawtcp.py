"""The physical anchor of the communication benchmark: plain TCP sockets between Python processes.

``N_A`` sender processes each connect to one receiver process on 127.0.0.1; each sender runs
"sample, then ``sendall`` the message" until told to stop, and the receiver reads every message
with ``recv_into`` a fresh buffer (``numpy.empty``, as Dask's own TCP comm allocates its read
buffers) until it holds ``n`` messages, then keeps draining until every sender has closed.
No framing beyond the fixed message size, no serialization, no flow control beyond TCP's own.

Processes are started with the ``spawn`` method (the caller may hold threads and a Dask client)
with the caller's environment minus every ``MALLOC_*`` variable, so they run with glibc's default
allocator settings. This matters: a ``LocalCluster``'s nannies write Dask's
``MALLOC_TRIM_THRESHOLD_=65536`` into the *client* process's ``os.environ`` when they spawn
workers, and every process started from there later would inherit it (measured: the raw
receiver's CPU per 512 KiB message rose from about 70 to 200 microseconds).

Call protocol::

    res = run_raw_tcp(n=10_000, size=512 << 10, senders=4, sample_time=0.001)
    res["collection_time_s"], res["t_sd_s"], res["t_rv_s"], res["receiver_peak_rss_bytes"]
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import selectors
import socket
import time

from .cases import MB, Case, CommBenchConfig
from .workload import RssSampler, process_cpu_s, sleep_until, timed_sample

_READY_TIMEOUT_S = 60.0


def _receiver(pipe, n_senders: int, size: int, n: int, stop) -> None:
    import numpy as np

    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lst.bind(("127.0.0.1", 0))
    lst.listen(n_senders)
    pipe.send(lst.getsockname()[1])
    sel = selectors.DefaultSelector()
    for _ in range(n_senders):
        sock, _ = lst.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        buf = memoryview(np.empty(size, dtype=np.uint8))
        sel.register(sock, selectors.EVENT_READ, [buf, 0])
    lst.close()
    pipe.send("ready")
    cpu0 = process_cpu_s()
    count = 0
    t_n = cpu_n = None
    open_socks = n_senders
    while open_socks:
        for key, _ in sel.select():
            sock, st = key.fileobj, key.data
            while True:  # drain what the socket holds before selecting again
                try:
                    got = sock.recv_into(st[0][st[1] :])
                except BlockingIOError:
                    break
                if got == 0:
                    sel.unregister(sock)
                    sock.close()
                    open_socks -= 1
                    break
                st[1] += got
                if st[1] == size:
                    count += 1
                    st[0] = memoryview(np.empty(size, dtype=np.uint8))  # a fresh buffer per message
                    st[1] = 0
                    if count == n:
                        t_n, cpu_n = time.monotonic(), process_cpu_s()
                        stop.set()
    pipe.send(
        {
            "t_n": t_n,
            "received": count,
            "cpu_s": (cpu_n - cpu0) if cpu_n is not None else None,
            "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        }
    )


def _sender(pipe, port: int, size: int, sample_mode: str, sample_time: float, start, start_at, stop) -> None:
    payload = (bytes(range(256)) * (size // 256 + 1))[:size]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pipe.send("ready")
    start.wait()
    sleep_until(start_at.value)
    check_every = max(1, (256 << 10) // max(size, 1))  # Event.is_set takes a lock: not per tiny message
    sent = 0
    sample_wall = sample_cpu = send_wall = 0.0
    cpu0 = process_cpu_s()
    t_first = time.monotonic()
    while sent % check_every or not stop.is_set():
        if sample_time > 0:
            wall, cpu = timed_sample(sample_mode, sample_time)
            sample_wall += wall
            sample_cpu += cpu
        t0 = time.perf_counter()
        sock.sendall(payload)
        send_wall += time.perf_counter() - t0
        sent += 1
    cpu = process_cpu_s() - cpu0
    sock.shutdown(socket.SHUT_WR)
    sock.close()
    pipe.send(
        {
            "t_first": t_first,
            "sent": sent,
            "cpu_s": cpu,
            "sample_wall_s": sample_wall,
            "sample_cpu_s": sample_cpu,
            "send_wall_s": send_wall,
        }
    )


def _recv(pipe, what: str, proc):
    if not pipe.poll(_READY_TIMEOUT_S):
        raise RuntimeError(f"raw TCP benchmark: no {what} from process {proc.pid} within {_READY_TIMEOUT_S:.0f} s")
    return pipe.recv()


@contextlib.contextmanager
def glibc_default_env():
    """Remove ``MALLOC_*`` variables from ``os.environ`` while child processes are started."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    for k in saved:
        del os.environ[k]
    try:
        yield
    finally:
        os.environ.update(saved)


def run_raw_tcp(
    n: int, size: int, senders: int = 1, sample_time: float = 0.0, sample_mode: str = "sleep", timeout: float = 600.0
) -> dict:
    """Move ``n`` messages of ``size`` bytes from ``senders`` processes into one receiver.

    Returns the collection time (first send of any sender to the receiver holding the n-th
    message, both on the system-wide monotonic clock), the receiver's peak RSS (sampled every
    10 ms from this process), and the per-message CPU seconds at each end (``t_sd_s``: sender
    CPU outside sampling per message sent; ``t_rv_s``: receiver CPU per message received).
    """
    ctx = mp.get_context("spawn")
    stop, start = ctx.Event(), ctx.Event()
    start_at = ctx.Value("d", 0.0, lock=False)
    rpipe, rchild = ctx.Pipe()
    receiver = ctx.Process(target=_receiver, args=(rchild, senders, size, n, stop), daemon=True)
    with glibc_default_env():
        receiver.start()
    procs = [receiver]
    try:
        port = _recv(rpipe, "port", receiver)
        spipes = []
        for _ in range(senders):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_sender, args=(child, port, size, sample_mode, sample_time, start, start_at, stop), daemon=True
            )
            with glibc_default_env():
                p.start()
            procs.append(p)
            spipes.append((parent, p))
        for parent, p in spipes:
            _recv(parent, "ready", p)
        _recv(rpipe, "ready", receiver)
        with RssSampler(receiver.pid) as rss:
            start_at.value = time.monotonic() + 0.05
            start.set()
            if not rpipe.poll(timeout):
                raise TimeoutError(f"raw TCP benchmark: {n} messages of {size} B not received within {timeout:.0f} s")
            rres = rpipe.recv()
        sres = [_recv(parent, "result", p) for parent, p in spipes]
    finally:
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    sent = sum(s["sent"] for s in sres)
    t_first = min(s["t_first"] for s in sres)
    collection = rres["t_n"] - t_first
    return {
        "collection_time_s": collection,
        "received": n,
        "sent": sent,
        "t_sp_s": sum(s["sample_wall_s"] for s in sres) / sent,
        "t_sp_cpu_s": sum(s["sample_cpu_s"] for s in sres) / sent,
        "t_sd_s": sum(s["cpu_s"] - s["sample_cpu_s"] for s in sres) / sent,
        "t_rv_s": rres["cpu_s"] / n,
        "send_call_s": sum(s["send_wall_s"] for s in sres) / sent,
        "receiver_start_rss_bytes": rss.start_bytes,
        "receiver_peak_rss_bytes": rss.peak_bytes,
        **rss.per_message(n),
        "receiver_malloc_env": rres["malloc_env"],
    }


def run_raw(case: Case, cfg: CommBenchConfig) -> dict:
    """One raw TCP case as a row of comm.nc's variables."""
    r = run_raw_tcp(
        case.messages, case.message_bytes, case.actors, case.sample_time, cfg.sample_mode, timeout=cfg.case_timeout_s
    )
    return {
        "collection_time": r["collection_time_s"],
        "messages_sent": r["sent"],
        "t_sp": r["t_sp_s"],
        "t_sp_cpu": r["t_sp_cpu_s"],
        "t_sd": r["t_sd_s"],
        "t_rv": r["t_rv_s"],
        "send_call_time": r["send_call_s"],
        "receiver_rss_start": r["receiver_start_rss_bytes"] / MB,
        "receiver_rss_peak": r["receiver_peak_rss_bytes"] / MB,
        "receiver_faults_per_message": r["receiver_faults_per_message"],
        "receiver_switches_per_message": r["receiver_switches_per_message"],
        "receiver_malloc_env": json.dumps(r["receiver_malloc_env"], sort_keys=True),
    }
