"""Unit tests of the actor's env helpers (tianji_dask/envs.py) and seeding. No cluster."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from tianji_dask.envs import EpisodeTracker, make_vector_env, next_observations
from tianji_dask.seeding import role_seeds

F, T = False, True


# ------------------------------------------------------------------ EpisodeTracker
def test_episode_tracker_per_env_returns_and_lengths():
    tr = EpisodeTracker(2)
    tr.update(np.array([1.0, 2.0]), np.array([F, F]), now=10.0)
    assert tr.drain() == [] and tr.count == 0
    tr.update(np.array([1.0, 1.0]), np.array([T, F]), now=11.0)  # env 0: 1+1 in 2 steps
    tr.update(np.array([0.5, 1.0]), np.array([T, T]), now=12.0)  # env 0: 0.5 in 1; env 1: 2+1+1 in 3
    tr.update(np.array([-3.0, 7.0]), np.array([F, F]), now=13.0)  # unfinished: not reported
    assert tr.drain() == [[2.0, 2, 11.0], [0.5, 1, 12.0], [4.0, 3, 12.0]]
    assert tr.count == 3
    assert tr.drain() == []  # drained once
    tr.update(np.array([1.0, 1.0]), np.array([F, T]), now=14.0)
    assert tr.drain() == [[8.0, 2, 14.0]]  # env 1 kept counting across the earlier drain
    assert tr.count == 4


def test_episode_tracker_matches_a_real_vector_env():
    n_envs, steps = 4, 300
    env = make_vector_env("CartPole-v1", n_envs, seed=3)
    tr = EpisodeTracker(n_envs)
    rng = np.random.default_rng(0)
    done_total = 0
    for _ in range(steps):
        _, rewards, term, trunc, _ = env.step(rng.integers(0, 2, n_envs))
        dones = term | trunc
        done_total += int(dones.sum())
        tr.update(rewards, dones, now=0.0)
    finished = tr.drain()
    env.close()
    assert len(finished) == done_total == tr.count > n_envs  # random CartPole: ~20-step episodes
    # CartPole pays 1 per step: each return equals its length, and the lengths add up
    assert all(r == length for r, length, _ in finished)
    assert sum(length for _, length, _ in finished) + int(tr._lengths.sum()) == steps * n_envs


# ------------------------------------------------------------------ next_observations
def test_next_observations_uses_final_obs_where_done():
    obs = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]], dtype=np.float32)
    final = np.array([None, np.array([9.0, 9.0], dtype=np.float32), None], dtype=object)
    infos = {"final_obs": final, "_final_obs": np.array([F, T, F])}
    nxt = next_observations(obs, np.array([F, T, F]), infos)
    np.testing.assert_array_equal(nxt, [[0.0, 0.0], [9.0, 9.0], [2.0, 2.0]])
    assert nxt.dtype == np.float32
    np.testing.assert_array_equal(obs[1], [1.0, 1.0])  # the env's reset observation is untouched
    # nothing done: the observations as they are, no final_obs needed
    assert next_observations(obs, np.array([F, F, F]), {}) is obs


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
def test_make_vector_env_box_obs_and_same_step_autoreset(env_id):
    n_envs = 3
    env = make_vector_env(env_id, n_envs, seed=0)
    try:
        space = env.single_observation_space
        assert isinstance(space, gym.spaces.Box)
        assert isinstance(env.single_action_space, gym.spaces.Discrete)
        assert np.can_cast(space.dtype, np.float32, casting="same_kind")
        obs, _ = env.reset(seed=0)
        assert obs.shape == (n_envs, *space.shape)
        rng = np.random.default_rng(0)
        checked = 0
        for _ in range(600):  # random Acrobot episodes end by truncation at 500 steps
            prev = obs
            obs, rewards, term, trunc, infos = env.step(rng.integers(0, env.single_action_space.n, n_envs))
            assert obs.shape == prev.shape
            assert np.all(np.isfinite(obs.astype(np.float32)))
            dones = term | trunc
            if not dones.any():
                assert "final_obs" not in infos
                continue
            # same step: the returned obs already starts the next episode and the last one is
            # in final_obs; next_observations puts it back
            nxt = next_observations(obs.astype(np.float32), dones, infos)
            for i in range(n_envs):
                if dones[i]:
                    final = np.asarray(infos["final_obs"][i], dtype=np.float32)
                    assert final.shape == space.shape
                    np.testing.assert_array_equal(nxt[i], final)
                    assert not np.array_equal(final, obs[i])
                    if env_id == "CartPole-v1" and term[i]:  # a terminal state is out of bounds,
                        x, theta = final[0], final[2]  # the reset state is near zero
                        assert abs(x) > 2.4 or abs(theta) > 0.2095
                        assert np.all(np.abs(obs[i]) <= 0.05)
                    checked += 1
                else:
                    np.testing.assert_array_equal(nxt[i], obs[i])
            if checked >= 3:
                break
        assert checked >= 3, "no episode ended"
    finally:
        env.close()


def test_make_vector_env_seeds_its_envs_seed_plus_k():
    a = make_vector_env("CartPole-v1", 3, seed=10)
    b = make_vector_env("CartPole-v1", 3, seed=10)
    c = make_vector_env("CartPole-v1", 1, seed=11)
    try:
        states_a = [np.array(e.unwrapped.state) for e in a.envs]
        states_b = [np.array(e.unwrapped.state) for e in b.envs]
        for sa, sb in zip(states_a, states_b):
            np.testing.assert_array_equal(sa, sb)  # deterministic
        np.testing.assert_array_equal(states_a[1], np.array(c.envs[0].unwrapped.state))
        assert not np.array_equal(states_a[0], states_a[1])  # the copies differ
    finally:
        for e in (a, b, c):
            e.close()


# ------------------------------------------------------------------ seeding
def test_role_seeds_deterministic_and_distinct():
    s = role_seeds(0, 4)
    assert s == role_seeds(0, 4)
    assert len(s.actors) == 4
    all_seeds = [*s.actors, s.buffer, s.learner]
    assert len(set(all_seeds)) == len(all_seeds)
    assert all(isinstance(x, int) and 0 <= x < 2**32 for x in all_seeds)
    other = role_seeds(1, 4)
    assert set([*other.actors, other.buffer, other.learner]).isdisjoint(all_seeds)
    # actor i's seed does not depend on how many actors there are (SeedSequence.spawn order)
    assert role_seeds(0, 2).actors == s.actors[:2]


def test_role_seeds_env_ranges_do_not_overlap():
    # actor i steps envs with seeds actors[i] + k, k < num_envs: those ranges must not collide
    s = role_seeds(0, 16)
    num_envs = 64
    env_seeds = [a + k for a in s.actors for k in range(num_envs)]
    assert len(set(env_seeds)) == len(env_seeds)
