"""Learning tests: the shipped configs, with a lower target and a fixed step budget, must learn.

They are the configs' stop criteria used as tests (RLlib's tuned-example habit): a change
that breaks learning fails here, not only in the benchmark."""

import math

import pytest

from tianji_dask.config import load_config
from tianji_dask.driver import train


@pytest.mark.learning
@pytest.mark.integration
@pytest.mark.timeout(240)
@pytest.mark.parametrize("serial", [False, True], ids=["distributed", "serial"])
def test_cartpole_dqn_reaches_150_within_budget(tmp_path, serial):
    cfg = load_config("configs/cartpole_dqn.yaml",
                      ["stop.target_return=150", "stop.max_env_steps=300000", "stop.max_seconds=180"])
    result = train(cfg, serial=serial, out=tmp_path / "run").wait()
    assert result.error is None, result.error
    assert result.status == "target_reached", (result.status, result.return_mean_100, result.env_steps)
    assert result.return_mean_100 >= 150
    assert not math.isnan(result.time_to_target_s)
    assert result.env_steps <= 300000
