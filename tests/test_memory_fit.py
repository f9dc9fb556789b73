"""The memory a run's replay will take on this machine is checked before anything starts, and
the LocalCluster a run starts lets one worker (the buffer's) use more than an even share."""

from __future__ import annotations

import pytest

from tianji_dask.algos.registry import spec_for
from tianji_dask.config import ConfigError, check_env, load_config
from tianji_dask.roles.buffer import ReplayMemory
from tianji_dask.roles.frame_replay import FrameReplay
from tianji_dask.runtime.checks import check_replay_fits

GIB = 2**30
CPU = ["learner.device=cpu", "actor.device=cpu"]  # the Pong configs name a GPU; the replay is the same
# pong_dqn.yaml's replay is small and on the GPU: the papers' 1M on the host
DQN_1M = [*CPU, "algo.replay_device=cpu", "algo.buffer_size=1000000"]


def test_flat_replay_bytes_match_what_a_built_memory_reports():
    memory = ReplayMemory(1000, (4,))
    assert memory.nbytes == ReplayMemory.nbytes_for(1000, (4,))


def test_pong_dqn_needs_its_frame_replay_and_ppo_needs_none():
    cfg = load_config("configs/pong_dqn.yaml", DQN_1M)
    obs = check_env(cfg).observation_space
    assert spec_for(cfg).replay_nbytes(cfg, obs.shape, obs.dtype) == FrameReplay.nbytes_for(1_000_000)
    ppo = load_config("configs/pong_ppo.yaml", CPU)
    assert spec_for(ppo).replay_nbytes(ppo, obs.shape, obs.dtype) == 0
    check_replay_fits(ppo, check_env(ppo), serial=False, available=1)  # nothing to hold


def test_a_replay_that_does_not_fit_is_refused_with_a_size_that_does():
    cfg = load_config("configs/pong_dqn.yaml", DQN_1M)
    spaces = check_env(cfg)
    per = FrameReplay.nbytes_for(1_000_000)
    check_replay_fits(cfg, spaces, serial=False, available=int(per / 0.89))
    with pytest.raises(ConfigError) as e:
        check_replay_fits(cfg, spaces, serial=False, available=4 * GIB)
    msg = str(e.value)
    assert "algo.buffer_size=1,000,000 needs 6.73 GiB of replay per buffer x 1 buffer(s)" in msg, msg
    suggested = int(msg.split("at most ")[1].split(", or")[0].replace(",", ""))
    smaller = load_config("configs/pong_dqn.yaml", [*DQN_1M[:-1], f"algo.buffer_size={suggested}"])
    check_replay_fits(smaller, spaces, serial=False, available=4 * GIB)  # the advice holds


def test_every_learner_of_every_group_has_its_own_buffer():
    cfg = load_config(
        "configs/cartpole_dqn.yaml",
        ["algo.buffer_size=1000000", "topology.groups=2", "topology.learners=2", "topology.actors=2"],
    )
    spaces = check_env(cfg)
    per = ReplayMemory.nbytes_for(1_000_000, spaces.observation_space.shape, spaces.observation_space.dtype)
    check_replay_fits(cfg, spaces, serial=True, available=int(2 * per))  # serial: one buffer
    with pytest.raises(ConfigError, match=r"x 4 buffer\(s\)"):
        check_replay_fits(cfg, spaces, serial=False, available=int(2 * per))


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_runs_local_cluster_gives_each_worker_the_whole_machine():
    from distributed import Client
    from distributed.system import MEMORY_LIMIT

    from tianji_dask.runtime.cluster.cluster import local_cluster
    from tianji_dask.runtime.cluster.workers import scheduler_workers

    with local_cluster(3) as cluster, Client(cluster) as client:
        limits = [w["memory_limit"] for w in scheduler_workers(client).values()]
    assert limits == [MEMORY_LIMIT] * 3
