"""Writes a run's checkpoints into ``run_dir/checkpoint``: periodic ones from the running
learner's snapshot while the run goes on, and the final one at its end; and into
``run_dir/checkpoint_best`` the state of the best evaluation while it trained
(``training_evaluation.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tianji_dask.config import ExperimentConfig
from tianji_dask.errors import LearnerLost
from tianji_dask.results.tally import Tally

BEST_CHECKPOINT = "checkpoint_best"
FINAL_CHECKPOINT_S = 60.0  # how long a run's end waits for the learner's final state
HURRIED_CHECKPOINT_S = 5.0  # how long a run told to stop at once still waits for the final checkpoint

# the learner's final state, packed, asked with a timeout in seconds; None when no learner was built
FinalState = Callable[[float], tuple[bytes, dict] | None]


class CheckpointWriter:
    def __init__(
        self,
        cfg: ExperimentConfig,
        *,
        run_name: str,
        run_dir: Path,
        tally: Tally,
        t0: float,
        on_event: Callable[[str], None],
    ):
        self.cfg = cfg
        self.run_name = run_name
        self.run_dir = run_dir
        self._tally = tally
        self._t0 = t0
        self._on_event = on_event
        # (state, metadata) of the running learner, set by each mode while it runs: the state as
        # tensors (serial) or packed by the learner's host (distributed)
        self.snapshot: Callable[[], tuple[dict | bytes, dict]] | None = None
        self.final: tuple[dict | bytes, dict] | None = None  # (state, metadata) of the final checkpoint, once saved

    def meta(self, learner) -> dict:
        """The metadata of a checkpoint of ``learner`` (a learner core in this process)."""
        return {**learner.checkpoint_meta(), "algo": self.cfg.algo.name, "env_id": self.cfg.env.id}

    def save(self, state: dict | bytes, meta: dict, *, final: bool) -> None:
        """``final``: written at the run's end; else a periodic one of a run still going."""
        if not self.cfg.run.checkpoint:
            return
        from tianji_dask.results.checkpoint import save_checkpoint

        meta = {
            **meta,
            "run_name": self.run_name,
            "final": final,
            "env_steps": self._tally.env_steps,
            "wall_s": round(time.time() - self._t0 + self._tally.time_offset, 3),
        }
        save_checkpoint(self.run_dir / "checkpoint", state, meta)
        if final:
            self.final = (state, meta)

    def save_best(self, state: bytes, meta: dict, *, env_steps: int, wall_s: float) -> None:
        """The state of the best evaluation so far, taken at ``env_steps`` and ``wall_s`` (its
        ``meta`` holds the evaluation): it replaces the earlier best only once it is whole."""
        if not self.cfg.run.checkpoint:
            return
        from tianji_dask.results.checkpoint import save_checkpoint

        meta = {**meta, "run_name": self.run_name, "final": False, "env_steps": env_steps}
        meta["wall_s"] = round(wall_s + self._tally.time_offset, 3)
        try:
            save_checkpoint(self.run_dir / BEST_CHECKPOINT, state, meta)
        except Exception as exc:  # noqa: BLE001 - a full disk must not end the run; the earlier best stays
            self._on_event(f"best checkpoint into {self.run_dir / BEST_CHECKPOINT} failed: {exc!r}; the run goes on")

    def save_periodic(self) -> None:
        snapshot = self.snapshot
        if snapshot is None:  # the run is between its modes' loops
            return
        try:
            state, meta = snapshot()
            self.save(state, meta, final=False)
        except Exception as exc:  # noqa: BLE001 - a full disk or a slow learner must not end the run
            self._on_event(f"periodic checkpoint into {self.run_dir / 'checkpoint'} failed: {exc!r}; the run goes on")

    def save_final(self, final_state: FinalState, *, hurry: bool, stopped: bool = False) -> None:
        """The learner's state at the end of a distributed run, as ``final_state`` gives it.
        ``hurry`` (told to stop at once): a learner that answers within a few seconds still gets
        saved. ``stopped`` (``Run.stop``, Ctrl-C): a learner that made no update yet is not saved,
        there is nothing to keep."""
        if not hurry:
            try:
                self._save_learner_state(final_state(FINAL_CHECKPOINT_S), stopped)
            except LearnerLost as exc:  # the run did finish: its status stays
                self._on_event(f"no final checkpoint: {exc}; the latest periodic one, if any, stays")
            return
        try:
            self._save_learner_state(final_state(HURRIED_CHECKPOINT_S), stopped)
        except Exception as exc:  # noqa: BLE001 - the stop goes on; the latest periodic one stays
            self._on_event(f"final checkpoint skipped while stopping at once: {exc!r}")

    def _save_learner_state(self, saved: tuple[bytes, dict] | None, stopped: bool) -> None:
        if saved is None:
            self._on_event("no final checkpoint: the run stopped before its learner was built")
            return
        if stopped and not int(saved[1].get("updates", 0)):
            self._on_event("no final checkpoint: the run was stopped before its learner made an update")
            return
        self.save(*saved, final=True)
