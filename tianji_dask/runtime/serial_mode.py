"""A run's serial mode: the serial reference (``serial.SerialRun``) in the run's thread, with the
run loop's duties between its steps and the final checkpoint at its end."""

from __future__ import annotations

import time

from tianji_dask.runtime.run_loop import RunLoop


def run_serial(loop: RunLoop) -> None:
    from tianji_dask.runtime.serial import SerialRun

    run = SerialRun(loop.cfg)
    checkpoints = loop.checkpoints
    # taken between two steps of the one loop: always a consistent state
    checkpoints.snapshot = lambda: (run.learner.state(), checkpoints.meta(run.learner))
    next_row = [time.time()]

    def should_stop():
        next_row[0] = loop.tick(next_row[0])
        return loop.should_stop()

    run.run(loop.recorder.add, should_stop)
    loop.last_row()
    checkpoints.snapshot = None
    checkpoints.save(run.learner.state(), checkpoints.meta(run.learner), final=True)
    loop.last_evaluations(hurry=loop.stopping.hurry.is_set())
