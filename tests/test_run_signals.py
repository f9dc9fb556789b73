"""The CLI under signals, in a subprocess of its own session: Ctrl-C (SIGINT to the CLI process
only) ends the run with results and exit 130, SIGTERM likewise with 143; a worker killed with
SIGKILL is reported as a lost host, the run fails with exit 1, results are still written. None
may leave a process behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import xarray as xr

pytestmark = pytest.mark.integration

PROGRESS = re.compile(r"steps\s+[\d,]+\s+\S+ steps/s")


class CliRun:
    """``tianji-dask train`` in a new session; stderr lines are collected with their arrival time."""

    def __init__(self, h, tmp_path: Path, *overrides: str):
        self.out = tmp_path / "run"
        sets = ["stop.max_seconds=120", "stop.target_return=null", "stop.max_env_steps=null", *overrides]
        cmd = [sys.executable, "-m", "tianji_dask.cli", "train", str(h.CONFIG),
               *(a for s in sets for a in ("--set", s)), "--out", str(self.out)]
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append((time.monotonic() - self.t0, line.rstrip("\n")))

    @property
    def stderr(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def timeline(self, since: float = 0.0) -> str:
        return "\n".join(f"{t:7.2f} s  {line[:160]}" for t, line in list(self.lines) if t >= since)

    def wait_for_line(self, pattern: re.Pattern, timeout: float, since: float = 0.0) -> float:
        """Seconds since start when a stderr line (from ``since`` on) matched ``pattern``;
        fails on exit or timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in list(self.lines):
                if t >= since and pattern.search(line):
                    return t
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        pytest.fail(f"no line matching {pattern.pattern!r} (exit {self.proc.poll()}); stderr:\n{self.stderr}")

    def workers(self) -> list[psutil.Process]:
        """The Dask worker processes (multiprocessing spawn children) of the CLI."""
        out = []
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if "spawn_main" in " ".join(p.cmdline()):
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out

    def session(self) -> list[psutil.Process]:
        """Every live process of the CLI's session (the CLI, its workers, any orphan of theirs)."""
        out = []
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) == self.proc.pid and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
                pass
        return out

    def finish(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill_session(self) -> None:
        for p in self.session():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.fixture
def cli_run(h, tmp_path):
    runs = []

    def start(*overrides):
        runs.append(CliRun(h, tmp_path, *overrides))
        return runs[-1]

    yield start
    for r in runs:  # whatever happened, nothing of ours outlives the test
        r.kill_session()
        r.finish(5)


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def worker_addresses(workers: list[psutil.Process]) -> dict[int, str]:
    """pid -> Dask address of each worker, without talking to any of them: a worker listens on
    its comm port and its HTTP dashboard; the comm port is the one its peers are connected to
    (actor -> buffer trajectories, learner -> actor parameters)."""
    listening, remote = {}, {}
    for p in workers:
        conns = p.net_connections(kind="tcp")
        listening[p.pid] = {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}
        remote[p.pid] = {c.raddr.port for c in conns if c.raddr and c.status == psutil.CONN_ESTABLISHED}
    out = {}
    for p in workers:
        peers = set().union(*(remote[q.pid] for q in workers if q.pid != p.pid))
        comm = listening[p.pid] & peers
        assert len(comm) == 1, (p.pid, listening, remote)
        out[p.pid] = f"tcp://127.0.0.1:{comm.pop()}"
    return out


def assert_results_open(run_dir: Path, status: str) -> dict:
    """Both files open and carry ``status``; returns their sizes, and ``error`` (the same in both)."""
    sizes, errors = {}, set()
    for name in ("metrics.nc", "episodes.nc"):
        path = run_dir / name
        assert path.is_file(), sorted(q.name for q in run_dir.iterdir())
        with xr.open_dataset(path, engine="h5netcdf") as ds:
            ds.load()
            sizes[name] = dict(ds.sizes)
            assert ds.attrs["status"] == status, (name, ds.attrs["status"], ds.attrs["error"])
            errors.add(ds.attrs["error"])
    assert len(errors) == 1, errors
    return {**sizes, "error": errors.pop()}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_the_run_with_results_and_no_process_left(h, cli_run, sig):
    run = cli_run()
    t_progress = run.wait_for_line(PROGRESS, timeout=60)
    time.sleep(2)  # hosts running, some steps taken
    workers = run.workers()
    assert len(workers) == 2, [w.cmdline() for w in workers]
    family = psutil.Process(run.proc.pid).children(recursive=True)

    t_sig = time.monotonic()
    os.kill(run.proc.pid, sig)  # the CLI only, not its process group
    code = run.finish(timeout=10)
    exit_s = time.monotonic() - t_sig
    assert code == 128 + sig, f"exit {code} {exit_s:.1f} s after {sig.name} at {t_sig - run.t0:.2f} s:\n{run.timeline()}"
    assert "Traceback" not in run.stderr, run.stderr
    assert "stopped:" in run.stderr, run.stderr
    sizes = assert_results_open(run.out, "stopped")
    assert sizes["metrics.nc"]["time"] >= 1 and sizes["error"] == ""
    assert h.wait_until(lambda: not any(alive(p) for p in family), timeout=5), \
        [p.pid for p in family if alive(p)]
    assert h.wait_until(lambda: not run.session(), timeout=5), [p.cmdline() for p in run.session()]
    print(f"\n{sig.name}: first progress at {t_progress:.1f} s, exit {code} after {exit_s:.1f} s, {sizes}")


@pytest.mark.timeout(120)
def test_killed_worker_is_reported_as_lost_and_fails_the_run(h, cli_run):
    timeout = 3.0
    run = cli_run(f"run.heartbeat_timeout={timeout}")
    run.wait_for_line(PROGRESS, timeout=60)
    time.sleep(2)
    workers = run.workers()
    assert len(workers) == 2, [w.cmdline() for w in workers]
    # The buffer and learner go to the first worker by address (cluster.RunCluster._placement);
    # kill the other one: the actor's.
    addresses = worker_addresses(workers)
    victim = max(workers, key=lambda p: addresses[p.pid])
    address = addresses[victim.pid]
    family = psutil.Process(run.proc.pid).children(recursive=True)

    t_kill = time.monotonic()
    victim.send_signal(signal.SIGKILL)
    # The first report names the killed worker: the actor's missing heartbeats, or the learner
    # failing to publish to it, whichever the driver notices first.
    killed_at = t_kill - run.t0
    t_report = run.wait_for_line(re.compile(re.escape(address)), timeout=60, since=killed_at) - killed_at
    code = run.finish(timeout=45)
    exit_s = time.monotonic() - t_kill
    assert code == 1, f"exit {code} {exit_s:.1f} s after the kill at {killed_at:.2f} s:\n{run.timeline()}"
    assert t_report <= timeout + 5, f"lost host reported {t_report:.1f} s after the kill:\n{run.timeline()}"
    assert "failed:" in run.stderr, run.stderr
    if "left the cluster" in run.stderr:  # the scheduler noticed first: its and the nanny's word are quoted
        flat = " ".join(run.stderr.split())  # the console wraps long lines
        assert "the scheduler removed it (handle-worker-cleanup" in flat, run.stderr
        assert "Dask's nanny: Worker process" in flat and "killed by signal 9" in flat, run.stderr
    sizes = assert_results_open(run.out, "failed")
    assert sizes["metrics.nc"]["time"] >= 1 and address in sizes["error"], sizes["error"]
    assert h.wait_until(lambda: not any(alive(p) for p in family), timeout=5), \
        [p.pid for p in family if alive(p)]
    # the nanny restarted the killed worker: that new process must be gone too
    assert h.wait_until(lambda: not run.session(), timeout=5), [p.cmdline() for p in run.session()]
    print(f"\nSIGKILL: lost host reported {t_report:.1f} s after the kill, exit 1 after {exit_s:.1f} s, {sizes}")
    print(f"killed at {killed_at:.2f} s:\n{run.timeline(since=killed_at - 1)}")
