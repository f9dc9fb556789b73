"""TensorBoard scalars of a run's metrics rows, written while the run goes (``run.tensorboard:
true``), for ``tensorboard --logdir runs/``. ``metrics.nc`` stays the record: the events hold the
same rows' scalars, each at the row's env steps and wall time, under the metrics' own names, and
each evaluation while the run trains as ``eval_return_mean`` at its policy's env steps."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

TENSORBOARD_DIR = "tensorboard"
FLUSH_S = 5  # the events reach the file this often, for a TensorBoard watching the run


def check_tensorboard() -> None:
    """Raise :class:`~tianji_dask.config.ConfigError` naming the fix where the ``tensorboard``
    package, which writes the events, is not installed."""
    from tianji_dask.config import ConfigError

    try:
        found = importlib.util.find_spec("tensorboard") is not None
    except ValueError:  # a module of that name without a spec: not the package
        found = False
    if not found:
        raise ConfigError(
            "run.tensorboard: true needs the tensorboard package: pip install 'tianji-dask[tensorboard]' "
            "(or pip install tensorboard), or set run.tensorboard: false"
        )


class TensorBoardRows:
    """Called with each metrics row (``MetricsRecorder.row``); :meth:`close` at the run's end."""

    def __init__(self, run_dir: Path, t0: float):
        from torch.utils.tensorboard import SummaryWriter

        self.t0 = t0
        self.log_dir = Path(run_dir) / TENSORBOARD_DIR
        self._writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=FLUSH_S)

    def __call__(self, row: dict) -> None:
        step = int(row.get("env_steps") or 0)
        wall = self.t0 + float(row["time"])
        for name, value in row.items():
            if name != "time" and isinstance(value, (int, float)) and math.isfinite(value):
                self._writer.add_scalar(name, value, global_step=step, walltime=wall)

    def evaluation(self, record: dict) -> None:
        """One evaluation while the run trains (``MetricsRecorder.record_evaluation``'s variables):
        its ``eval_return_mean`` at the env steps and time its policy was taken."""
        step, wall = int(record["eval_env_steps"]), self.t0 + float(record["eval_time"])
        self._writer.add_scalar("eval_return_mean", record["eval_return_mean"], global_step=step, walltime=wall)

    def close(self) -> None:
        self._writer.close()
