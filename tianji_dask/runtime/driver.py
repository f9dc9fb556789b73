"""The driver: starts a run's hosts, supervises them, records metrics, stops everything.

``train(config, client=None)`` returns a :class:`Run` handle at once; the run
proceeds in a background thread. ``run.wait()`` blocks until it ends and
returns a :class:`RunResult`; ``run.stop()`` ends it early; ``run.metrics()``
gives the metrics recorded so far as an xarray Dataset.

With no client the driver starts a ``LocalCluster`` bound to 127.0.0.1 with one
single-threaded worker process per actor plus one for the buffer and learner
(they share a process so batches stay local), and closes it at the end. A
client passed in is used as it is and left open. The same handle runs the
serial reference (``serial=True``): the role objects in this process, no Dask.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, overload

from tianji_dask.config import ConfigError, ExperimentConfig, check_env
from tianji_dask.config.deployment import deployment_settings
from tianji_dask.config.schema import DQNConfig
from tianji_dask.results.recorder import MetricsRecorder
from tianji_dask.results.resumable import ResumePoint, check_resumable
from tianji_dask.results.rundir import prepare_run_dir, run_name, write_config
from tianji_dask.runtime.restarts import HostLost

if TYPE_CHECKING:
    from tianji_dask.runtime.cluster import RunCluster

FINISHED = ("target_reached", "max_env_steps", "max_seconds")
HURRIED_CHECKPOINT_S = 5.0  # how long a run told to stop at once still waits for the final checkpoint


@dataclass
class RunResult:
    """How a run ended. ``status`` is one of ``target_reached``, ``max_env_steps``,
    ``max_seconds``, ``stopped`` (``Run.stop``/Ctrl-C) or ``failed`` (``error`` says why).
    metrics.nc and episodes.nc carry both as their ``status`` and ``error`` attrs."""

    status: str
    run_dir: Path
    wall_s: float
    env_steps: int
    return_mean_100: float
    time_to_target_s: float
    error: str | None = None
    final_row: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in FINISHED


def check_before_start(cfg: ExperimentConfig, *, on_this_machine: bool, serial: bool):
    """What a run checks before it starts anything: the env (built once; its spaces are
    returned) and, where the run's replay memories live on this machine (its own LocalCluster,
    or serial), that they fit. Raises :class:`ConfigError`."""
    spaces = check_env(cfg)
    if on_this_machine:
        check_replay_fits(cfg, spaces, serial=serial)
    return spaces


def check_replay_fits(cfg: ExperimentConfig, spaces, *, serial: bool, available: int | None = None) -> None:
    """Refuse, before anything starts, a run on this machine (its own LocalCluster, or serial)
    whose DQN replay memories would take more than 90 % of the memory available now."""
    import psutil

    from tianji_dask.algos.registry import spec_for

    replay_nbytes = spec_for(cfg).replay_nbytes
    obs = spaces.observation_space
    per_buffer = replay_nbytes(cfg, obs.shape, obs.dtype)
    if not per_buffer:
        return
    capacity = cfg.algo_as(DQNConfig).buffer_size  # only a replay algorithm keeps a replay
    buffers = 1 if serial else cfg.topology.groups * cfg.topology.learners
    if available is None:
        available = psutil.virtual_memory().available
    budget = 0.9 * available
    if per_buffer * buffers <= budget:
        return
    lo, hi = 0, capacity  # the largest size that fits (bytes grow with it)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if replay_nbytes(cfg, obs.shape, obs.dtype, capacity=mid) * buffers <= budget:
            lo = mid
        else:
            hi = mid - 1
    fits = lo
    gib = 2**30
    raise ConfigError(
        f"algo.buffer_size={capacity:,} needs {per_buffer / gib:.2f} GiB of replay per "
        f"buffer x {buffers} buffer(s) = {per_buffer * buffers / gib:.2f} GiB, more than 90 % of the "
        f"{available / gib:.2f} GiB this machine has available; lower algo.buffer_size to at most "
        f"{fits:,}, or train on a cluster with more memory (--scheduler, --slurm)"
    )


class Run:
    """Handle to a running training job (see the module docstring for the protocol)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        *,
        client=None,
        out: Path | None = None,
        serial: bool = False,
        on_row=None,
        on_event=None,
        runs_root: Path | None = None,
        tls: bool = False,
        resume: ResumePoint | None = None,
    ):
        deployment_settings()  # a wrong tianji.* Dask setting is refused before anything starts
        if resume is not None and serial:
            raise ConfigError("resume continues distributed runs; the serial reference has nothing to continue")
        self.cfg = cfg
        self.serial = serial
        self._resume = resume
        self.security = _run_security(tls, client, serial)
        self.spaces = check_before_start(cfg, on_this_machine=client is None, serial=serial)
        if resume is None:
            self.name = run_name(cfg.env.id, cfg.algo.name, cfg.seed)
            self.run_dir = prepare_run_dir(out, root=runs_root, name=self.name)
        else:
            self.name, self.run_dir = resume.run_dir.name, resume.run_dir
        write_config(self.run_dir, cfg.model_dump_yaml())
        self.id = uuid.uuid4().hex[:10]
        self._client = client
        self._on_row = on_row or (lambda row: None)
        self._on_event = on_event or (lambda text: None)
        self._stop_reason: str | None = None
        self._stop_requested = threading.Event()
        self._hurry = threading.Event()
        self._done = threading.Event()
        self.result: RunResult | None = None
        self._final_row: dict | None = None  # the last row, once the hosts' final heartbeats are in
        self.t0 = time.time()
        self._next_save = self.t0 + cfg.run.save_interval
        self._next_checkpoint = self.t0 + cfg.run.checkpoint_interval
        # (state, metadata) of the running learner, set by each mode while it runs: the state as
        # tensors (serial) or packed by the learner's host (distributed)
        self._snapshot: Callable[[], tuple[dict | bytes, dict]] | None = None
        self.recorder = MetricsRecorder(
            run_name=self.name,
            target_return=cfg.stop.target_return,
            config_json=cfg.to_json(),
            t0=self.t0,
            attrs={"mode": "serial" if serial else "distributed", "env_id": cfg.env.id, "seed": cfg.seed},
        )
        if resume is not None:
            self.recorder.continue_from(resume.metrics, resume.episodes)
        self.dashboard_link: str | None = None
        self.scheduler_address: str | None = None  # once the run's cluster is up: wait_for_cluster()
        self._cluster_up = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"tianji-driver-{self.id}", daemon=True)
        self._thread.start()

    # --- public -------------------------------------------------------------------------
    def stop(self, reason: str = "stopped", *, now: bool = False) -> None:
        """Ask the run to stop; returns at once (``wait()`` for the end).

        ``now=True`` (a second Ctrl-C) also stops waiting for the hosts to finish cleanly and
        gives the final checkpoint only a few seconds (else the latest periodic one stays); the
        results are still written and every worker process the run started is still ended."""
        if self._stop_reason is None:
            self._stop_reason = reason
        if now:
            self._hurry.set()
        self._stop_requested.set()

    @overload
    def wait(self) -> RunResult: ...
    @overload
    def wait(self, timeout: float | None) -> RunResult | None: ...

    def wait(self, timeout: float | None = None) -> RunResult | None:
        """Block until the run has ended and its results are written; None on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done.wait(0.2):  # short waits keep Ctrl-C responsive in the caller
            if deadline is not None and time.monotonic() > deadline:
                return None
        return self.result

    def wait_for_cluster(self, timeout: float | None = 60.0) -> str:
        """The run's scheduler address, once its cluster is up: ``Client(run.wait_for_cluster(),
        security=run.security)`` connects to it (``run.scheduler_address`` is None until then).
        Raises ``RuntimeError`` for a serial run or one that ended first, ``TimeoutError`` after
        ``timeout`` seconds."""
        if self.serial:
            raise RuntimeError("a serial run has no cluster to connect to; train(cfg) without serial=True has one")
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._cluster_up.wait(0.2):  # short waits keep Ctrl-C responsive in the caller
            if self._done.is_set():
                why = self.result.error if self.result is not None and self.result.error else "it ended"
                raise RuntimeError(f"run {self.name}: no cluster to connect to: {why}")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.name}: its cluster was not up after {timeout:g} s")
        assert self.scheduler_address is not None
        return self.scheduler_address

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def metrics(self):
        """Metrics recorded so far (an ``xarray.Dataset``; see docs/metrics.md)."""
        return self.recorder.dataset()

    def episodes(self):
        return self.recorder.episodes_dataset()

    # --- stop rules ---------------------------------------------------------------------
    def _check_stop_rules(self) -> str | None:
        s = self.cfg.stop
        if s.target_return is not None and not math.isnan(self.recorder.time_to_target_s):
            return "target_reached"
        if s.max_env_steps is not None and self.recorder.env_steps >= s.max_env_steps:
            return "max_env_steps"
        # a continued run's budget counts the time before it too (the time axis of metrics.nc)
        if s.max_seconds is not None and time.time() - self.t0 + self.recorder.time_offset >= s.max_seconds:
            return "max_seconds"
        return None

    def _should_stop(self) -> bool:
        if self._stop_requested.is_set():
            return True
        reason = self._check_stop_rules()
        if reason:
            self.stop(reason)
            return True
        return False

    # --- main ---------------------------------------------------------------------------
    def _main(self) -> None:
        error = None
        try:
            if self.serial:
                self._run_serial()
            else:
                self._run_distributed()
        except HostLost as exc:
            error = str(exc)
        except BaseException as exc:  # noqa: BLE001 - any failure ends the run with results written
            import traceback

            error = f"{exc!r}\n{traceback.format_exc()}"
        finally:
            self._finish(error)

    def _finish(self, error: str | None) -> None:
        row = self._final_row if self._final_row is not None else self.recorder.row(time.time() - self.t0)
        status = "failed" if error else (self._stop_reason or "stopped")
        status, error = self._write_results(status, error)
        self.result = RunResult(
            status=status,
            run_dir=self.run_dir,
            wall_s=time.time() - self.t0,
            env_steps=self.recorder.env_steps,
            return_mean_100=self.recorder.return_mean_100,
            time_to_target_s=self.recorder.time_to_target_s,
            error=error,
            final_row=row,
        )
        self._done.set()

    def _write_results(self, status: str, error: str | None) -> tuple[str, str | None]:
        """Write the files with the run's outcome and return the outcome, which is ``failed``
        if the write failed; the files then say so too, if a second write gets through."""
        self.recorder.set_outcome(status, error)
        try:
            self.recorder.write(self.run_dir)
            return status, error
        except Exception as exc:  # noqa: BLE001 - the run has ended: report it, do not raise
            error = _append(error, f"writing results to {self.run_dir} failed: {exc!r}")
        self.recorder.set_outcome("failed", error)
        try:
            self.recorder.write(self.run_dir)
        except Exception as exc:  # noqa: BLE001
            error = _append(error, f"the second write, with status failed, failed too: {exc!r}")
        return "failed", error

    def _tick(self, next_row: float) -> float:
        now = time.time()
        if self.cfg.run.save_interval and now >= self._next_save:
            self._next_save = now + self.cfg.run.save_interval
            self._save_partial()
        if (
            self._snapshot is not None
            and self.cfg.run.checkpoint
            and self.cfg.run.checkpoint_interval
            and now >= self._next_checkpoint
        ):
            self._save_periodic_checkpoint()
            self._next_checkpoint = time.time() + self.cfg.run.checkpoint_interval
        if now >= next_row:
            self._on_row(self.recorder.row(now - self.t0))
            return now + self.cfg.run.metrics_interval
        return next_row

    def _last_row(self) -> None:
        """The run's last row, once no heartbeat can come any more: dated when the hosts stopped,
        so that rates over the run's rows (``benchmarks/ablation.py``) do not count the final
        checkpoint and the LocalCluster's shutdown after it (seconds) as time the hosts ran."""
        self._final_row = self.recorder.row(time.time() - self.t0)

    def _save_partial(self) -> None:
        # The files are replaced atomically, so a reader (or a crash) sees the previous or the new.
        try:
            self.recorder.write(self.run_dir)
        except Exception as exc:  # noqa: BLE001 - a full disk must not end a healthy run
            self._on_event(f"writing interim results to {self.run_dir} failed: {exc!r}")

    def _save_periodic_checkpoint(self) -> None:
        snapshot = self._snapshot
        if snapshot is None:  # the run is between its modes' loops
            return
        try:
            state, meta = snapshot()
            self._save_checkpoint(state, meta, final=False)
        except Exception as exc:  # noqa: BLE001 - a full disk or a slow learner must not end the run
            self._on_event(f"periodic checkpoint into {self.run_dir / 'checkpoint'} failed: {exc!r}; the run goes on")

    def _run_serial(self) -> None:
        from tianji_dask.runtime.serial import SerialRun

        run = SerialRun(self.cfg)
        # taken between two steps of the one loop: always a consistent state
        self._snapshot = lambda: (run.learner.state(), self._checkpoint_meta(run.learner))
        next_row = [time.time()]

        def emit(hb):
            self.recorder.add(hb)

        def should_stop():
            next_row[0] = self._tick(next_row[0])
            return self._should_stop()

        run.run(emit, should_stop)
        self._last_row()
        self._snapshot = None
        self._save_checkpoint(run.learner.state(), self._checkpoint_meta(run.learner), final=True)

    def _checkpoint_meta(self, learner) -> dict:
        return {**learner.checkpoint_meta(), "algo": self.cfg.algo.name, "env_id": self.cfg.env.id}

    def _save_checkpoint(self, state: dict | bytes, meta: dict, *, final: bool) -> None:
        """``final``: written at the run's end; else a periodic one of a run still going."""
        if not self.cfg.run.checkpoint:
            return
        from tianji_dask.results.checkpoint import save_checkpoint

        meta = {
            **meta,
            "run_name": self.name,
            "final": final,
            "env_steps": self.recorder.env_steps,
            "wall_s": round(time.time() - self.t0 + self.recorder.time_offset, 3),
        }
        save_checkpoint(self.run_dir / "checkpoint", state, meta)

    def _run_distributed(self) -> None:
        from tianji_dask.runtime.cluster import RunCluster
        from tianji_dask.runtime.forked_workers import start_fork_server

        if self._client is None:
            start_fork_server()  # the run's LocalCluster forks from it: its seconds of imports overlap ours

        with RunCluster(
            self.cfg, self._client, self.id, self._on_event, hurry=self._hurry, security=self.security
        ) as run_cluster:
            self.dashboard_link = run_cluster.dashboard_link
            self.scheduler_address = run_cluster.scheduler_address
            self._cluster_up.set()
            run_cluster.supervisor.subscribe(self.recorder.add)
            totals, add = self.recorder.host_total, self.recorder.add
            if self._resume is None:
                run_cluster.start_hosts(self.spaces, totals=totals, add_heartbeat=add)
            else:
                steps = self._resume.actor_env_steps()
                run_cluster.start_hosts(
                    self.spaces,
                    restore=self._resume.state,
                    prior=lambda key, counter: (
                        steps.get(key[1], 0) if (key[0], counter) == ("actor", "env_steps") else 0
                    ),
                    totals=totals,
                    add_heartbeat=add,
                )
                self._on_event(
                    f"continuing {self.run_dir.name} from {self.recorder.env_steps:,} env steps, "
                    f"learner at update {self._resume.meta.get('updates', 0):,}"
                )
            self.recorder.set_attrs(
                {"scheduler_address": run_cluster.scheduler_address, "worker_addresses": run_cluster.worker_addresses}
            )
            self._snapshot = run_cluster.learner_snapshot
            next_row = time.time()
            r = self.cfg.run
            keep_snapshots = r.max_restarts > 0 and r.snapshot_interval > 0
            next_snapshot = time.time() + r.snapshot_interval
            try:
                while not self._should_stop():
                    next_row = self._tick(next_row)
                    if keep_snapshots:
                        run_cluster.snapshots.collect()
                        if time.time() >= next_snapshot:
                            run_cluster.snapshots.take()
                            next_snapshot = time.time() + r.snapshot_interval
                    try:
                        lost = run_cluster.supervisor.check_health()
                        if lost and self._stop_requested.is_set():
                            # stopping anyway: what was lost is not re-created (nor counted against
                            # run.max_restarts); the final checkpoint says if the learner's was
                            break
                        if lost:
                            losses = run_cluster.recovery.recover(lost, self.recorder.host_total, self.recorder.add)
                            self.recorder.record_losses(**losses)
                    except HostLost as exc:  # say it now: stopping the other hosts takes a while
                        self._on_event(f"host lost: {str(exc).splitlines()[0]}; stopping the run")
                        raise
                    time.sleep(0.05)
            finally:
                self._snapshot = None
                run_cluster.stop_hosts()
                for hb in run_cluster.final_heartbeats():
                    self.recorder.add(hb)
                self._last_row()
            if self.cfg.run.checkpoint:
                self._save_final_checkpoint(run_cluster)

    def _save_final_checkpoint(self, run_cluster: RunCluster) -> None:
        from tianji_dask.runtime.cluster import LearnerLost

        if not self._hurry.is_set():
            try:
                self._save_learner_state(run_cluster.learner_checkpoint())
            except LearnerLost as exc:  # the run did finish: its status stays
                self._on_event(f"no final checkpoint: {exc}; the latest periodic one, if any, stays")
            return
        try:  # told to stop at once: a learner that answers at once still gets saved
            self._save_learner_state(run_cluster.learner_checkpoint(timeout=HURRIED_CHECKPOINT_S))
        except Exception as exc:  # noqa: BLE001 - the stop goes on; the latest periodic one stays
            self._on_event(f"final checkpoint skipped while stopping at once: {exc!r}")

    def _save_learner_state(self, saved: tuple[bytes, dict] | None) -> None:
        if saved is None:
            self._on_event("no final checkpoint: the run stopped before its learner was built")
            return
        self._save_checkpoint(*saved, final=True)


