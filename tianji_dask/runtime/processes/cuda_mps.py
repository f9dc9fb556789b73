"""A private CUDA MPS daemon for the run's own LocalCluster.

Two processes with CUDA contexts on one GPU (a learner and an actor) take turns in time
slices: each of the actor's small inference calls waits for the learner's slice to end, and its
emulators wait with it. Under CUDA's Multi-Process Service their kernels run side by side. A run
whose LocalCluster has two or more CUDA processes starts an MPS control daemon of its own (its
pipe and log directories in a fresh temporary directory, so it serves only the run's workers
and meets no other daemon) and stops it when the cluster has closed. The deployment setting
``tianji.local-cluster.cuda-mps`` (``tianji.yaml``) says when.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tianji_dask.config.errors import ConfigError

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig

CONTROL = "nvidia-cuda-mps-control"
PIPE_VARIABLE = "CUDA_MPS_PIPE_DIRECTORY"
LOG_VARIABLE = "CUDA_MPS_LOG_DIRECTORY"
START_TIMEOUT_S = 10.0
START_POLL_S = 0.05  # how often the start looks for the daemon's control pipe
STOP_TIMEOUT_S = 10.0

# the daemon gets SIGTERM when the thread that started it ends, so a driver killed with
# SIGKILL leaves no daemon behind (PR_SET_PDEATHSIG survives the exec)
_EXEC_DYING_WITH_PARENT = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


def dying_with_parent(argv: list[str], **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(argv)`` of a program that gets SIGTERM when the calling thread ends."""
    return subprocess.Popen([sys.executable, "-c", _EXEC_DYING_WITH_PARENT, *argv], **popen_kwargs)


def cuda_processes(cfg: ExperimentConfig) -> int:
    """How many of the run's host processes use CUDA: learners (each with its buffer) and actors."""
    t = cfg.topology
    learners = t.groups * t.learners if cfg.learner.device != "cpu" else 0
    actors = t.groups * t.actors if cfg.actor.device != "cpu" else 0
    return learners + actors


def mps_control(setting: str, cfg: ExperimentConfig) -> str | None:
    """The MPS control program to start a private daemon with for ``cfg``'s own LocalCluster,
    or None where the setting is ``off``, fewer than two processes use CUDA, or
    ``CUDA_MPS_PIPE_DIRECTORY`` names a daemon of the user's own. ``on`` without the program on
    PATH is a :class:`ConfigError`; ``auto`` then goes without."""
    if setting == "off" or cuda_processes(cfg) < 2 or os.environ.get(PIPE_VARIABLE):
        return None
    control = shutil.which(CONTROL)
    if control is None and setting == "on":
        raise ConfigError(
            f"tianji.local-cluster.cuda-mps=on, but {CONTROL} is not on PATH: install the NVIDIA "
            "driver's utilities or put their directory on PATH, or set the setting to auto or off "
            "(DASK_TIANJI__LOCAL_CLUSTER__CUDA_MPS=auto)"
        )
    return control


class PrivateMps:
    """An MPS control daemon serving the processes given :attr:`env`; a context manager that
    starts it (``RuntimeError`` when it does not come up in ``START_TIMEOUT_S``) and stops it."""

    def __init__(self, control: str):
        self.control = control
        self.root = Path(tempfile.mkdtemp(prefix="tianji-mps-"))
        self.env = {PIPE_VARIABLE: str(self.root / "pipe"), LOG_VARIABLE: str(self.root / "log")}
        self._daemon: subprocess.Popen | None = None

    def __enter__(self) -> PrivateMps:
        return self.start()

    def start(self) -> PrivateMps:
        try:
            self._start()
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self) -> None:
        for directory in self.env.values():
            os.makedirs(directory)
        with open(self.root / "daemon.out", "wb") as out:
            self._daemon = dying_with_parent(
                [self.control, "-f"],
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        control_pipe = Path(self.env[PIPE_VARIABLE]) / "control"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not control_pipe.exists():
            if (rc := self._daemon.poll()) is not None or time.monotonic() > deadline:
                said = (self.root / "daemon.out").read_text(errors="replace").strip().splitlines()[-3:]
                self.stop()
                why = f"exited with status {rc}" if rc is not None else f"did not open {control_pipe}"
                raise RuntimeError(f"{CONTROL} -f {why} in {START_TIMEOUT_S:.0f} s: {' | '.join(said) or 'no output'}")
            time.sleep(START_POLL_S)

    def stop(self) -> None:
        """Ask the daemon to quit (it stops its server once the clients have gone), kill it if
        it has not after ``STOP_TIMEOUT_S``, and remove its directories."""
        daemon, self._daemon = self._daemon, None
        if daemon is not None and daemon.poll() is None:
            try:
                subprocess.run(
                    [self.control],
                    input=b"quit\n",
                    env={**os.environ, **self.env},
                    capture_output=True,
                    timeout=STOP_TIMEOUT_S,
                    check=False,
                )
                daemon.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        self._remove()

    def _remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
