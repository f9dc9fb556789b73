"""tianji_dask.deploy.profiling.measure_learner, the learner half of a profile, called directly (the
profile command runs it inside a Dask worker; tests/test_profile_plan.py covers that)."""

from __future__ import annotations

import pytest

from tianji_dask.config import load_config
from tianji_dask.deploy.profiling import measure_learner


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rollouts_per_update", [1, 3])
def test_ppo_learner_is_measured_on_a_full_iteration(rollouts_per_update):
    cfg = load_config("configs/cartpole_ppo.yaml", [f"algo.rollouts_per_update={rollouts_per_update}"])
    r = measure_learner(cfg.model_dump_json(), 1, None, 0.3)
    per_rollout = cfg.algo.rollout_steps * cfg.env.num_envs
    assert r["batch_size"] >= rollouts_per_update * per_rollout  # whole iterations were trained
    assert r["batch_size"] % (rollouts_per_update * per_rollout) == 0
    assert r["samples_per_s"] > 0


@pytest.mark.timeout(60)
def test_dqn_learner_is_measured_at_its_batch_size():
    cfg = load_config("configs/cartpole_dqn.yaml", ["algo.batch_size=64"])
    r = measure_learner(cfg.model_dump_json(), 1, None, 0.3)
    assert r["batch_size"] == 64 and r["samples_per_s"] > 0
    assert r["replay_bytes_per_transition"] > 0
