"""The algorithm table and the specs' factories: one list of algorithms, roles built whole."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT

from tianji_dask.algos.registry import ALGORITHMS
from tianji_dask.channels import LocalQueue, LocalTopic
from tianji_dask.config import load_config
from tianji_dask.config.schema import ALGO_CONFIGS, AlgoConfig
from tianji_dask.roles.heartbeats import ActorCounters, BufferCounters, Heartbeat, LearnerCounters
from tianji_dask.runtime.serial import SerialRun

CONFIGS = {"dqn": ROOT / "configs" / "cartpole_dqn.yaml", "ppo": ROOT / "configs" / "cartpole_ppo.yaml"}


def test_the_registry_and_the_config_schema_name_the_same_algorithms():
    """``AlgoConfig`` (the union pydantic validates ``algo`` with) is the one list; ``ALGO_CONFIGS``
    is made of it, and the registry's specs must name the same algorithms with the same sections."""
    assert {name: spec.config for name, spec in ALGORITHMS.items()} == ALGO_CONFIGS
    assert set(ALGO_CONFIGS.values()) == set(AlgoConfig.__args__)
    assert set(CONFIGS) == set(ALGORITHMS)  # a new algorithm gets its case in the tests below
    for name, path in CONFIGS.items():
        assert type(load_config(path).algo) is ALGO_CONFIGS[name]


@pytest.mark.parametrize("algo", sorted(CONFIGS))
def test_an_actor_is_built_with_its_channels_and_its_predecessors_steps(algo):
    """``make_actor`` returns the actor whole: it pushes to the sender it was given, takes the
    parameters it was given, and its schedules go on from its predecessors' env steps (the part
    the balance controller counts apart)."""
    chunk = {"dqn": "channel.chunk_steps=3", "ppo": "algo.rollout_steps=3"}[algo]  # short messages
    cfg = load_config(CONFIGS[algo], ["env.num_envs=2", chunk])
    spec = ALGORITHMS[algo]
    queue, topic = LocalQueue(capacity_bytes=1 << 30, full_policy="wait"), LocalTopic()
    actor = spec.make_actor(
        cfg, 0, 7, queue, topic.subscribe(), prior_env_steps=1000, balance_prior_env_steps=400, balance=False
    )
    try:
        buffer = spec.make_buffer(cfg, queue, actor.obs_shape, actor.obs_dtype, 1)
        obs_dim = int(np.prod(actor.obs_shape))
        learner = spec.make_learner(cfg, buffer, topic, obs_dim, actor.action_space, 2, balance=False)
        learner.publish()
        actor.wait_for_params(5.0)
        while actor.counters.messages_sent == 0 and actor.counters.env_steps < 40:
            actor.step()
        assert actor.counters.params_received == 1 and actor.counters.messages_sent == 1
        assert len(queue.poll()) == 1
        steps = actor.counters.env_steps
        assert actor.produced_env_steps == 1000 + steps and actor.balanced_env_steps == 400 + steps
    finally:
        actor.close()


@pytest.mark.parametrize("algo", sorted(CONFIGS))
def test_every_role_beats_a_typed_heartbeat_the_host_sends_as_its_message(algo):
    run = SerialRun(load_config(CONFIGS[algo], ["env.num_envs=2"]))
    try:
        run.actor.step()
        beats = [role.heartbeat() for role in (run.actor, run.buffer, run.learner)]
        assert all(isinstance(b, Heartbeat) for b in beats)
        assert [b.role for b in beats] == ["actor", "buffer", "learner"]
        kinds = (ActorCounters, BufferCounters, LearnerCounters)
        assert all(isinstance(b.counters, kind) for b, kind in zip(beats, kinds, strict=True))
        assert beats[0].counters.env_steps == 2
        assert [m["role"] for m in run.heartbeats()] == ["actor", "buffer", "learner"]
        assert run.heartbeats()[0]["counters"]["env_steps"] == 2
    finally:
        run.actor.close()
