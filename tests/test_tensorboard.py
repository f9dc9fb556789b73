"""``run.tensorboard: true``: the run's metrics rows as TensorBoard scalars, read back with
TensorBoard's own reader and set beside metrics.nc; a missing package is refused before the run."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import xarray as xr

from tianji_dask.config import ConfigError, load_config
from tianji_dask.runtime.driver import train


def _scalars(log_dir) -> dict[str, list]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: events.Scalars(tag) for tag in events.Tags()["scalars"]}


@pytest.mark.integration
def test_a_runs_rows_are_tensorboard_scalars_equal_to_its_metrics(tmp_path):
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        [
            "run.tensorboard=true",
            "run.eval_every_env_steps=10000",
            "stop.target_return=null",
            "stop.max_env_steps=6000",
            "run.metrics_interval=0.2",
        ],
    )
    result = train(cfg, serial=True, out=tmp_path / "run").wait(timeout=120)
    assert result.ok, result.error
    scalars = _scalars(result.run_dir / "tensorboard")
    with xr.open_dataset(result.run_dir / "metrics.nc", engine="netcdf4") as ds:
        steps = ds["env_steps"].values
        for name in ("return_mean_100", "env_fps"):
            recorded = ds[name].values
            finite = np.isfinite(recorded)
            events = scalars[name]
            assert len(events) == int(finite.sum()) > 0, (name, len(events), int(finite.sum()))
            np.testing.assert_allclose([e.value for e in events], recorded[finite], rtol=1e-6)
            assert [e.step for e in events] == [int(s) for s in steps[finite]]
        # the evaluations (here only the final one) at their policies' env steps
        evaluated = ds["eval_return_mean"].values
        assert len(evaluated) >= 1
        np.testing.assert_allclose([e.value for e in scalars["eval_return_mean"]], evaluated, rtol=1e-6)
        assert [e.step for e in scalars["eval_return_mean"]] == ds["eval_env_steps"].values.tolist()


def test_tensorboard_without_its_package_is_refused_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed: import raises
    cfg = load_config("configs/cartpole_ppo.yaml", ["run.tensorboard=true"])
    with pytest.raises(ConfigError, match=r"pip install 'tianji-dask\[tensorboard\]'"):
        train(cfg, serial=True, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()
