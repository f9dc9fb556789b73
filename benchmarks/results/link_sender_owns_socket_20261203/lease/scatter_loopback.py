"""scatter_loopback.py TREE N ARRAYS SIZE: a forked sender writes N channel messages of ARRAYS
arrays of SIZE bytes each on a TCP connection over loopback; this process reads them with TREE's
FrameReader (waiting for arrays, as a read thread alone with its connection, the allocator fitted
as the inbox fits it) and prints wall and CPU time a message. TREE: a directory holding a
tianji_dask (S: git archive 6441ae4; R: S with lease/scatter_receive_R.patch)."""

import os
import select
import socket
import sys
import time

tree, n, k, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, tree)
import numpy as np  # noqa: E402

from tianji_dask.channels import wire  # noqa: E402
from tianji_dask.channels.malloc import fit_allocator  # noqa: E402
from tianji_dask.channels.receive_loop import FrameReader  # noqa: E402

server = socket.create_server(("127.0.0.1", 0))
a = socket.create_connection(server.getsockname())
b, _ = server.accept()
fit_allocator(k * size, 16 << 20)
msg = {"items": [(0, k * size, {f"a{i}": np.full(size, i, np.uint8) for i in range(k)})]}
pieces = wire.encode(msg, out_of_band=True)
pid = os.fork()
if pid == 0:
    b.close()
    for _ in range(n):
        wire.send(a, pieces)
    a.recv(1)  # the receiver has every message: closing earlier would end its last read
    a.close()
    os._exit(0)
a.close()
reader = FrameReader(b)
got = 0
t0, c0 = time.perf_counter(), time.thread_time()
while got < n:
    select.select([b], [], [])
    got += len(reader.pump(wait_for_arrays=True))
dt, dc = time.perf_counter() - t0, time.thread_time() - c0
b.send(b"x")
os.waitpid(pid, 0)
print(f"{os.path.basename(tree)} {k}x{size}: {dt / n * 1e6:.1f} us wall, {dc / n * 1e6:.1f} us CPU a message")
