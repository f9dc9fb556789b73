"""Pieces every transport of the communication benchmark shares: the simulated sampling step,
process CPU time, and a receiver-memory sampler.

The sampling step stands in for an actor's env steps and inference between two sends:

- ``sleep``: ``time.sleep(t)``. Costs no CPU, so on a machine with few cores it measures the
  data plane rather than CPU contention between actors (the default).
- ``busy``: a pure-Python spin for ``t`` seconds. Holds the GIL like an interpreted env step,
  so it also competes with the sending process's event loop.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

SAMPLE_MODES = ("sleep", "busy")


def sample(mode: str, seconds: float) -> None:
    """One simulated sampling step of ``seconds`` (nothing when 0)."""
    if seconds <= 0:
        return
    if mode == "sleep":
        time.sleep(seconds)
    elif mode == "busy":
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    else:
        raise ValueError(f"sample mode must be one of {SAMPLE_MODES}, got {mode!r}")


def timed_sample(mode: str, seconds: float) -> tuple[float, float]:
    """One simulated sampling step: its wall seconds and its CPU seconds in this thread."""
    t0, c0 = time.perf_counter(), time.thread_time()
    sample(mode, seconds)
    return time.perf_counter() - t0, time.thread_time() - c0


def sleep_until(monotonic_t: float) -> None:
    delay = monotonic_t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def process_cpu_s() -> float:
    """User + system CPU seconds of this process, all threads (kernel socket copies included)."""
    return time.process_time()


def fault_and_switch_counts(pid: int) -> tuple[int, int]:
    """(minor page faults, context switches voluntary and involuntary) of process ``pid`` so far,
    all its threads, from /proc: a receiver that touches fresh memory for each message faults
    once per page; threads that hand the GIL to each other switch."""
    import psutil

    proc = psutil.Process(pid)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    switches = proc.num_ctx_switches()
    return int(fields[7]), switches.voluntary + switches.involuntary


class RssSampler:
    """Samples the resident memory of process ``pid`` every ``interval`` seconds in a thread of
    the calling process (so the measured process does no extra work), and counts the process's
    minor page faults and context switches from start to end.

    Protocol::

        with RssSampler(pid) as rss:
            ...                         # the run
        rss.start_bytes, rss.peak_bytes, rss.minor_faults, rss.context_switches
    """

    def __init__(self, pid: int, interval: float = 0.01):
        import psutil

        self._proc = psutil.Process(pid)
        self.interval = interval
        self.start_bytes = self._proc.memory_info().rss
        self._counts = fault_and_switch_counts(pid)
        self.minor_faults = self.context_switches = 0
        self.peak_bytes = self.start_bytes
        self.samples = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(self.interval):
            try:
                rss = self._proc.memory_info().rss
            except psutil.Error:  # the process ended
                return
            self.samples += 1
            if rss > self.peak_bytes:
                self.peak_bytes = rss

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        import psutil

        try:
            faults, switches = fault_and_switch_counts(self._proc.pid)
        except (OSError, psutil.Error):  # the process ended
            return
        self.minor_faults, self.context_switches = faults - self._counts[0], switches - self._counts[1]

    def per_message(self, messages: int) -> dict[str, float]:
        """The counts per message collected, as comm.nc names them."""
        return {
            "receiver_faults_per_message": self.minor_faults / messages,
            "receiver_switches_per_message": self.context_switches / messages,
        }


def loadavg_1m() -> float:
    return os.getloadavg()[0]
