"""Evaluations of the learner's policy while a run trains (``run.eval_every_env_steps``), and the
best of them kept as ``checkpoint_best``: stable-baselines3's ``EvalCallback`` with its best model.

Call protocol (the run loop's): :meth:`TrainingEvaluations.tick` between two steps of the run's
loop, with the function that takes the learner's state; :meth:`TrainingEvaluations.finish` with the
final checkpoint's state once the hosts have stopped; :meth:`TrainingEvaluations.close` on every
exit path.

Every ``run.eval_every_env_steps`` env steps the driver takes the learner's state (the snapshot a
periodic checkpoint takes, between two updates) and hands it to an evaluator process, which plays
``run.eval_episodes`` episodes with the policy ``tianji-dask eval`` plays
(:func:`~tianji_dask.results.evaluation.play_state`: no exploration, the env's own rewards) and
sends back their mean and std. One evaluation is under way at a time: one due while another
plays waits for it, and those that fell due meanwhile beyond it are skipped (counted in
``metrics.nc``'s ``eval_skipped`` attribute, and said in the line of the evaluation that followed).
Each is a line on ``on_event`` and a record of ``metrics.nc`` (``eval_return_mean`` ...); a mean above
every earlier one (of this run and of the run it continues) makes that state ``checkpoint_best``,
written as every checkpoint is (whole or not at all, ``results/checkpoint.py``). The final
checkpoint is evaluated too, once the hosts have stopped. All evaluations of a run play the same
episodes (:func:`~tianji_dask.seeding.evaluation_seed`), not those ``tianji-dask eval`` plays.

Where it runs: a process of its own (``evaluator_process.py``), started by the driver as the run's
loop begins and niced, so that on a machine it shares with the run's hosts (its own LocalCluster)
the OS runs the hosts first. Not a Dask host: it would need a worker of its own in every cluster
a run is given (a plan's Slurm jobs are sized for the actors and learners alone, a
``--scheduler``'s workers are the user's), and on a worker shared with an actor or a learner it
would take that host's GIL. Not a thread of the driver: playing episodes would hold the GIL of
the process that supervises the hosts and records their heartbeats. The hosts' only extra work is
one copy of the learner's state per evaluation.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from tianji_dask.config import ExperimentConfig
from tianji_dask.results.recorder import MetricsRecorder
from tianji_dask.runtime.checkpoint_writer import BEST_CHECKPOINT, CheckpointWriter
from tianji_dask.seeding import evaluation_seed

FINAL_EVALUATION_S = 120.0  # how long a stopping run waits for its last evaluations
STOP_S = 5.0  # how long the evaluator process gets to end before it is killed
EVALUATOR_MODULE = "tianji_dask.runtime.processes.evaluator_process"

Snapshot = Callable[[], tuple[dict | bytes, dict]]  # the learner's (state, checkpoint metadata)


@dataclass
class _Taken:
    """A state under evaluation: what it was taken at, and what to save if it is the best."""

    packed: bytes
    meta: dict
    env_steps: int
    t_rel: float
    skipped: int  # evaluations that fell due while the one before played, and were not made


class TrainingEvaluations:
    def __init__(
        self,
        cfg: ExperimentConfig,
        recorder: MetricsRecorder,
        checkpoints: CheckpointWriter,
        *,
        t0: float,
        on_event: Callable[[str], None],
        on_evaluation: Callable[[dict], None] = lambda record: None,
        skipped: int = 0,
    ):
        self.cfg = cfg
        self.every = cfg.run.eval_every_env_steps
        self._recorder = recorder
        self._checkpoints = checkpoints
        self._t0 = t0
        self._on_event = on_event
        self._on_evaluation = on_evaluation  # each record, as metrics.nc holds it (TensorBoard)
        self.best = best_evaluated(checkpoints.run_dir)  # a continued run's bar is its earlier best
        self._next_due = recorder.tally.env_steps + self.every
        self._waited = False  # an evaluation fell due while another played
        self.skipped = skipped  # of the whole run (a continued run's counted before it, too)
        recorder.set_attrs({"eval_skipped": skipped})
        self._taken: _Taken | None = None
        self._last_steps = -1  # env steps of the latest state sent to the evaluator
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None  # states to the evaluator
        self._answers: Connection | None = None  # its answers
        self._off = False  # the evaluator failed: no more evaluations in this run

    def tick(self, snapshot: Snapshot | None) -> None:
        """Record an evaluation that ended; start one where due and none is under way."""
        if self._off:
            return
        if self._conn is None:  # at the run's first tick: its imports overlap the first env steps
            self._spawn()
        self._collect(wait=0.0)
        steps = self._recorder.tally.env_steps
        if steps < self._next_due or snapshot is None:
            return
        if self._taken is not None:
            self._waited = True
            return
        # the due steps passed while the one before played, beyond the one made now
        skipped = (steps - self._next_due) // self.every if self._waited else 0
        self._next_due, self._waited = steps + self.every, False
        if skipped:
            self.skipped += skipped
            self._recorder.set_attrs({"eval_skipped": self.skipped})
        try:
            state, meta = snapshot()
        except Exception as exc:  # noqa: BLE001 - a learner busy or lost: the next one is due later
            self._on_event(f"evaluation skipped: the learner's state was not taken: {exc!r}")
            return
        self._start(state, meta, steps, skipped=skipped)

    def finish(self, final: tuple[dict | bytes, dict] | None) -> None:
        """Once the hosts have stopped: the evaluation under way, then one of ``final`` (the final
        checkpoint's state and metadata) unless the last one was taken at the same env steps,
        together waited for up to :data:`FINAL_EVALUATION_S`."""
        deadline = time.monotonic() + FINAL_EVALUATION_S
        self._collect(wait=FINAL_EVALUATION_S)
        steps = self._recorder.tally.env_steps
        if final is not None and not self._off and self._taken is None and steps != self._last_steps:
            self._start(*final, steps)
            self._collect(wait=max(0.0, deadline - time.monotonic()))
        if self._taken is not None:
            self._on_event(f"the last evaluation did not end within {FINAL_EVALUATION_S:g} s; it is left out")

    def close(self) -> None:
        """End the evaluator process (killed after :data:`STOP_S`); a no-op where none started."""
        process, conn, answers = self._process, self._conn, self._answers
        self._process = self._conn = self._answers = None
        if process is None or conn is None or answers is None:
            return
        conn.close()  # the evaluator reads to the end of the pipe and exits
        try:
            process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_S)
        answers.close()

    # --- the driver's side of the evaluator process ----------------------------------------------
    def _start(self, state: dict | bytes, meta: dict, env_steps: int, *, skipped: int = 0) -> None:
        from tianji_dask.results.checkpoint import pack_state

        packed = state if isinstance(state, bytes) else pack_state(state)
        if self._conn is None:  # finish() of a run stopped before its first tick
            self._spawn()
        assert self._conn is not None
        self._taken = _Taken(packed, meta, env_steps, time.time() - self._t0, skipped)
        self._last_steps = env_steps
        # from a thread: a state larger than the pipe's buffer waits for the evaluator to read it
        # (seconds, while it imports torch the first time), and the run's loop must not wait; an
        # evaluator that never reads ends, which _collect sees
        threading.Thread(target=_send, args=(self._conn, packed), name="tianji-eval-send", daemon=True).start()

    def _spawn(self) -> None:
        """The evaluator process (``evaluator_process.py``), started through ``/bin/sh`` ignoring
        SIGINT and SIGTERM from its first instruction, as the run's workers do: the driver ends it."""
        child_reads, driver_writes = os.pipe()
        driver_reads, child_writes = os.pipe()
        try:
            self._process = subprocess.Popen(
                ["/bin/sh", "-c", 'trap \'\' INT TERM; exec "$0" "$@"', sys.executable, "-m", EVALUATOR_MODULE]
                + [str(child_reads), str(child_writes)],
                pass_fds=(child_reads, child_writes),
                stdin=subprocess.DEVNULL,
            )
        finally:
            os.close(child_reads)
            os.close(child_writes)
        self._conn = Connection(driver_writes, readable=False)
        self._answers = Connection(driver_reads, writable=False)
        cfg = self.cfg.model_copy(update={"actor": self.cfg.actor.model_copy(update={"device": "cpu"})})
        self._conn.send((cfg.to_json(), self.cfg.run.eval_episodes, evaluation_seed(self.cfg.seed)))

    def _collect(self, wait: float) -> None:
        taken, answers = self._taken, self._answers
        if taken is None or answers is None:
            return
        try:
            if not answers.poll(wait):
                return
            answer = answers.recv()
        except (EOFError, OSError) as exc:
            self._fail(f"the evaluator process ended: {exc!r}")
            return
        self._taken = None
        if answer[0] != "ok":
            self._fail(f"an evaluation failed: {answer[1]}")
            return
        mean, std = answer[1], answer[2]
        self._on_evaluation(
            self._recorder.record_evaluation(mean=mean, std=std, env_steps=taken.env_steps, t_rel=taken.t_rel)
        )
        best = mean > self.best
        self._on_event(evaluation_line(mean, std, taken.env_steps, self.cfg.run.eval_episodes, best, taken.skipped))
        if best:
            self.best = mean
            meta = {**taken.meta, "eval_return_mean": mean, "eval_return_std": std}
            meta["eval_episodes"] = self.cfg.run.eval_episodes
            self._checkpoints.save_best(taken.packed, meta, env_steps=taken.env_steps, wall_s=taken.t_rel)

    def _fail(self, why: str) -> None:
        self._off, self._taken = True, None
        self._on_event(f"{why}; no more evaluations in this run")
        self.close()


def evaluation_line(mean: float, std: float, env_steps: int, episodes: int, best: bool, skipped: int) -> str:
    """``eval at 30,000 env steps: return 500.0 ± 0.0 over 20 episodes (best so far)``, and how
    many evaluations fell due while the one before played and were skipped."""
    line = f"eval at {env_steps:,} env steps: return {mean:.1f} ± {std:.1f} over {episodes} episodes"
    if best:
        line += " (best so far)"
    if skipped:
        line += f"; {skipped} skipped: an evaluation was still running"
    return line


def best_evaluated(run_dir: Path) -> float:
    """The evaluation mean of ``run_dir``'s ``checkpoint_best``, or -inf where it has none."""
    try:
        meta = json.loads((Path(run_dir) / BEST_CHECKPOINT / "checkpoint.json").read_text())
        return float(meta["eval_return_mean"])
    except (OSError, ValueError, KeyError, TypeError):
        return -math.inf


def _send(conn: Connection, packed: bytes) -> None:
    with contextlib.suppress(OSError):  # closed by close(): the evaluator is ending anyway
        conn.send(packed)
