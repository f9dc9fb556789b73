"""Learning tests: the shipped configs, with a lower target and a fixed step budget, must learn.

They are the configs' stop criteria used as tests (RLlib's tuned-example habit): a change
that breaks learning fails here, not only in the benchmark."""

import json
import math

import numpy as np
import pytest
import xarray as xr

from tianji_dask.config import load_config
from tianji_dask.results.evaluation import evaluate
from tianji_dask.runtime.driver import train


@pytest.fixture(scope="module")
def run_client(h):
    """One LocalCluster, made as a run makes its own, for the distributed runs of this module in
    turn (one actor each: two workers)."""
    with h.run_cluster_client(2) as client:
        yield client


@pytest.mark.learning
@pytest.mark.integration
@pytest.mark.timeout(240)
@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_cartpole_reaches_150_within_budget(tmp_path, algo):
    """A serial run (distributed ones learn in :func:`test_cartpole_best_checkpoint_plays_450_greedily`,
    to an evaluation of 475-500)."""
    cfg = load_config(
        f"configs/cartpole_{algo}.yaml", ["stop.target_return=150", "stop.max_env_steps=300000", "stop.max_seconds=180"]
    )
    result = train(cfg, serial=True, out=tmp_path / "run").wait()
    assert result.error is None, result.error
    assert result.status == "target_reached", (result.status, result.return_mean_100, result.env_steps)
    assert not math.isnan(result.time_to_target_s)
    assert result.env_steps <= 300000
    # The target was reached by a window of 100 episodes, in the order they arrived. The mean at
    # the end may be lower: episodes that finished while the hosts were stopping count too.
    with xr.open_dataset(result.run_dir / "episodes.nc", engine="netcdf4") as eps:
        returns = eps["return"].values
    windows = np.convolve(returns, np.ones(100) / 100, mode="valid")
    assert len(windows) and windows.max() >= 150 - 1e-9, (len(returns), windows.max() if len(windows) else None)
    # its checkpoint's policy, played without exploration, balances far longer than chance (~22)
    played = evaluate(result.run_dir, episodes=10)
    assert played.mean >= 100, played.summary()
    assert (played.path == result.run_dir / "eval.nc") and len(xr.load_dataset(played.path)["return"]) == 10


