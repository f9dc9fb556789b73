"""The CLI under signals, in a subprocess of its own session: Ctrl-C typed at a real
pseudo-terminal (SIGINT to the whole foreground process group, workers included) ends the run as
`stopped` with results, the final checkpoint and exit 130; SIGTERM to the process group or to the
CLI alone likewise with 143; a second Ctrl-C stops at once. A worker killed with SIGKILL is
reported as a lost host, the run fails with exit 1, results are still written. None may leave a
process behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import psutil
import pytest
import xarray as xr
from conftest import worker_processes

pytestmark = pytest.mark.integration

PROGRESS = re.compile(r"steps\s+[\d,]+\s+\S+ steps/s")
TRAINING = re.compile(r"updates [1-9]")  # the progress line once the learner has updated
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PPO_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cartpole_ppo.yaml"


def _take_controlling_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # stdin is the pseudo-terminal; start_new_session ran setsid


class CliRun:
    """``tianji-dask train`` in a new session; output lines are collected with their arrival time.

    ``terminal=True`` runs it on a pseudo-terminal that is the session's controlling terminal, as
    a shell would: :meth:`type_ctrl_c` then makes the terminal signal the whole foreground
    process group, workers included. Otherwise stderr is a pipe and stdin is closed."""

    def __init__(self, h, tmp_path: Path, *overrides: str, config: Path | None = None, terminal: bool = False):
        self.out = tmp_path / "run"
        sets = ["stop.max_seconds=120", "stop.target_return=null", "stop.max_env_steps=null", *overrides]
        cmd = [
            sys.executable,
            "-m",
            "tianji_dask.cli",
            "train",
            str(config or h.CONFIG),
            *(a for s in sets for a in ("--set", s)),
            "--out",
            str(self.out),
        ]
        self.t0 = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        self._master = None
        if terminal:
            self._master, tty = pty.openpty()
            # 160 columns (rich reads COLUMNS before the terminal's size, and takes a dumb TERM
            # for 80): the progress line shows all its figures (updates: TRAINING) there
            fcntl.ioctl(tty, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))
            self.proc = subprocess.Popen(
                cmd,
                env={**os.environ, "COLUMNS": "160"},
                cwd=tmp_path,
                stdin=tty,
                stdout=tty,
                stderr=tty,
                start_new_session=True,
                preexec_fn=_take_controlling_terminal,
            )
            os.close(tty)
            reader = self._read_terminal
        else:
            self.proc = h.cli_in_background(cmd, tmp_path)
            reader = self._read
        self._reader = threading.Thread(target=reader, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append((time.monotonic() - self.t0, line.rstrip("\n")))

    def _read_terminal(self) -> None:
        pending = ""
        while True:
            try:
                data = os.read(self._master, 4096)
            except OSError:  # EIO: every process holding the terminal has exited
                data = b""
            if not data:
                break
            pending += data.decode(errors="replace")
            *complete, pending = re.split(r"[\r\n]+", pending)
            now = time.monotonic() - self.t0
            self.lines.extend((now, ANSI.sub("", line)) for line in complete if line.strip())
        if pending.strip():
            self.lines.append((time.monotonic() - self.t0, ANSI.sub("", pending)))
        os.close(self._master)

    def type_ctrl_c(self) -> None:
        """What pressing Ctrl-C does: the terminal's line discipline signals its foreground group."""
        os.write(self._master, b"\x03")

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
        """The Dask worker processes of the CLI."""
        return worker_processes(self.proc.pid)

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
        """The CLI's exit code, or None after ``timeout``: then its threads' stacks (SIGUSR1)
        join the timeline, to show where it is stuck."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGUSR1)
                time.sleep(1.0)
            return None

    def kill_session(self) -> None:
        for p in self.session():
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


@pytest.fixture
def cli_run(h, tmp_path):
    runs = []

    def start(*overrides, **kwargs):
        runs.append(CliRun(h, tmp_path, *overrides, **kwargs))
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


def worker_addresses(workers: list[psutil.Process], timeout: float = 15.0) -> dict[int, str]:
    """pid -> Dask address of each worker, without talking to any of them: a worker listens on
    its comm port and its HTTP dashboard; the comm port is the one its peers are connected to
    (actor -> buffer trajectories, learner -> actor parameters). A connection can be down for a
    moment (a peer reconnecting), so the lookup is repeated until each worker has one."""
    deadline = time.monotonic() + timeout
    while True:
        listening, remote = {}, {}
        for p in workers:
            conns = p.net_connections(kind="tcp")
            listening[p.pid] = {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}
            remote[p.pid] = {c.raddr.port for c in conns if c.raddr and c.status == psutil.CONN_ESTABLISHED}
        out = {}
        for p in workers:
            peers = set().union(*(remote[q.pid] for q in workers if q.pid != p.pid))
            comm = listening[p.pid] & peers
            if len(comm) == 1:
                out[p.pid] = f"tcp://127.0.0.1:{comm.pop()}"
        if len(out) == len(workers):
            return out
        assert time.monotonic() < deadline, (listening, remote)
        time.sleep(0.1)


def assert_results_open(run_dir: Path, status: str) -> dict:
    """Both files open and carry ``status``; returns their sizes, and ``error`` (the same in both)."""
    sizes, errors = {}, set()
    for name in ("metrics.nc", "episodes.nc"):
        path = run_dir / name
        assert path.is_file(), sorted(q.name for q in run_dir.iterdir())
        with xr.open_dataset(path, engine="netcdf4") as ds:
            ds.load()
            sizes[name] = dict(ds.sizes)
            assert ds.attrs["status"] == status, (name, ds.attrs["status"], ds.attrs["error"])
            errors.add(ds.attrs["error"])
    assert len(errors) == 1, errors
    return {**sizes, "error": errors.pop()}


def started(cli_run, algo: str, actors: int, *, terminal: bool) -> tuple[CliRun, list[psutil.Process]]:
    """A run whose learner has made updates; returns it and its processes."""
    run = cli_run(f"topology.actors={actors}", config=PPO_CONFIG if algo == "ppo" else None, terminal=terminal)
    run.wait_for_line(TRAINING, timeout=60)
    workers = run.workers()
    assert len(workers) == actors + 1, [w.cmdline() for w in workers]
    # the workers share the CLI's process group: a signal to the group reaches them
    assert {os.getpgid(w.pid) for w in workers} == {run.proc.pid}
    # the driver of a distributed run leaves torch to its workers: its learner packs what it saves
    assert "libtorch" not in Path(f"/proc/{run.proc.pid}/maps").read_text(), "the CLI process imported torch"
    return run, psutil.Process(run.proc.pid).children(recursive=True)


def assert_stopped_cleanly(h, run: CliRun, family: list[psutil.Process], code: int | None, expected: int) -> dict:
    assert code == expected, f"exit {code}, expected {expected}:\n{run.timeline()}"
    for crash in ("Traceback", "terminate called", "Worker holding"):
        assert crash not in run.stderr, run.stderr
    assert re.search(r"^stopped: ", run.stderr, re.M), run.stderr
    sizes = assert_results_open(run.out, "stopped")
    assert sizes["metrics.nc"]["time"] >= 1 and sizes["error"] == ""
    assert not [p.name for p in run.out.rglob("*") if ".tmp" in p.name], "half-written files left"
    saved = run.out / "checkpoint" / "checkpoint.json"
    assert saved.is_file(), f"no checkpoint:\n{run.timeline()}"
    assert json.loads(saved.read_text())["final"] is True
    assert h.wait_until(lambda: not any(alive(p) for p in family), timeout=5), [p.pid for p in family if alive(p)]
    assert h.wait_until(lambda: not run.session(), timeout=5), [p.cmdline() for p in run.session()]
    return sizes


@pytest.mark.timeout(90)
# each algorithm once, one and two actors between them: the stop is the driver's, whatever the
# hosts are, and the other tests of this module stop DQN with one actor and PPO with two
@pytest.mark.parametrize("algo,actors", [("dqn", 2), ("ppo", 1)])
def test_ctrl_c_at_a_terminal_stops_the_run_with_results_and_no_process_left(h, cli_run, algo, actors):
    run, family = started(cli_run, algo, actors, terminal=True)
    t_sig = time.monotonic()
    run.type_ctrl_c()  # the terminal signals the CLI and every worker
    code = run.finish(timeout=30)
    exit_s = time.monotonic() - t_sig
    sizes = assert_stopped_cleanly(h, run, family, code, 128 + signal.SIGINT)
    print(f"\nCtrl-C ({algo}, {actors} actors): exit {code} after {exit_s:.1f} s, {sizes}")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("algo,actors", [("ppo", 2)])
def test_sigterm_to_the_process_group_stops_the_run(h, cli_run, algo, actors):
    run, family = started(cli_run, algo, actors, terminal=False)
    t_sig = time.monotonic()
    os.killpg(run.proc.pid, signal.SIGTERM)  # what a batch system's cancel or time limit does
    code = run.finish(timeout=30)
    exit_s = time.monotonic() - t_sig
    sizes = assert_stopped_cleanly(h, run, family, code, 128 + signal.SIGTERM)
    print(f"\nSIGTERM to the group ({algo}, {actors} actors): exit {code} after {exit_s:.1f} s, {sizes}")


@pytest.mark.timeout(90)
def test_sigterm_to_the_cli_alone_stops_the_run(h, cli_run):
    run, family = started(cli_run, "dqn", 1, terminal=False)
    # `kill -USR1 PID` first: the stacks of all its threads on stderr, and the run goes on
    t_usr1 = time.monotonic() - run.t0
    os.kill(run.proc.pid, signal.SIGUSR1)
    run.wait_for_line(re.compile(r"^Thread 0x[0-9a-f]+ \(most recent call first\)"), timeout=10, since=t_usr1)
    run.wait_for_line(re.compile(r'File ".*tianji_dask/cli\.py", line \d+ in cmd_train'), timeout=10, since=t_usr1)
    assert run.proc.poll() is None, run.timeline()
    os.kill(run.proc.pid, signal.SIGTERM)  # `kill PID`
    assert_stopped_cleanly(h, run, family, run.finish(timeout=30), 128 + signal.SIGTERM)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("moment", ["cluster starting", "worker starting", "cluster up"])
def test_ctrl_c_while_the_run_starts_stops_it_at_once_with_no_checkpoint(h, cli_run, moment):
    """Ctrl-C while the run's LocalCluster starts (its fork server importing), while its first
    worker process starts, or once it is up and the hosts are being created: the start is given
    up within seconds (not after the cluster and hosts have started), every process of the run
    ends, the results say ``stopped``, and no checkpoint is written (its learner never trained);
    ``--resume`` of it says why there is nothing to continue, and changes nothing."""
    run = cli_run("topology.actors=2", terminal=True)
    if moment == "cluster starting":  # the CLI says where its results go, then starts the cluster
        run.wait_for_line(re.compile(r"run directory: "), timeout=60)
    elif moment == "worker starting":  # the first worker process exists; Dask is not loaded in any yet
        assert h.wait_until(run.workers, timeout=60, interval=0.005), run.timeline()
    else:  # the workers are up, the hosts are being created
        run.wait_for_line(re.compile(r"dashboard: "), timeout=60)
    family = psutil.Process(run.proc.pid).children(recursive=True)
    t_sig = time.monotonic()
    run.type_ctrl_c()
    code = run.finish(timeout=60)
    exit_s = time.monotonic() - t_sig
    assert code == 128 + signal.SIGINT, f"exit {code}:\n{run.timeline()}"
    assert "Traceback" not in run.stderr, run.stderr
    assert not (run.out / "checkpoint").exists(), sorted(p.name for p in run.out.rglob("*"))
    assert re.search(r"^stopped: 0 env steps", run.stderr, re.M), run.stderr
    assert "no checkpoint written" in run.stderr, run.stderr
    assert_results_open(run.out, "stopped")
    assert h.wait_until(lambda: not any(alive(p) for p in family), timeout=5), [p.pid for p in family if alive(p)]
    assert h.wait_until(lambda: not run.session(), timeout=5), [p.cmdline() for p in run.session()]
    # the cluster's start (seconds of imports) and the hosts' are not waited out
    assert exit_s < 5.0, f"exit {exit_s:.1f} s after Ctrl-C:\n{run.timeline()}"
    print(f"\nCtrl-C while {moment}: exit {code} after {exit_s:.1f} s")

    before = {p: p.stat().st_mtime_ns for p in run.out.rglob("*")}
    resumed = subprocess.run(
        [sys.executable, "-m", "tianji_dask.cli", "train", "--resume", str(run.out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 2, resumed.stderr
    assert "stopped before its learner made an update" in resumed.stderr, resumed.stderr
    assert f"tianji-dask train {run.out / 'config.yaml'}" in " ".join(resumed.stderr.split()), resumed.stderr
    assert {p: p.stat().st_mtime_ns for p in run.out.rglob("*")} == before


@pytest.mark.timeout(150)
def test_a_second_ctrl_c_stops_at_once_and_still_leaves_nothing_behind(h, cli_run):
    # the waits end on the lines; their timeouts only bound a failure (a loaded machine takes seconds)
    run, family = started(cli_run, "dqn", 2, terminal=True)
    run.type_ctrl_c()
    t_first = run.wait_for_line(re.compile(r"SIGINT: stopping all hosts"), timeout=30)
    run.type_ctrl_c()
    run.wait_for_line(re.compile(r"SIGINT again: no more waiting"), timeout=30, since=t_first)
    assert_stopped_cleanly(h, run, family, run.finish(timeout=30), 128 + signal.SIGINT)


@pytest.mark.timeout(120)
def test_killed_worker_is_reported_as_lost_and_fails_the_run(h, cli_run):
    timeout = 3.0
    run = cli_run(f"run.heartbeat_timeout={timeout}", "run.max_restarts=0")
    run.wait_for_line(PROGRESS, timeout=60)
    time.sleep(2)
    workers = run.workers()
    assert len(workers) == 2, [w.cmdline() for w in workers]
    # The buffer and learner go to the first worker by address (placement.place);
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
    assert h.wait_until(lambda: not any(alive(p) for p in family), timeout=5), [p.pid for p in family if alive(p)]
    # the nanny restarted the killed worker: that new process must be gone too
    assert h.wait_until(lambda: not run.session(), timeout=5), [p.cmdline() for p in run.session()]
    print(f"\nSIGKILL: lost host reported {t_report:.1f} s after the kill, exit 1 after {exit_s:.1f} s, {sizes}")
    print(f"killed at {killed_at:.2f} s:\n{run.timeline(since=killed_at - 1)}")
