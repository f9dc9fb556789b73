"""The side of a host that runs in a thread of its own: its role's loop, heartbeats, a clean end.

Every ``run.metrics_interval`` seconds a host sends its heartbeat (cumulative counters plus
finished episodes) through ``Worker.log_event`` on the run's topic; the driver receives them
with ``Client.subscribe_topic``. A failure inside a loop is sent as a heartbeat with an ``error``
field, so the driver stops the run instead of waiting for a host that died.
"""

from __future__ import annotations

import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import psutil

from tianji_dask.devices import bind_thread
from tianji_dask.roles.heartbeats import COUNTERS, Heartbeat
from tianji_dask.roles.loop import LoopRole

if TYPE_CHECKING:
    from distributed import Worker

    from tianji_dask.config import ExperimentConfig


def metrics_topic(run_id: str) -> str:
    return f"tianji-{run_id}"


R = TypeVar("R", bound=LoopRole)


class HostLoop(ABC, Generic[R]):
    """A role loop in an owned thread, with heartbeats and a clean stop. A host builds its role
    (:meth:`_make_role`) and may change what a step is and what happens around the loop."""

    role_name = "?"
    #: the start-up phases this host reports (name -> a test of its built role); the time of
    #: each is taken when its test first holds, between two steps
    startup_phases: ClassVar[dict[str, Callable[[Any], bool]]] = {}

    def __init__(self, run_id: str, cfg: ExperimentConfig, host_id: int, incarnation: int, worker: Worker):
        self.run_id = run_id
        self.cfg = cfg
        self.id = host_id
        # 0 for the host the run started with, k for its k-th re-creation after a loss: the
        # recorder then carries the totals of the earlier ones (counters begin again at 0)
        self.incarnation = incarnation
        self.worker = worker
        self.role: R | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self._last: dict = {}
        self._proc = psutil.Process()
        self._ready_s: float | None = None  # from the loop thread's start to the loop's first step
        self._built_s: float | None = None  # from the loop thread's start to the role built
        # unix times of this host's start-up phases: "built", then those of startup_phases()
        self._startup: dict[str, float] = {}
        self._pending_phases: dict[str, Callable[[Any], bool]] = {}
        # seconds of the parts of its start the host itself times (a learner's prepare)
        self._start_parts: dict[str, float] = {}

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._main, name=f"tianji-{self.role_name}-{self.id}", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        import torch

        torch.set_num_threads(self._torch_threads())
        interval = self.cfg.run.metrics_interval
        try:
            bind_thread(self._device())
            began = time.monotonic()
            self.role = self._make_role()
            self._startup["built"] = time.time()
            self._built_s = time.monotonic() - began
            self._pending_phases = dict(self.startup_phases)
            self._before_loop()
            self._ready_s = time.monotonic() - began
            next_beat = time.monotonic()
            step = self._step
            while self._continue():
                if self._pending_phases:  # until each phase is seen: one test a step after that
                    self._note_phases()
                step()
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + interval
                    self._beat()
        except BaseException as exc:  # noqa: BLE001 - reported to the driver, then the thread ends
            self._error = f"{self.role_name} {self.id} on {self.worker.address}: {exc!r}\n{traceback.format_exc()}"
        finally:
            self._close()
            self._beat()

    def _note_phases(self) -> None:
        """Take the time of each start-up phase whose test holds now."""
        role = self._built
        for name, reached in list(self._pending_phases.items()):
            if reached(role):
                self._startup[name] = time.time()
                del self._pending_phases[name]

    def _close(self) -> None:
        """The role's and the host's cleanup: its channels closed (their names stay the run's)."""
        try:
            if self.role is not None:
                self.role.close()
            self._after_loop()
        except Exception as exc:  # noqa: BLE001
            self._error = self._error or f"{self.role_name} {self.id}: cleanup failed: {exc!r}"

    def _beat(self) -> None:
        if self.role is None:
            beat = Heartbeat(self.role_name, self.id, COUNTERS[self.role_name]())
        else:
            beat = self.role.heartbeat()
        with self._proc.oneshot():  # one read of /proc for the three figures
            proc = self._proc
            beat.counters.rss_mb = proc.memory_info().rss / 1e6
            beat.counters.open_fds = proc.num_fds()
            beat.counters.threads = proc.num_threads()
        hb = beat.message()
        if self._error:
            hb["error"] = self._error
        hb["run"] = self.run_id
        hb["incarnation"] = self.incarnation
        if self._ready_s is not None:
            hb["ready_s"] = self._ready_s
            hb["built_s"] = self._built_s
            hb["build_parts"] = {**getattr(self.role, "build_parts", {}), **self._start_parts}
        if self._startup:
            hb["startup"] = dict(self._startup)
        self._last = hb
        self.worker.log_event(metrics_topic(self.run_id), hb)

    @property
    def _built(self) -> R:
        """The role, in the loop thread once ``_make_role`` has built it."""
        if self.role is None:
            raise RuntimeError(f"{self.role_name} {self.id}: the role was used before it was built")
        return self.role

    def _torch_threads(self) -> int:
        return self.cfg.topology.torch_threads

    def _device(self) -> str:
        """The device this host's role computes on (a learner's and its buffer's by default)."""
        return self.cfg.learner.device

    @abstractmethod
    def _make_role(self) -> R:
        """Build the role, in the loop thread before the loop starts."""

    def _continue(self) -> bool:
        return not self._stop.is_set()

    def _step(self) -> None:
        self._built.step()

    def _before_loop(self) -> None:
        pass

    def _after_loop(self) -> None:
        pass
