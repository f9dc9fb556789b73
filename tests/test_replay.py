"""Unit tests of the bounded replay memory (tianji_dask/replay.py). No cluster."""

from __future__ import annotations

import numpy as np
import pytest

from tianji_dask.roles.replay import FIELDS, ReplayMemory

OBS_SHAPE = (3,)


def batch(start: int, n: int) -> dict[str, np.ndarray]:
    """``n`` transitions numbered ``start, start+1, ...``: every field encodes the number,
    so a sampled transition shows which insertion it came from and that its fields belong together."""
    k = np.arange(start, start + n)
    obs = np.repeat(k[:, None], OBS_SHAPE[0], axis=1).astype(np.float32)
    return {
        "obs": obs,
        "next_obs": obs + 0.5,
        "actions": k.astype(np.int64),
        "rewards": k.astype(np.float32) * 2,
        "discounts": (k % 2).astype(np.float32) * 0.99,
    }


def consistent(s: dict[str, np.ndarray]) -> None:
    k = s["actions"]
    np.testing.assert_array_equal(s["obs"], np.repeat(k[:, None], OBS_SHAPE[0], axis=1))
    np.testing.assert_array_equal(s["next_obs"], s["obs"] + 0.5)
    np.testing.assert_array_equal(s["rewards"], k * 2)
    np.testing.assert_array_equal(s["discounts"], ((k % 2) * 0.99).astype(np.float32))


@pytest.mark.timeout(10)
def test_capacity_and_memory_are_fixed_while_adding_ten_times_capacity():
    cap = 100
    m = ReplayMemory(cap, OBS_SHAPE)
    nbytes = m.nbytes
    # preallocated: 2 obs arrays of float32 x 3, int64 actions, float32 rewards and discounts
    assert nbytes == cap * (2 * 3 * 4 + 8 + 4 + 4)
    for start in range(0, 10 * cap, 37):  # chunks that straddle the ring's end
        m.add(batch(start, 37))
        assert len(m) <= cap
        assert m.capacity == cap
        assert m.nbytes == nbytes
    assert len(m) == cap
    assert m.added == len(range(0, 10 * cap, 37)) * 37


@pytest.mark.timeout(10)
def test_oldest_transitions_are_overwritten():
    m = ReplayMemory(10, OBS_SHAPE)
    m.add(batch(0, 7))
    m.add(batch(7, 7))  # 14 added into 10 slots: 0..3 are gone
    s = m.sample(2000, np.random.default_rng(0))
    assert set(s["actions"].tolist()) == set(range(4, 14))
    consistent(s)


@pytest.mark.timeout(10)
def test_sampling_only_from_the_filled_part():
    m = ReplayMemory(1000, OBS_SHAPE)
    m.add(batch(1, 5))  # numbers 1..5; the zero-filled rest of the ring would show up as 0
    assert len(m) == 5
    s = m.sample(5000, np.random.default_rng(1))
    assert set(s["actions"].tolist()) == {1, 2, 3, 4, 5}
    consistent(s)
    counts = np.bincount(s["actions"], minlength=6)[1:]
    assert counts.min() > 5000 / 5 * 0.8  # uniform: 1000 each, far from 800 by 6 sigma


@pytest.mark.timeout(10)
def test_sample_shapes_and_dtypes():
    m = ReplayMemory(50, (4, 2), obs_dtype=np.uint8)
    obs = np.arange(30 * 8, dtype=np.uint8).reshape(30, 4, 2)
    m.add({"obs": obs, "next_obs": obs, "actions": np.arange(30), "rewards": np.ones(30), "discounts": np.zeros(30)})
    s = m.sample(17, np.random.default_rng(2))
    assert set(s) == set(FIELDS)
    assert s["obs"].shape == s["next_obs"].shape == (17, 4, 2)
    assert s["obs"].dtype == s["next_obs"].dtype == np.uint8
    for k, dtype in (("actions", np.int64), ("rewards", np.float32), ("discounts", np.float32)):
        assert s[k].shape == (17,)
        assert s[k].dtype == dtype


@pytest.mark.timeout(10)
def test_samples_are_copies():
    m = ReplayMemory(8, OBS_SHAPE)
    m.add(batch(0, 8))
    s = m.sample(8, np.random.default_rng(3))
    s["obs"][:] = -1
    consistent(m.sample(100, np.random.default_rng(4)))


@pytest.mark.timeout(10)
def test_empty_sample_raises():
    m = ReplayMemory(8, OBS_SHAPE)
    with pytest.raises(ValueError, match="empty"):
        m.sample(1, np.random.default_rng(0))


@pytest.mark.timeout(10)
def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        ReplayMemory(0, OBS_SHAPE)


@pytest.mark.timeout(10)
def test_batch_larger_than_capacity_keeps_the_newest():
    m = ReplayMemory(10, OBS_SHAPE)
    m.add(batch(100, 3))
    m.add(batch(0, 25))  # only 15..24 fit
    assert len(m) == 10
    s = m.sample(2000, np.random.default_rng(5))
    assert set(s["actions"].tolist()) == set(range(15, 25))
    consistent(s)
    # the ring keeps working afterwards: 3 more overwrite the oldest three (15, 16, 17)
    m.add(batch(25, 3))
    s = m.sample(2000, np.random.default_rng(6))
    assert set(s["actions"].tolist()) == set(range(18, 28))
