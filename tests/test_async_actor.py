"""The PPO actor on an asynchronous vector env (env.async_batch): each rollout column is one env's
own trajectory, whatever order the emulators hand the envs back in.

ale-py's envs step on native threads and come back in batches in whatever order they finish, so
these tests check what holds for any order: every column of every rollout is what a synchronous
vector env of the same seeds makes with that column's actions (observations, training rewards,
dones), its frames rebuild exactly the stacks the policy acted on, a column's last value is the
value its next column starts with, and versions, the balance controller and the bad configs
behave as the docs say.
"""

from __future__ import annotations

import numpy as np
import pytest

from tianji_dask.algos.ppo.async_actor import PPOAsyncActorRole
from tianji_dask.algos.ppo.spec import PPOSpec
from tianji_dask.channels import LocalQueue, LocalTopic
from tianji_dask.config import ConfigError, load_config
from tianji_dask.envs import AtariTrainingSignals, make_atari_vector_env

SMALL = "configs/pong_ppo_small.yaml"
# random play on Breakout loses a life every few dozen steps: episodic-life dones inside rollouts
BREAKOUT = ["env.id=ALE/Breakout-v5", "env.atari_threads=2"]


def _actor(overrides: list[str], seed: int = 3, balance: bool = False):
    cfg = load_config(SMALL, [*BREAKOUT, *overrides], check_env=False)
    queue, topic = LocalQueue(capacity_bytes=1 << 33), LocalTopic()
    actor = PPOSpec().make_actor(cfg, 0, seed, queue, topic.subscribe(), n_actors=1, balance=balance)
    params = {k: v.numpy().copy() for k, v in actor.policy.net.state_dict().items()}
    topic.publish(0, {"params": params, "consumed": 0})
    actor.wait_for_params(5.0)
    return actor, queue, topic, params


def _record_acting(actor) -> dict[int, list[np.ndarray]]:
    """Each env's observations, in the order the policy acted on them."""
    seen: dict[int, list[np.ndarray]] = {e: [] for e in range(actor.num_envs)}
    act = actor.policy.act

    def recording_act(obs, envs):
        for row, e in enumerate(envs):
            seen[int(e)].append(obs[row].copy())
        return act(obs, envs)

    actor.policy.act = recording_act
    return seen


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_each_column_of_each_rollout_is_its_envs_own_trajectory(one_torch_thread):
    N, T, n = 4, 40, 4
    actor, queue, _, _ = _actor([f"env.num_envs={N}", "env.async_batch=2", f"algo.rollout_steps={T}"], seed=5)
    assert isinstance(actor, PPOAsyncActorRole)
    seen = _record_acting(actor)
    rollouts: list[dict] = []
    try:
        while len(rollouts) < n:
            actor.step()
            rollouts += [item.payload for item in queue.poll()]
    finally:
        actor.close()
    rollouts = rollouts[:n]
    assert [int(r["version"]) for r in rollouts] == [0] * n
    for i, r in enumerate(rollouts):
        assert r["obs_frames"].shape == (T, N, 4) and r["actions"].shape == (T, N)
        stacks = r["frames"][r["obs_frames"]]  # (T, N, 4, 84, 84)
        for e in range(N):
            np.testing.assert_array_equal(stacks[:, e], np.stack(seen[e][i * T : (i + 1) * T]), err_msg=f"{i} {e}")
        if i + 1 < n:  # one version throughout: a column's last value starts the next column
            np.testing.assert_allclose(r["last_values"], rollouts[i + 1]["values"][0], rtol=1e-6, atol=1e-6)
        # each step's new frame once, plus each column's first stack and the stacks of new episodes
        assert len(r["frames"]) <= T * N + 8 * N + 4 * int(r["dones"].sum())

    # the same seeds stepped together, each env with its columns' actions, make the same columns
    sync = make_atari_vector_env("ALE/Breakout-v5", N, "ale_vector", 1)
    try:
        obs, infos = sync.reset(seed=5)
        signals = AtariTrainingSignals(infos["lives"])
        for i, r in enumerate(rollouts):
            for t in range(T):
                np.testing.assert_array_equal(obs, r["frames"][r["obs_frames"][t]], err_msg=f"obs {i} {t}")
                obs, rewards, terminated, truncated, infos = sync.step(r["actions"][t])
                rewards, _, dones = signals(rewards, terminated, truncated, infos)
                np.testing.assert_array_equal(rewards, r["rewards"][t], err_msg=f"rewards {i} {t}")
                np.testing.assert_array_equal(dones.astype(np.float32), r["dones"][t], err_msg=f"dones {i} {t}")
    finally:
        sync.close()
    assert sum(r["dones"].sum() for r in rollouts) >= 1  # episodic-life ends inside the columns


