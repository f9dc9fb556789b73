"""Dask actors that host the role loops: ``ActorHost``, ``BufferHost``, ``LearnerHost``.

Each host runs its role's loop in a thread it owns. Never in a plain ``def`` actor
method: all sync actor methods of a worker share ONE thread, so an endless sync
loop would freeze every host on that worker. The ``async def`` methods
``start``, ``stop``, ``stats`` and ``error`` run on the worker's event loop and
stay callable while the loop runs.

Every ``run.metrics_interval`` seconds a host sends its heartbeat (cumulative
counters plus finished episodes) through ``Worker.log_event`` on the run's topic;
the driver receives them with ``Client.subscribe_topic``. A failure inside a loop
is sent as a heartbeat with an ``error`` field, so the driver stops the run
instead of waiting for a host that died.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback

import numpy as np
import psutil
from distributed import get_worker

from tianji_dask.channels import ChannelService, QueueSender, TopicPublisher
from tianji_dask.config import ExperimentConfig

# Buffer roles of this process by run id: a learner shares its buffer's process and
# samples from it directly (batches are local; nothing is copied between processes).
_LOCAL_BUFFERS: dict[str, object] = {}
FIRST_PARAMS_TIMEOUT_S = 60.0


def metrics_topic(run_id: str) -> str:
    return f"tianji-{run_id}"


def stop_event_name(run_id: str) -> str:
    """The run's global stop: a ``distributed.Event`` every host watches."""
    return f"tianji-stop-{run_id}"


class _LoopHost:
    """A role loop in an owned thread, with heartbeats and a clean stop."""

    role_name = "?"

    def __init__(self, run_id: str, config_json: str, host_id: int):
        self.run_id = run_id
        self.cfg = ExperimentConfig.model_validate_json(config_json)
        self.id = host_id
        self.worker = get_worker()
        self.role = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self._last: dict = {}
        self._proc = psutil.Process()

    def _comm_kwargs(self) -> dict:
        """Where channel I/O runs (this worker's event loop) and how it connects (its security)."""
        return {"loop": self.worker.loop.asyncio_loop,
                "connection_args": self.worker.security.get_connection_args("worker")}

    # --- control plane (event loop) -------------------------------------------------
    async def start(self) -> str:
        """Start the loop thread; returns the worker address hosting this role."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=f"tianji-{self.role_name}-{self.id}",
                                            daemon=True)
            self._thread.start()
            self._watcher = asyncio.ensure_future(self._watch_global_stop())
        return self.worker.address

    async def _watch_global_stop(self) -> None:
        from distributed import Event

        client = self.worker._get_client()
        try:
            await Event(stop_event_name(self.run_id), client=client).wait()
        except asyncio.CancelledError:
            return
        except Exception:  # noqa: BLE001 - scheduler gone: the heartbeat supervision takes over
            return
        self._stop.set()

    async def stop(self, timeout: float = 10.0) -> dict:
        """Ask the loop to finish, wait for it (up to ``timeout``) and return the last heartbeat."""
        self._stop.set()
        if getattr(self, "_watcher", None) is not None:
            self._watcher.cancel()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, timeout)
        return self._last

    async def stats(self) -> dict:
        """The latest heartbeat: counters and rates' raw material (cheap; callable anytime)."""
        return self._last

    async def error(self) -> str | None:
        return self._error

    # --- loop thread ------------------------------------------------------------------
    def _main(self) -> None:
        import torch

        torch.set_num_threads(self.cfg.topology.torch_threads)
        interval = self.cfg.run.metrics_interval
        try:
            self.role = self._make_role()
            self._before_loop()
            next_beat = time.monotonic()
            step = self._step
            while not self._stop.is_set():
                step()
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + interval
                    self._beat()
        except BaseException as exc:  # noqa: BLE001 - reported to the driver, then the thread ends
            self._error = f"{self.role_name} {self.id} on {self.worker.address}: {exc!r}\n{traceback.format_exc()}"
        finally:
            try:
                self._after_loop()
            except Exception as exc:  # noqa: BLE001
                self._error = self._error or f"{self.role_name} {self.id}: cleanup failed: {exc!r}"
            self._beat()

    def _beat(self) -> None:
        if self.role is None:
            hb = {"role": self.role_name, "id": self.id, "t": time.time(), "counters": {}, "episodes": []}
        else:
            hb = self.role.heartbeat()
        hb["counters"]["rss_mb"] = self._proc.memory_info().rss / 1e6
        if self._error:
            hb["error"] = self._error
        hb["run"] = self.run_id
        self._last = hb
        self.worker.log_event(metrics_topic(self.run_id), hb)

    def _step(self) -> None:
        self.role.step()

    def _before_loop(self) -> None:
        pass

    def _after_loop(self) -> None:
        pass


