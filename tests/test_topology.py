"""Several learners per group and replicated groups, end to end on a real LocalCluster."""

import math

import numpy as np
import pytest

from tianji_dask.config import load_config
from tianji_dask.runtime.driver import train


@pytest.fixture(scope="module")
def client(h):
    """One LocalCluster, made as a run makes its own, for this module's runs in turn: each has
    four hosts' workers (two learners and two actors, in one group or two)."""
    with h.run_cluster_client(4) as client:
        yield client


def ppo_to_100(tmp_path, client, *topology: str):
    """Train PPO CartPole with the given topology overrides to a mean return of 100 (the learning
    tests of tests/test_learning.py go to 150); its result and metrics."""
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        [*topology, "stop.target_return=100", "stop.max_env_steps=1000000", "stop.max_seconds=180"],
    )
    run = train(cfg, client, out=tmp_path / "run")
    result = run.wait()
    assert result.error is None, result.error
    assert result.status == "target_reached", (result.status, result.return_mean_100)
    return result, run.metrics()


@pytest.mark.integration
@pytest.mark.learning
@pytest.mark.timeout(240)
def test_two_data_parallel_learners_reach_the_target(tmp_path, client):
    _, ds = ppo_to_100(tmp_path, client, "topology.learners=2", "topology.actors=2", "algo.ratio_tolerance=0.5")
    assert ds.sizes["learner"] == 2 and ds.sizes["buffer"] == 2 and ds.sizes["actor"] == 2
    # both learners trained (their buffers were fed by their own actors)
    assert (ds.learner_train_fps.max("time") > 0).all()
    assert (ds.buffer_receive_fps.max("time") > 0).all()


@pytest.mark.integration
@pytest.mark.learning
@pytest.mark.timeout(240)
def test_two_groups_stay_close_and_reach_the_target(tmp_path, client):
    result, ds = ppo_to_100(
        tmp_path, client, "topology.groups=2", "algo.ratio_tolerance=0.5", "topology.sync_interval_s=0.5"
    )
    dist = ds.group_param_distance.values
    measured = dist[~np.isnan(dist)]
    # a row repeats the last round's distance until the next round: one value per round
    rounds = measured[np.r_[True, np.diff(measured) != 0]]
    assert len(rounds) >= 2, dist  # gossip rounds happened and were recorded
    # averaging keeps the groups close: bounded throughout, and over the second half of the
    # rounds below the distance of the first (groups start from different random parameters)
    assert np.all(rounds < 100), rounds
    assert rounds[max(1, len(rounds) // 2) :].max() < rounds[0], rounds
    assert ds.sizes["learner"] == 2 and ds.sizes["actor"] == 2
    assert not math.isnan(result.time_to_target_s)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_dqn_with_two_learners_fills_both_buffers_and_learns(tmp_path, client):
    # regression: the actors' balance allowance once covered one buffer's warm-up only, so with
    # two learners neither buffer reached learning_starts and the whole group waited forever
    cfg = load_config(
        "configs/cartpole_dqn.yaml",
        ["topology.learners=2", "topology.actors=2", "stop.target_return=100", "stop.max_seconds=150"],
    )
    run = train(cfg, client, out=tmp_path / "run")
    result = run.wait()
    assert result.error is None, result.error
    assert result.status == "target_reached", (result.status, result.env_steps, result.return_mean_100)
    assert (run.metrics().learner_train_fps.max("time") > 0).all()
