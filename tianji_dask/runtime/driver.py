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

The run's thread runs its mode (``serial_mode.run_serial`` or ``distributed_mode.DistributedMode``);
both share a ``run_loop.RunLoop`` (the stop check and the periodic duties), which writes through a
``result_writer.ResultWriter`` and a ``checkpoint_writer.CheckpointWriter``.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, overload

from tianji_dask.config import ConfigError, ExperimentConfig
from tianji_dask.config.deployment import deployment_settings
from tianji_dask.errors import HostLost
from tianji_dask.results.recorder import MetricsRecorder
from tianji_dask.results.resumable import ResumePoint, check_resumable
from tianji_dask.results.rundir import prepare_run_dir, run_name, write_config
from tianji_dask.results.tensorboard import TensorBoardRows
from tianji_dask.runtime.checkpoint_writer import CheckpointWriter
from tianji_dask.runtime.checks import check_before_start
from tianji_dask.runtime.distributed_mode import DistributedMode
from tianji_dask.runtime.result_writer import ResultWriter
from tianji_dask.runtime.run_loop import RunLoop, Stopping
from tianji_dask.runtime.serial_mode import run_serial
from tianji_dask.runtime.startup_timeline import StartupTimeline
from tianji_dask.runtime.training_evaluation import TrainingEvaluations

if TYPE_CHECKING:
    from tianji_dask.runtime.cluster.cluster import RunCluster

FINISHED = ("target_reached", "eval_target_reached", "max_env_steps", "max_seconds")


@dataclass
class RunResult:
    """How a run ended. ``status`` is one of ``target_reached``, ``eval_target_reached``, ``max_env_steps``,
    ``max_seconds``, ``stopped`` (``Run.stop``/Ctrl-C) or ``failed`` (``error`` says why).
    metrics.nc and episodes.nc carry both as their ``status`` and ``error`` attrs.
    ``time_to_target_s`` is the training return's (``stop.target_return``), ``time_to_eval_target_s``
    the ``eval_time`` of the first evaluation that reached ``stop.target_eval_return`` (NaN: none)."""

    status: str
    run_dir: Path
    wall_s: float
    env_steps: int
    return_mean_100: float
    time_to_target_s: float
    error: str | None = None
    time_to_eval_target_s: float = math.nan
    final_row: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in FINISHED


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
        started_at: float | None = None,
        plan: Mapping[str, float | str] | None = None,
    ):
        deployment_settings()  # a wrong tianji.* Dask setting is refused before anything starts
        if resume is not None and serial:
            raise ConfigError("resume continues distributed runs; the serial reference has nothing to continue")
        self.cfg = cfg
        self.serial = serial
        self.security = _run_security(tls, client, serial)
        self.spaces = check_before_start(cfg, on_this_machine=client is None, serial=serial)
        if resume is None:
            self.name = run_name(cfg.env.id, cfg.algo.name, cfg.seed)
            self.run_dir = prepare_run_dir(out, root=runs_root, name=self.name)
        else:
            self.name, self.run_dir = resume.run_name, resume.run_dir
        write_config(self.run_dir, cfg.model_dump_yaml())
        self.id = uuid.uuid4().hex[:10]
        on_event = on_event or (lambda text: None)
        self._stopping = Stopping()
        self._done = threading.Event()
        self.result: RunResult | None = None
        self.t0 = time.time()
        self.recorder = _recorder(cfg, self.name, self.t0, serial=serial, resume=resume, plan=plan)
        self._tensorboard = TensorBoardRows(self.run_dir, self.t0) if cfg.run.tensorboard else None
        self._loop = self._run_loop(on_row or (lambda row: None), on_event, resume)
        self.startup = self._startup_timeline(started_at, on_event)
        self._mode: Callable[[], None] = (
            partial(run_serial, self._loop)
            if serial
            else DistributedMode(
                self._loop,
                client=client,
                run_id=self.id,
                security=self.security,
                spaces=self.spaces,
                resume=resume,
                on_event=on_event,
                on_cluster_up=self._cluster_is_up,
                startup=self.startup,
            ).run
        )
        self.dashboard_link: str | None = None
        self.scheduler_address: str | None = None  # once the run's cluster is up: wait_for_cluster()
        self._cluster_up = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"tianji-driver-{self.id}", daemon=True)
        self._thread.start()

    def _run_loop(self, on_row: Callable[[dict], None], on_event: Callable[[str], None], resume) -> RunLoop:
        """The run's loop with its writers: results, checkpoints and, if asked, evaluations and
        TensorBoard's rows (before ``on_row``)."""
        cfg = self.cfg
        if self._tensorboard is not None:
            on_row = _both(self._tensorboard, on_row)
        checkpoints = CheckpointWriter(
            cfg, run_name=self.name, run_dir=self.run_dir, tally=self.recorder.tally, t0=self.t0, on_event=on_event
        )
        evaluations = None
        if cfg.run.eval_every_env_steps:
            evaluations = TrainingEvaluations(
                cfg,
                self.recorder,
                checkpoints,
                t0=self.t0,
                on_event=on_event,
                on_evaluation=self._tensorboard.evaluation if self._tensorboard is not None else lambda record: None,
                skipped=int(resume.metrics.attrs.get("eval_skipped", 0)) if resume is not None else 0,
            )
        return RunLoop(
            cfg,
            self.recorder,
            t0=self.t0,
            stopping=self._stopping,
            results=ResultWriter(self.recorder, self.run_dir, on_event),
            checkpoints=checkpoints,
            evaluations=evaluations,
            on_row=on_row,
        )

    # --- public -------------------------------------------------------------------------
    def stop(self, reason: str = "stopped", *, now: bool = False) -> None:
        """Ask the run to stop; returns at once (``wait()`` for the end).

        ``now=True`` (a second Ctrl-C) also stops waiting for the hosts to finish cleanly and
        gives the final checkpoint only a few seconds (else the latest periodic one stays); the
        results are still written and every worker process the run started is still ended."""
        self._stopping.request(reason, now=now)

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

    # --- the run's thread ---------------------------------------------------------------
    def _main(self) -> None:
        error = None
        try:
            self._mode()
        except HostLost as exc:
            error = str(exc)
        except BaseException as exc:  # noqa: BLE001 - any failure ends the run with results written
            import traceback

            error = f"{exc!r}\n{traceback.format_exc()}"
        finally:
            if self._loop.evaluations is not None:
                self._loop.evaluations.close()
            self._finish(error)

    def _startup_timeline(self, started_at: float | None, on_event: Callable[[str], None]) -> StartupTimeline:
        """The run's start-up timeline, from ``started_at`` (the process's start) or this call."""
        if started_at is None:
            return StartupTimeline(self.t0, "train() call", on_complete=partial(self._startup_complete, on_event))
        return StartupTimeline(started_at, "process start", on_complete=partial(self._startup_complete, on_event))

    def _startup_complete(self, on_event: Callable[[str], None], line: str) -> None:
        self.recorder.set_attrs(self.startup.attrs())
        on_event(line)

    def _cluster_is_up(self, run_cluster: RunCluster) -> None:
        self.dashboard_link = run_cluster.dashboard_link
        self.scheduler_address = run_cluster.scheduler_address
        self._cluster_up.set()

    def _finish(self, error: str | None) -> None:
        final_row = self._loop.final_row
        row = final_row if final_row is not None else self.recorder.row(time.time() - self.t0)
        status = "failed" if error else (self._stopping.reason or "stopped")
        status, error = self._loop.results.write_outcome(status, error)
        tally = self.recorder.tally
        eval_target = self.cfg.stop.target_eval_return
        self.result = RunResult(
            status=status,
            run_dir=self.run_dir,
            wall_s=time.time() - self.t0,
            env_steps=tally.env_steps,
            return_mean_100=tally.return_mean_100,
            time_to_target_s=tally.time_to_target_s,
            error=error,
            final_row=row,
            time_to_eval_target_s=math.nan if eval_target is None else self.recorder.time_to_eval_return(eval_target),
        )
        if self._tensorboard is not None:
            self._tensorboard(row)
            self._tensorboard.close()
        self._done.set()


