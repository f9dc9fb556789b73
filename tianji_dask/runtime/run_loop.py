"""What both of a run's modes do between two steps of their loop: check whether to stop (asked
to, or a stop rule met) and do the periodic duties (interim results, checkpoints, evaluations,
metrics rows)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from tianji_dask.config import ExperimentConfig
from tianji_dask.results.recorder import MetricsRecorder
from tianji_dask.runtime.checkpoint_writer import CheckpointWriter
from tianji_dask.runtime.result_writer import ResultWriter
from tianji_dask.runtime.training_evaluation import TrainingEvaluations


class Stopping:
    """Whether a run was asked to stop, why (the first reason given) and how: ``hurry`` set
    means at once (see :meth:`Run.stop`)."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.requested = threading.Event()
        self.hurry = threading.Event()

    def request(self, reason: str, *, now: bool = False) -> None:
        if self.reason is None:
            self.reason = reason
        if now:
            self.hurry.set()
        self.requested.set()


class RunLoop:
    def __init__(
        self,
        cfg: ExperimentConfig,
        recorder: MetricsRecorder,
        *,
        t0: float,
        stopping: Stopping,
        results: ResultWriter,
        checkpoints: CheckpointWriter,
        evaluations: TrainingEvaluations | None,
        on_row: Callable[[dict], None],
    ):
        self.cfg = cfg
        self.recorder = recorder
        self.t0 = t0
        self.stopping = stopping
        self.results = results
        self.checkpoints = checkpoints
        self.evaluations = evaluations  # None: run.eval_every_env_steps is 0
        self._on_row = on_row
        self._next_save = t0 + cfg.run.save_interval
        self._next_checkpoint = t0 + cfg.run.checkpoint_interval
        self.final_row: dict | None = None  # the last row, once the hosts' final heartbeats are in

    def should_stop(self) -> bool:
        """Whether the run was asked to stop; a stop rule met asks it to."""
        if self.stopping.requested.is_set():
            return True
        reason = _stop_rule_met(self.cfg, self.recorder, self.t0)
        if reason:
            self.stopping.request(reason)
            return True
        return False

    def tick(self, next_row: float) -> float:
        """Do what is due; returns when the next metrics row is."""
        now = time.time()
        if self.cfg.run.save_interval and now >= self._next_save:
            self._next_save = now + self.cfg.run.save_interval
            self.results.write_interim()
        if (
            self.checkpoints.snapshot is not None
            and self.cfg.run.checkpoint
            and self.cfg.run.checkpoint_interval
            and now >= self._next_checkpoint
        ):
            self.checkpoints.save_periodic()
            self._next_checkpoint = time.time() + self.cfg.run.checkpoint_interval
        if self.evaluations is not None:
            self.evaluations.tick(self.checkpoints.snapshot)
        if now >= next_row:
            self._on_row(self.recorder.row(now - self.t0))
            return now + self.cfg.run.metrics_interval
        return next_row

    def last_row(self) -> None:
        """The run's last row, once no heartbeat can come any more: dated when the hosts stopped,
        so that rates over the run's rows (``benchmarks/ablation.py``) do not count the final
        checkpoint and the LocalCluster's shutdown after it (seconds) as time the hosts ran."""
        self.final_row = self.recorder.row(time.time() - self.t0)

    def last_evaluations(self, *, hurry: bool) -> None:
        """Once the hosts have stopped and the final checkpoint is saved: the evaluation under
        way and one of the final checkpoint (none when told to stop at once)."""
        if self.evaluations is not None and not hurry:
            self.evaluations.finish(self.checkpoints.final)


def _stop_rule_met(cfg: ExperimentConfig, recorder: MetricsRecorder, t0: float) -> str | None:
    s, tally = cfg.stop, recorder.tally
    if s.target_return is not None and not math.isnan(tally.time_to_target_s):
        return "target_reached"
    if s.target_eval_return is not None and recorder.best_evaluation() >= s.target_eval_return:
        return "eval_target_reached"
    if s.max_env_steps is not None and tally.env_steps >= s.max_env_steps:
        return "max_env_steps"
    # a continued run's budget counts the time before it too (the time axis of metrics.nc)
    if s.max_seconds is not None and time.time() - t0 + tally.time_offset >= s.max_seconds:
        return "max_seconds"
    return None
