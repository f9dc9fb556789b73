"""hot.py N MODE: raw TCP on loopback between two processes, 512 KiB messages, the receiver
reading each message whole (MSG_WAITALL) into one buffer again and again (MODE hot) or into a
fresh buffer a message, kept until MODE later messages arrived (a queue of items in flight)."""

import collections
import socket
import subprocess
import sys
import time

import numpy as np

SIZE = 512 << 10
if sys.argv[1] == "send":
    s = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
    data = np.ones(SIZE, np.uint8)
    for _ in range(int(sys.argv[3])):
        s.sendall(data)
    s.close()
    sys.exit()
n, mode = int(sys.argv[1]), sys.argv[2]
srv = socket.create_server(("127.0.0.1", 0))
sender = subprocess.Popen([sys.executable, __file__, "send", str(srv.getsockname()[1]), str(n)])
c, _ = srv.accept()
one = np.empty(SIZE, np.uint8)
keep: collections.deque = collections.deque()
t0 = 0.0
for i in range(n):
    buf = one if mode == "hot" else np.empty(SIZE, np.uint8)
    assert c.recv_into(buf, SIZE, socket.MSG_WAITALL) == SIZE
    if i == 0:
        t0 = time.perf_counter()
    if mode != "hot":
        keep.append(buf)
        if len(keep) > int(mode):
            keep.popleft()
dt = time.perf_counter() - t0
sender.wait()
print(f"{mode:>5}: {(n - 1) * SIZE / dt / 1e6:8.0f} MB/s", flush=True)
