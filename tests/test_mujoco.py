"""MuJoCo envs through the optional extra (``pip install 'tianji-dask[mujoco]'``): asked for
without it, the config check refuses them with the install command before any work starts;
with it, the v5 tasks build and PPO's actor and learner run on them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import MUJOCO_INSTALL, needs_mujoco
from gymnasium.spaces import Box

from tianji_dask.algos.ppo.actor import PPOActorRole
from tianji_dask.algos.ppo.buffer import RolloutBufferRole
from tianji_dask.algos.ppo.gaussian import GaussianPolicy
from tianji_dask.algos.ppo.learner import PPOLearnerRole
from tianji_dask.channels import LocalQueue, LocalTopic
from tianji_dask.config import ConfigError, check_env, load_config

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ["configs/halfcheetah_ppo.yaml", "configs/halfcheetah_ppo_16core.yaml"]
INSTALL = MUJOCO_INSTALL


@pytest.mark.parametrize("config", CONFIGS)
def test_a_mujoco_env_without_the_extra_is_bad_input_naming_the_install_command(monkeypatch, config):
    monkeypatch.setitem(sys.modules, "mujoco", None)  # `import mujoco` fails, as where the extra is missing
    with pytest.raises(ConfigError) as info:
        load_config(config)
    message = str(info.value)
    assert "env.id='HalfCheetah-v5' is a MuJoCo env" in message and "mujoco package is not installed" in message
    assert INSTALL in message


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_train_refuses_it_with_exit_2_and_starts_nothing(tmp_path):
    """The CLI's bad-input exit, before a run directory or a cluster exists."""
    argv = ["train", "configs/halfcheetah_ppo.yaml", "--set", "env.id=Hopper-v5", "--out", str(tmp_path / "run")]
    code = f"import sys; sys.modules['mujoco'] = None\nfrom tianji_dask.cli import main\nsys.exit(main({argv!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert done.returncode == 2, done.stderr
    assert "env.id='Hopper-v5' is a MuJoCo env" in done.stderr and INSTALL in done.stderr
    assert not (tmp_path / "run").exists()


def test_other_envs_do_not_need_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mujoco", None)
    check_env(load_config("configs/pendulum_ppo.yaml", check_env=False))


@needs_mujoco
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "env_id, obs_dim, action_dim", [("HalfCheetah-v5", 17, 6), ("Hopper-v5", 11, 3), ("Walker2d-v5", 17, 6)]
)
def test_mujoco_tasks_build_and_ppo_trains_on_a_rollout(env_id, obs_dim, action_dim):
    cfg = load_config(CONFIGS[0], [f"env.id={env_id}", "env.num_envs=2", "algo.rollout_steps=16", "algo.minibatches=4"])
    spaces = check_env(cfg)
    assert spaces.observation_space.shape == (obs_dim,)
    assert isinstance(spaces.action_space, Box) and spaces.action_space.shape == (action_dim,)
    queue, topic = LocalQueue(capacity_bytes=1 << 26), LocalTopic()
    buffer = RolloutBufferRole(cfg, queue)
    learner = PPOLearnerRole(cfg, buffer, topic, obs_dim, spaces.action_space, seed=0)
    actor = PPOActorRole(cfg, 0, 3, queue, topic.subscribe(), n_actors=1)
    assert isinstance(actor.policy, GaussianPolicy)
    learner.publish()
    actor.wait_for_params(5.0)
    for _ in range(16):
        actor.step()
    buffer.ingest()
    assert learner.step()
    hb = learner.heartbeat().counters
    assert hb.samples == 32 and np.isfinite(hb.loss)
    assert learner.learner_core.net.obs_moments.moments().count == pytest.approx(32 + 1e-4)
    actor.close()