@pytest.mark.timeout(120)
def test_rollouts_carry_the_version_they_opened_with_and_the_controller_holds_the_actor():
    """With the balance controller on and no learner, the actor opens its credit of rollouts for
    version 0, finishes them (envs whose column is done play on outside any rollout while others
    fill theirs, so no rollout waits for a held one) and then holds every env (step() returns
    False); a new version lets it make its share (one more), which carries it."""
    actor, queue, topic, params = _actor(
        ["env.num_envs=4", "env.async_batch=2", "algo.rollout_steps=8", "algo.ratio_tolerance=0.25"], balance=True
    )
    pushed: list[dict] = []

    def until_held() -> None:
        for _ in range(500):  # about 100 batches make two rollouts
            went_on = actor.step()
            pushed.extend(item.payload for item in queue.poll())
            if not went_on:
                return
        raise AssertionError(f"the actor was never held; it pushed {len(pushed)} rollouts")

    try:
        until_held()
        assert actor.credit.cap == 2  # one share plus the one made while the learner trains
        assert [int(r["version"]) for r in pushed] == [0, 0]  # both finished: none waits for a held one
        assert actor.counters.env_steps == 2 * 8 * 4 and actor.counters.throttled_s > 0
        assert not actor.step() and actor.counters.env_steps == 2 * 8 * 4  # held it stays
        topic.publish(1, {"params": {k: v * 1.1 for k, v in params.items()}, "consumed": 0})
        until_held()
        assert [int(r["version"]) for r in pushed] == [0, 0, 1]
        assert actor.counters.param_version == 1
    finally:
        actor.close()


@pytest.mark.parametrize(
    "overrides, fix",
    [
        (["env.async_batch=4"], r"env.async_batch=4 must be below env.num_envs=4.*env.async_batch=2"),
        (["env.async_batch=2", "env.step_groups=2"], r"keep one \(env.step_groups=1\)"),
        (["env.async_batch=2", "env.atari_backend=gymnasium"], r"needs ale-py's vector env.*set env.async_batch=0"),
    ],
    ids=["whole-batch", "with-step-groups", "gymnasium-backend"],
)
def test_async_batches_that_cannot_work_are_refused_with_the_fix(overrides, fix):
    with pytest.raises(ConfigError, match=fix):
        load_config(SMALL, overrides, check_env=False)


def test_async_batches_are_refused_for_dqn_and_non_atari_envs():
    with pytest.raises(ConfigError, match=r"env.async_batch=2 is for PPO's actors.*set env.async_batch=0"):
        load_config("configs/pong_dqn_small.yaml", ["env.async_batch=2"], check_env=False)
    with pytest.raises(ConfigError, match=r"needs ale-py's vector env \(env.kind=atari"):
        load_config("configs/cartpole_ppo.yaml", ["env.async_batch=2"], check_env=False)


@pytest.mark.timeout(60)
def test_an_async_actor_closed_with_steps_in_flight_closes_its_envs(one_torch_thread):
    actor, _, _, _ = _actor(["env.num_envs=4", "env.async_batch=2", "algo.rollout_steps=8"])
    for _ in range(5):
        actor.step()
    assert actor.unsent() > 0
    actor.close()  # returns: the emulators' threads are joined with their steps in flight