@pytest.mark.learning
@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("algo", "target"), [("dqn", 500), ("ppo", 475)])
def test_cartpole_best_checkpoint_plays_450_greedily(tmp_path, algo, target, run_client):
    """The shipped config with evaluations (every 10,000 env steps, 20 episodes), trained until
    one of them reaches ``target`` instead of until the training mean reaches 300: runs stopped at
    300 often held no policy that plays 450 (`git show 809c4a1:docs/benchmarks.md`). Its best checkpoint, played by
    ``tianji-dask eval`` on episodes the evaluations never saw, scores at least 450 over 20. DQN's
    target is a perfect evaluation: its runs stopped at 475 replayed to 475-488; PPO's policy stops
    changing after its lr decays (100,000 env steps), and one that never evaluates to 500 stays so.
    PPO's balance controller is on: its lr decays by the env steps made, and an actor that ran
    ahead of a learner slowed by the other tests' load made 400,000 of them, most dropped as
    stale, before its lr-decayed policy evaluated to 475."""
    paced = ["algo.ratio_tolerance=0.25"] if algo == "ppo" else []
    cfg = load_config(
        f"configs/cartpole_{algo}.yaml",
        [
            "run.eval_every_env_steps=10000",
            "stop.target_return=null",
            f"stop.target_eval_return={target}",
            "stop.max_env_steps=400000",
            "stop.max_seconds=240",
            *paced,
        ],
    )
    result = train(cfg, run_client, out=tmp_path / "run").wait()
    assert result.error is None, result.error
    assert result.status == "eval_target_reached", (result.status, result.env_steps, result.wall_s)
    with xr.open_dataset(result.run_dir / "metrics.nc", engine="netcdf4") as ds:
        means, steps = ds["eval_return_mean"].values, ds["eval_env_steps"].values
        dropped = int(ds["stale_dropped"].max())
    assert len(means) >= 2 and np.all(np.diff(steps) >= 0) and steps[0] >= cfg.run.eval_every_env_steps, steps
    if algo == "ppo":
        # paced: at most a rollout or two made while the learner moved on, at the start and around
        # each evaluation (a loaded CI run dropped one right after its second and two after its
        # third); unpaced, most of the 400,000 steps went
        rollout = cfg.env.num_envs * cfg.algo.rollout_steps
        assert dropped <= 2 * rollout * (len(means) + 1), (dropped, steps, result.env_steps)
    best = json.loads((result.run_dir / "checkpoint_best" / "checkpoint.json").read_text())
    # the best of every evaluation, the later and worse ones included, is the one kept
    assert best["eval_return_mean"] == means.max() >= target, (best, means)
    played = evaluate(result.run_dir, episodes=20)
    assert xr.load_dataset(played.path).attrs["checkpoint"] == "checkpoint_best"
    assert played.mean >= 450, played.summary()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_distributed_ppo_records_staleness(tmp_path, run_client):
    """metrics.nc of a distributed PPO run carries the staleness of what the learner trained on."""
    import numpy as np
    import xarray as xr

    # The number of rows follows the run's speed: rows dense enough, and the run long enough,
    # that a fast machine still records several rows with training.
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        ["stop.target_return=null", "stop.max_env_steps=30000", "stop.max_seconds=120", "run.metrics_interval=0.04"],
    )
    result = train(cfg, run_client, out=tmp_path / "run").wait()
    assert result.error is None, result.error
    assert result.status == "max_env_steps"
    with xr.open_dataset(result.run_dir / "metrics.nc", engine="netcdf4") as ds:
        ds.load()
    for var, units in (
        ("policy_lag_mean", "1"),
        ("policy_lag_max", "1"),
        ("sample_age_s", "s"),
        ("stale_dropped", "1"),
    ):
        assert var in ds.data_vars, var
        assert ds[var].dims == ("time",)
        assert ds[var].attrs.get("units") == units and ds[var].attrs.get("long_name"), ds[var].attrs
    lag_mean, lag_max = ds["policy_lag_mean"].values, ds["policy_lag_max"].values
    age, dropped = ds["sample_age_s"].values, ds["stale_dropped"].values
    trained = ~np.isnan(lag_mean)
    assert trained.sum() >= 5, trained  # rows in which the learner trained
    assert np.array_equal(trained, ~np.isnan(lag_max)) and np.array_equal(trained, ~np.isnan(age))
    lag = cfg.algo.max_policy_lag
    assert np.all((lag_mean[trained] >= 0) & (lag_mean[trained] <= lag)), lag_mean
    assert np.all((lag_max[trained] >= 0) & (lag_max[trained] <= lag)), lag_max
    assert np.all(lag_max[trained] >= lag_mean[trained])
    assert np.all(lag_max[trained] == np.round(lag_max[trained]))  # whole versions
    assert np.all((age[trained] >= 0) & (age[trained] < 10)), age  # seconds, not a clock mix-up
    assert not np.isnan(dropped).any() and np.all(dropped >= 0) and np.all(np.diff(dropped) >= 0)
    assert dropped[-1] <= ds["env_steps"].values[-1]
    assert int(ds["updates"][-1]) > 0 and float(ds["return_mean_100"][-1]) > 0


@pytest.mark.learning
@pytest.mark.integration
@pytest.mark.timeout(330)
def test_pendulum_gaussian_ppo_return_rises_within_budget(tmp_path, run_client):
    """PPO's Gaussian policy learns Pendulum-v1 on a LocalCluster: the 100-episode mean return
    reaches -800 within 100,000 env steps, from the first 50 episodes' mean below -1000 (random
    play scores about -1200, the config's target is -200). Iterations of one rollout of 256 steps
    instead of four give the learner four times the iterations in the budget, and the balance
    controller keeps the actor within two rollouts of each version, so the budget in env steps is
    a budget in training."""
    cfg = load_config(
        "configs/pendulum_ppo.yaml",
        [
            "stop.target_return=-800",
            "stop.max_env_steps=100000",
            "stop.max_seconds=300",  # a guard only: the budget is the env steps
            "algo.rollout_steps=256",
            "algo.rollouts_per_update=1",
            "algo.minibatches=16",
            "algo.ratio_tolerance=0.25",
            "algo.rollouts_ahead=1",
            # learning is the subject: under a load average of 8 on 2 cores the learner once went
            # 5 s without a heartbeat, the config's limit, and the run was ended as stuck
            "run.heartbeat_timeout=30.0",
        ],
    )
    result = train(cfg, run_client, out=tmp_path / "run").wait()
    assert result.error is None, result.error
    assert result.status == "target_reached", (result.status, result.env_steps, result.wall_s)
    with xr.open_dataset(result.run_dir / "episodes.nc", engine="netcdf4") as eps:
        returns = eps["return"].values
    assert len(returns) >= 100 and returns[:50].mean() < -1000, returns[:50].mean()  # it started from random play