def _recorder(
    cfg: ExperimentConfig,
    name: str,
    t0: float,
    *,
    serial: bool,
    resume: ResumePoint | None,
    plan: Mapping[str, float | str] | None = None,
):
    """The run's metrics recorder; a continued run's goes on from its files. ``plan``: the
    predictions of the plan that sized it, recorded as attributes."""
    recorder = MetricsRecorder(
        run_name=name,
        target_return=cfg.stop.target_return,
        config_json=cfg.to_json(),
        t0=t0,
        attrs={"mode": "serial" if serial else "distributed", "env_id": cfg.env.id, "seed": cfg.seed, **(plan or {})},
    )
    if resume is not None:
        recorder.continue_from(resume.metrics, resume.episodes)
    return recorder


def _both(first: Callable[[dict], None], second: Callable[[dict], None]) -> Callable[[dict], None]:
    def both(row: dict) -> None:
        first(row)
        second(row)

    return both


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
    wrote, a missing checkpoint or results, an override of the experiment itself, or a stop rule
    the run already met."""
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
    started_at: float | None = None,
    plan: Mapping[str, float | str] | None = None,
) -> Run:
    """Start a training run and return its :class:`Run` handle at once.

    ``client``: a ``distributed.Client`` of any cluster (LocalCluster, SLURMCluster,
    a scheduler address); None starts a LocalCluster sized for the run and closes
    it afterwards. ``tls=True`` (no client) makes that LocalCluster TLS only, with
    certificates made for the run (``run.security``; ``run.wait_for_cluster()`` returns its
    tls:// address once it is up). ``on_row(row)`` is called with every metrics row (progress
    display), ``on_event(text)`` with notable events (scheduler address, dashboard link,
    lost hosts, the start-up timeline). ``started_at``: the unix time the start-up timeline
    (``run.startup``, metrics.nc's ``startup_*`` attributes) counts from; default this call.
    ``plan``: the predictions of the plan the config was sized by (``Plan.predictions()``),
    recorded as metrics.nc's ``plan_*`` attributes beside the rates the run measures.
    """
    return Run(
        config,
        client=client,
        out=Path(out) if out else None,
        serial=serial,
        on_row=on_row,
        on_event=on_event,
        tls=tls,
        started_at=started_at,
        plan=plan,
    )