class BufferHost(_LoopHost):
    """Receives trajectory chunks on channel ``channel`` of its worker into replay memory."""

    role_name = "buffer"

    def __init__(self, run_id: str, config_json: str, host_id: int, seed: int, channel: str,
                 obs_shape: tuple, obs_dtype: str):
        super().__init__(run_id, config_json, host_id)
        from tianji_dask.roles import make_buffer_role

        inbox = ChannelService.current().open_queue(channel, self.cfg.channel.capacity_bytes
                                                    * max(1, self.cfg.topology.actors))
        self.channel = channel
        self.role = make_buffer_role(self.cfg, inbox, tuple(obs_shape), np.dtype(obs_dtype), seed, host_id)
        _LOCAL_BUFFERS[run_id] = self.role

    def _make_role(self):
        return self.role

    def _step(self) -> None:
        self.role.ingest(timeout=0.05)

    def _after_loop(self) -> None:
        _LOCAL_BUFFERS.pop(self.run_id, None)
        ChannelService.for_worker(self.worker).close(self.channel)


class LearnerHost(_LoopHost):
    """Trains on its co-located buffer and publishes parameters to ``subscribers``."""

    role_name = "learner"

    def __init__(self, run_id: str, config_json: str, host_id: int, seed: int,
                 subscribers: list, obs_dim: int, n_actions: int):
        super().__init__(run_id, config_json, host_id)
        self._args = (seed, [tuple(s) for s in subscribers], obs_dim, n_actions)
        if run_id not in _LOCAL_BUFFERS:
            raise RuntimeError(f"LearnerHost for run {run_id} must be placed on its BufferHost's worker "
                               f"({self.worker.address} has none)")

    def _make_role(self):
        from tianji_dask.roles import learner_role_class

        seed, subscribers, obs_dim, n_actions = self._args
        self.publisher = TopicPublisher(subscribers, **self._comm_kwargs())
        return learner_role_class(self.cfg)(self.cfg, _LOCAL_BUFFERS[self.run_id], self.publisher,
                                            obs_dim, n_actions, seed)

    def _before_loop(self) -> None:
        self.role.publish()  # version 0: actors start acting as soon as it lands

    def _step(self) -> None:
        if not self.role.step():
            time.sleep(0.0002)

    def _after_loop(self) -> None:
        self.publisher.close(timeout=2.0)

    async def checkpoint(self) -> tuple[dict, dict]:
        """(tensors, metadata) of the learner's full state; call after ``stop``."""
        core = self.role.core
        return core.state(), {"updates": core.updates, "samples": self.role.counters["samples"],
                              "algo": self.cfg.algo.name, "env_id": self.cfg.env.id}


class ActorHost(_LoopHost):
    """Steps a vector env with the newest parameters and pushes chunks to the buffer."""

    role_name = "actor"

    def __init__(self, run_id: str, config_json: str, host_id: int, seed: int,
                 buffer_address: str, traj_channel: str, params_channel: str):
        super().__init__(run_id, config_json, host_id)
        self.params_channel = params_channel
        self.params = ChannelService.current().open_latest(params_channel)
        self._args = (seed, buffer_address, traj_channel)

    def _make_role(self):
        from tianji_dask.roles import actor_role_class

        seed, buffer_address, traj_channel = self._args
        c = self.cfg.channel
        self.sender = QueueSender(buffer_address, traj_channel, f"actor-{self.id}", c.capacity_bytes,
                                  full_policy=c.full_policy, **self._comm_kwargs())
        return actor_role_class(self.cfg)(self.cfg, self.id, seed, self.sender, self.params)

    def _before_loop(self) -> None:
        # the only wait of an actor: for the first parameters; heartbeats go on meanwhile
        interval = self.cfg.run.metrics_interval
        deadline = time.monotonic() + FIRST_PARAMS_TIMEOUT_S
        while not self._stop.is_set():
            try:
                self.role.wait_for_params(timeout=interval, stop=self._stop.is_set)
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"actor {self.id}: no parameters from the learner after "
                                       f"{FIRST_PARAMS_TIMEOUT_S:.0f} s") from None
                self._beat()

    def _after_loop(self) -> None:
        try:
            if self.role is not None:
                self.role.close()
                self.sender.close(timeout=2.0)
        finally:
            # opened in __init__: left open, every run would leave an inbox (holding its last
            # parameters) on the worker for good
            ChannelService.for_worker(self.worker).close(self.params_channel)
