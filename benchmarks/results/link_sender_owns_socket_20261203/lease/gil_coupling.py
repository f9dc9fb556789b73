"""gil_coupling.py N DUTY [HOLD_US [SEND_WORK_US RECV_WORK_US]]: raw TCP on loopback between two
processes, 512 KiB messages (``sendall``; the receiver ``recv_into`` a fresh buffer a message with
MSG_WAITALL), with, in each process, a second thread that holds the GIL in pure Python for HOLD_US
microseconds at a time and then sleeps, DUTY of the time (0: no such thread); and SEND_WORK_US /
RECV_WORK_US of pure Python after each message in the sending / receiving thread itself (what a
channel's framing, pickling and hand-over cost it). Prints the rate."""

import socket
import subprocess
import sys
import threading
import time

import numpy as np

SIZE = 512 << 10


def spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def load(duty: float, hold_us: float) -> None:
    if duty <= 0:
        return
    gap_s = hold_us * 1e-6 * (1 - duty) / duty

    def run() -> None:
        while True:
            spin(hold_us)  # Python bytecode: holds the GIL but at the switch interval
            time.sleep(gap_s)

    threading.Thread(target=run, daemon=True).start()


if sys.argv[1] == "send":
    n, duty, hold_us, port = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    work_us = float(sys.argv[6])
    load(duty, hold_us)
    s = socket.create_connection(("127.0.0.1", port))
    data = np.ones(SIZE, np.uint8)
    for _ in range(n):
        s.sendall(data)
        spin(work_us)
    s.close()
    sys.exit()
n, duty = int(sys.argv[1]), float(sys.argv[2])
hold_us = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
send_us, recv_us = (float(sys.argv[4]), float(sys.argv[5])) if len(sys.argv) > 5 else (0.0, 0.0)
srv = socket.create_server(("127.0.0.1", 0))
cmd = [sys.executable, __file__, "send", str(n), str(duty), str(hold_us), str(srv.getsockname()[1]), str(send_us)]
sender = subprocess.Popen(cmd)
c, _ = srv.accept()
load(duty, hold_us)
t0 = 0.0
for i in range(n):
    buf = np.empty(SIZE, np.uint8)
    assert c.recv_into(buf, SIZE, socket.MSG_WAITALL) == SIZE
    spin(recv_us)
    if i == 0:
        t0 = time.perf_counter()
dt = time.perf_counter() - t0
sender.wait()
rate = (n - 1) * SIZE / dt / 1e6
print(
    f"duty {duty:.2f} hold {hold_us:.0f} us, work send {send_us:.0f} recv {recv_us:.0f} us: {rate:8.0f} MB/s",
    flush=True,
)
