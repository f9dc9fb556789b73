"""An actor's envs in step groups (env.step_groups) step exactly as one vector env: the same
seeds and actions give the same rollouts, whether the groups overlap their stepping with the
policy (ale-py's send/recv) or step in turn (gymnasium's SyncVectorEnv). No cluster."""

from __future__ import annotations

import numpy as np
import pytest

from tianji_dask.algos.ppo.actor import PPOActorRole
from tianji_dask.channels import LocalQueue, LocalTopic
from tianji_dask.config import ConfigError, load_config
from tianji_dask.envs import EnvGroups, make_atari_vector_env, make_env_groups, merge_infos


def test_merge_infos_fills_what_a_group_did_not_report_and_renumbers_env_ids():
    ended = {
        "env_id": np.array([0, 1]),
        "lives": np.array([3, 2]),
        "final_obs": np.array([None, np.ones(2)], dtype=object),
        "_final_obs": np.array([False, True]),
        "final_info": {"score": np.array([0.0, 7.0])},
    }
    going = {"env_id": np.array([0, 1]), "lives": np.array([1, 1])}
    merged = merge_infos([going, ended], [2, 2])
    np.testing.assert_array_equal(merged["env_id"], [0, 1, 2, 3])
    np.testing.assert_array_equal(merged["lives"], [1, 1, 3, 2])
    np.testing.assert_array_equal(merged["_final_obs"], [False, False, False, True])
    assert merged["final_obs"][:3].tolist() == [None, None, None]
    np.testing.assert_array_equal(merged["final_obs"][3], np.ones(2))
    np.testing.assert_array_equal(merged["final_info"]["score"], [0.0, 0.0, 0.0, 7.0])
    dense = merge_infos([{"final_obs": np.full((2, 3), 5, np.uint8)}, {}], [2, 2])["final_obs"]
    assert dense.dtype == np.uint8 and dense.shape == (4, 3) and dense[2:].sum() == 0


@pytest.mark.slow  # plays about 900 steps of Pong twice
@pytest.mark.timeout(60)
def test_groups_of_ale_vector_envs_step_as_one_vector_env():
    """Seeds, observations, rewards, ends and infos of 4 Pong envs in 2 groups (send/recv,
    overlapped) are those of one vector env of 4, for the same actions."""
    cfg = load_config("configs/pong_ppo_small.yaml", ["env.num_envs=4", "env.step_groups=2"], check_env=False)
    groups = make_env_groups(cfg.env, 11)
    whole = make_atari_vector_env(cfg.env.id, 4, cfg.env.atari_backend, 1)
    try:
        assert isinstance(groups, EnvGroups) and len(groups.envs) == 2 and groups.num_envs == 4
        obs_g, info_g = groups.reset(seed=11)
        obs_w, info_w = whole.reset(seed=11)
        np.testing.assert_array_equal(obs_g, obs_w)
        np.testing.assert_array_equal(info_g["lives"], info_w["lives"])
        rng = np.random.default_rng(0)
        ends = 0
        for _ in range(2000):
            actions = rng.integers(0, 6, 4)
            chosen, (o_g, r_g, te_g, tr_g, i_g) = groups.step_with(
                lambda g, obs, a=actions: (a[2 * g : 2 * g + 2],), obs_g
            )
            o_w, r_w, te_w, tr_w, i_w = whole.step(actions)
            np.testing.assert_array_equal(chosen[0], actions)
            for a, b in ((o_g, o_w), (r_g, r_w), (te_g, te_w), (tr_g, tr_w), (i_g["env_id"], i_w["env_id"])):
                np.testing.assert_array_equal(a, b)
            if (te_w | tr_w).any():
                ends += 1
                done = np.flatnonzero(te_w | tr_w)
                np.testing.assert_array_equal(i_g["final_obs"][done], i_w["final_obs"][done])
            obs_g = o_g
            if ends >= 2:
                break
        assert ends >= 2  # random play loses a game of Pong (21 points) in about 800 steps
    finally:
        groups.close()
        whole.close()


