"""The synchronous (Gorila-style) ablation really waits: an actor's parameters never lag the
learner's by more than one version, while the relaxed mode lets them drift far apart."""

import threading
import time

import numpy as np
import pytest
from gymnasium.spaces import Discrete

from tianji_dask.algos.dqn.actor import DQNActorRole
from tianji_dask.algos.dqn.learner import DQNLearnerRole
from tianji_dask.channels import LocalQueue, LocalTopic
from tianji_dask.config import load_config
from tianji_dask.roles.buffer import ReplayBufferRole


def run_pair(mode: str, updates: int = 150):
    cfg = load_config(
        "configs/cartpole_dqn.yaml",
        [f"topology.mode={mode}", "algo.learning_starts=256", "channel.chunk_steps=4"],
        check_env=False,
    )
    queue, topic = LocalQueue(capacity_bytes=1 << 26), LocalTopic()
    stop = threading.Event()
    actor = DQNActorRole(cfg, 0, 1, queue, topic.subscribe(), should_stop=stop.is_set)
    buffer = ReplayBufferRole(queue, cfg.algo.buffer_size, actor.obs_shape, actor.obs_dtype, seed=2)
    learner = DQNLearnerRole(cfg, buffer, topic, 4, Discrete(2), seed=3)
    learner.publish()
    actor.wait_for_params(5)

    def actor_loop():
        while not stop.is_set():
            actor.step()

    thread = threading.Thread(target=actor_loop, daemon=True)
    thread.start()
    lags = []
    deadline = time.monotonic() + 60
    try:
        while learner.counters.updates < updates and time.monotonic() < deadline:
            buffer.ingest()
            if learner.wants_update():
                lags.append(learner.learner_core.updates - actor.policy.version)
                learner.update()
            else:
                time.sleep(0.0002)
    finally:
        stop.set()
        thread.join(5)
        actor.close()
    return np.array(lags), actor


@pytest.mark.timeout(90)
def test_synchronous_actor_never_lags_the_learner_by_more_than_one_version():
    lags, actor = run_pair("synchronous")
    assert len(lags) == 150
    assert lags.max() <= 1, lags.max()
    assert actor.counters.sync_wait_s > 0  # it really waited for parameters


@pytest.mark.timeout(90)
def test_relaxed_actor_does_not_wait_and_drifts():
    cfg_lags, actor = run_pair("relaxed")
    assert actor.counters.sync_wait_s == 0  # it never waited for parameters
    # publish_interval is 50 updates: relaxed actors run on versions up to 50 updates old
    assert cfg_lags.max() > 1