def _run_security(tls: bool, client, serial: bool):
    """The ``distributed.Security`` of a run's own TLS LocalCluster (certificates made for this
    run, in memory), or None. Raises ConfigError, before anything starts, where TLS cannot apply."""
    if not tls:
        return None
    if serial:
        raise ConfigError("tls: the serial reference runs in this process and opens no connection; drop tls")
    if client is not None:
        raise ConfigError(
            "tls: a client passed in keeps its own cluster's security; tls=True is for the run's own "
            "LocalCluster (for a TLS scheduler, pass a client made with distributed.Security, or set "
            "distributed.comm.tls.* in Dask's config and use --scheduler tls://...)"
        )
    try:
        from distributed import Security

        return Security.temporary()
    except ImportError as exc:
        raise ConfigError(
            f"tls: making the run's certificates needs the cryptography package ({exc}); pip install 'tianji-dask[tls]'"
        ) from None


def _append(error: str | None, line: str) -> str:
    return f"{error}\n{line}" if error else line


def resume(
    run_dir: str | Path,
    client=None,
    *,
    overrides: list[str] | tuple[str, ...] = (),
    on_row=None,
    on_event=None,
    tls: bool = False,
) -> Run:
    """Continue a stopped, crashed or time-limited run in its own directory and return its
    :class:`Run` handle at once: the learner from its checkpoint, the counters, episodes and
    curve from its ``metrics.nc`` and ``episodes.nc`` (extended, never shortened).
    ``overrides``: ``--set`` texts of ``stop.*`` and ``run.*`` keys (a new target, a longer
    budget). Raises ConfigError, with nothing in ``run_dir`` changed, for a directory that no run
    wrote, a missing checkpoint or results, or an override of the experiment itself."""
    point = check_resumable(run_dir, overrides)
    return Run(point.cfg, client=client, on_row=on_row, on_event=on_event, tls=tls, resume=point)


def train(
    config: ExperimentConfig,
    client=None,
    *,
    out: str | Path | None = None,
    serial: bool = False,
    on_row=None,
    on_event=None,
    tls: bool = False,
) -> Run:
    """Start a training run and return its :class:`Run` handle at once.

    ``client``: a ``distributed.Client`` of any cluster (LocalCluster, SLURMCluster,
    a scheduler address); None starts a LocalCluster sized for the run and closes
    it afterwards. ``tls=True`` (no client) makes that LocalCluster TLS only, with
    certificates made for the run (``run.security``; ``run.wait_for_cluster()`` returns its
    tls:// address once it is up). ``on_row(row)`` is called with every metrics row (progress
    display), ``on_event(text)`` with notable events (scheduler address, dashboard link,
    lost hosts).
    """
    return Run(
        config,
        client=client,
        out=Path(out) if out else None,
        serial=serial,
        on_row=on_row,
        on_event=on_event,
        tls=tls,
    )