def _rollouts(
    config: str,
    overrides: list[str],
    seed: int,
    n: int,
    params=None,
    *,
    chooses_ahead: bool = True,
    new_versions: bool = False,
):
    """``n`` rollouts of one actor; with ``new_versions`` a new parameter version (the first
    scaled by 1.1 per version) is published as each rollout arrives."""
    cfg = load_config(config, overrides, check_env=False)
    queue, topic = LocalQueue(capacity_bytes=1 << 33), LocalTopic()
    actor = PPOActorRole(cfg, 0, seed, queue, topic.subscribe(), n_actors=1, balance=False)
    actor.chooses_ahead &= chooses_ahead
    if params is None:
        params = {k: v.numpy().copy() for k, v in actor.policy.net.state_dict().items()}  # not views of the net
    topic.publish(0, {"params": params, "consumed": 0})
    actor.wait_for_params(5.0)
    try:
        rollouts: list[dict] = []
        while len(rollouts) < n:
            actor.step()
            for item in queue.poll():
                rollouts.append(item.payload)
                if new_versions:
                    version = len(rollouts)
                    topic.publish(version, {"params": {k: v * 1.1**version for k, v in params.items()}, "consumed": 0})
    finally:
        actor.close()
    return rollouts[:n], params


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "config, overrides",
    [
        # an untrained policy ends CartPole episodes within a rollout: final observations merged
        ("configs/cartpole_ppo.yaml", ["env.num_envs=4", "algo.rollout_steps=128"]),
        pytest.param(
            "configs/pong_ppo_small.yaml", ["env.num_envs=4", "algo.rollout_steps=32"], marks=pytest.mark.slow
        ),
    ],
    ids=["cartpole-sync", "pong-send-recv"],
)
def test_a_ppo_actor_in_two_step_groups_makes_the_rollouts_of_one_vector_env(config, overrides, one_torch_thread):
    one, params = _rollouts(config, [*overrides, "env.step_groups=1"], 5, 2)
    two, _ = _rollouts(config, [*overrides, "env.step_groups=2"], 5, 2, params)
    _assert_same_rollouts(one, two)
    if "cartpole" in config:
        assert any(r["dones"].any() for r in one)


def _assert_same_rollouts(one: list[dict], two: list[dict]) -> None:
    assert len(one) == len(two)
    for a, b in zip(one, two):
        assert a.keys() == b.keys()
        for k in a:
            if a[k].dtype.kind == "f" and k in ("logp", "values", "last_values"):
                # the network may see batches of another size: float sums may round differently
                np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)
            elif k != "created":
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.slow  # about 600 steps of Pong, twice for each group count
@pytest.mark.timeout(120)
@pytest.mark.parametrize("groups", [1, 2])
def test_choosing_the_next_actions_before_a_steps_bookkeeping_changes_no_rollout(groups, one_torch_thread):
    """ale-py's envs get the next step's actions as soon as they are received (the emulators
    run during the step's bookkeeping); each rollout's first actions still come after the
    parameters are probed. The rollouts are those of choosing after the bookkeeping, across
    rollout boundaries, parameter versions and lives lost (random play loses a life of
    Breakout every few dozen steps)."""
    overrides = ["env.id=ALE/Breakout-v5", "env.num_envs=4", "algo.rollout_steps=100", f"env.step_groups={groups}"]
    ahead, params = _rollouts("configs/pong_ppo_small.yaml", overrides, 3, 3, new_versions=True)
    in_turn, _ = _rollouts(
        "configs/pong_ppo_small.yaml", overrides, 3, 3, params, chooses_ahead=False, new_versions=True
    )
    assert [int(r["version"]) for r in ahead] == [0, 1, 2]
    _assert_same_rollouts(ahead, in_turn)
    assert any(r["dones"].any() for r in ahead)


@pytest.mark.timeout(60)
def test_an_actor_closed_with_a_step_in_flight_closes_its_envs():
    cfg = load_config("configs/pong_ppo_small.yaml", ["env.num_envs=2", "algo.rollout_steps=8"], check_env=False)
    queue, topic = LocalQueue(capacity_bytes=1 << 30), LocalTopic()
    actor = PPOActorRole(cfg, 0, 1, queue, topic.subscribe(), n_actors=1, balance=False)
    topic.publish(0, {"params": {k: v.numpy() for k, v in actor.policy.net.state_dict().items()}, "consumed": 0})
    actor.wait_for_params(5.0)
    assert actor.chooses_ahead
    for _ in range(3):
        actor.step()
    assert actor._next_choice is not None and actor.env._in_flight  # the fourth step is with the emulators
    actor.close()
    assert not actor.env._in_flight


def test_num_envs_that_do_not_split_into_the_groups_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match="make num_envs a multiple of step_groups"):
        load_config("configs/pong_ppo_small.yaml", ["env.num_envs=6", "env.step_groups=4"], check_env=False)
