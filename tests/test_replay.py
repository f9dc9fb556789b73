"""Unit tests of the bounded replay memory (tianji_dask/replay.py). No cluster."""

from __future__ import annotations

import numpy as np
import pytest

from tianji_dask.roles.buffer import FIELDS, ReplayMemory

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


def test_oldest_transitions_are_overwritten():
    m = ReplayMemory(10, OBS_SHAPE)
    m.add(batch(0, 7))
    m.add(batch(7, 7))  # 14 added into 10 slots: 0..3 are gone
    s = m.sample(2000, np.random.default_rng(0))
    assert set(s["actions"].tolist()) == set(range(4, 14))
    consistent(s)


def test_sampling_only_from_the_filled_part():
    m = ReplayMemory(1000, OBS_SHAPE)
    m.add(batch(1, 5))  # numbers 1..5; the zero-filled rest of the ring would show up as 0
    assert len(m) == 5
    s = m.sample(5000, np.random.default_rng(1))
    assert set(s["actions"].tolist()) == {1, 2, 3, 4, 5}
    consistent(s)
    counts = np.bincount(s["actions"], minlength=6)[1:]
    assert counts.min() > 5000 / 5 * 0.8  # uniform: 1000 each, far from 800 by 6 sigma


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


def test_samples_are_copies():
    m = ReplayMemory(8, OBS_SHAPE)
    m.add(batch(0, 8))
    s = m.sample(8, np.random.default_rng(3))
    s["obs"][:] = -1
    consistent(m.sample(100, np.random.default_rng(4)))


def test_empty_sample_raises():
    m = ReplayMemory(8, OBS_SHAPE)
    with pytest.raises(ValueError, match="empty"):
        m.sample(1, np.random.default_rng(0))


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        ReplayMemory(0, OBS_SHAPE)


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


# ------------------------------------------------------------------ state() / restore()
# A replay copied out (state) and put into a new memory (restore) must be the same memory, bit
# for bit: the same rows, write position and counters, so that what it samples and what later
# adds do to it are the same too. After the first copy only what was written since is sent.


def assert_same_uniform(a: ReplayMemory, b: ReplayMemory) -> None:
    for k in FIELDS:
        np.testing.assert_array_equal(a._data[k], b._data[k], err_msg=k)
    assert (a._pos, a._size, a.written, a.added) == (b._pos, b._size, b.written, b.added)
    for seed in range(3):
        x, y = a.sample(64, np.random.default_rng(seed)), b.sample(64, np.random.default_rng(seed))
        for k in FIELDS:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.mark.parametrize("n", [0, 7, 25, 80])  # empty, part-filled, wrapped
def test_a_uniform_replay_restored_from_its_state_is_the_same_memory(n):
    m = ReplayMemory(20, OBS_SHAPE)
    for start in range(0, n, 6):
        m.add(batch(start, min(6, n - start)))
    state = m.state()
    assert state.full and state.transitions == len(m) == min(n, 20)
    assert all(len(a) == len(m) for a in state.rings["transitions"].arrays.values())  # only the filled part
    restored = ReplayMemory(20, OBS_SHAPE)
    restored.restore(state)
    if n:
        assert_same_uniform(m, restored)
    # it goes on as the original does: the next adds land in the same rows
    m.add(batch(1000, 9))
    restored.add(batch(1000, 9))
    assert_same_uniform(m, restored)
    # the state is a copy: adding to the memory does not change it
    assert not np.isin(1000, state.rings["transitions"].arrays["actions"])


def test_a_uniform_replays_deltas_carry_only_what_was_added_and_merge_into_the_same_memory():
    from tianji_dask.roles.replay_state import merged

    m = ReplayMemory(20, OBS_SHAPE)
    m.add(batch(0, 8))
    kept = m.state()
    for start, n in ((8, 5), (13, 10), (23, 19)):  # filling, wrapping, wrapping again
        m.add(batch(start, n))
        delta = m.state(since=kept.mark())
        assert not delta.full and len(delta.rings["transitions"].arrays["actions"]) == n
        np.testing.assert_array_equal(delta.rings["transitions"].arrays["actions"], np.arange(start, start + n))
        kept = merged(kept, delta)
        restored = ReplayMemory(20, OBS_SHAPE)
        restored.restore(kept)
        assert_same_uniform(m, restored)
    # a whole capacity or more added since: the full filled part again
    m.add(batch(42, 20))
    assert m.state(since=kept.mark()).full
    # a mark of another memory (another token) gets the full state too
    other = ReplayMemory(20, OBS_SHAPE)
    other.add(batch(0, 8))
    assert m.state(since=other.state().mark()).full
    # a delta merged into a state it was not taken against is refused, not applied
    with pytest.raises(ValueError, match="not taken against"):
        merged(other.state(), m.state(since=m.state().mark()))
    with pytest.raises(ValueError, match="merge it into its full state"):
        ReplayMemory(20, OBS_SHAPE).restore(m.state(since=m.state().mark()))


def frame_chunks(chunks: int, per_chunk: int, stream: int = 0, stack: int = 4, shape=(3, 3)) -> list[dict]:
    """Chunks of one frame stream as an actor sends them (frames once; transitions as frame-id
    stacks that reach into the previous chunk's frames). Frame ``i`` holds ``i % 251`` and
    ``i // 251`` in its pixels, transition ``j`` (the stack ending at frame ``j``) has action ``j``."""
    from tianji_dask.roles.frame_replay import SEQ_BITS

    base = np.int64(stream) << SEQ_BITS
    out, seq = [], 0
    for c in range(chunks):
        new = per_chunk + (stack if c == 0 else 0)
        ids = np.arange(seq, seq + new, dtype=np.int64)
        frames = np.empty((new, *shape), np.uint8)
        frames[:] = (ids % 251).astype(np.uint8)[:, None, None]
        frames[:, 0, 0] = (ids // 251).astype(np.uint8)
        ends = ids if c else ids[stack:]
        obs = ends[:, None] - np.arange(stack, 0, -1)
        seq += new
        out.append(
            {
                "frames": frames,
                "frame_ids": base + ids,
                "obs": base + obs,
                "next_obs": base + obs + 1,
                "actions": ends,
                "rewards": ends.astype(np.float32) / 2,
                "discounts": (ends % 3 != 0).astype(np.float32) * 0.97,
            }
        )
    return out


def assert_same_frames(a, b) -> None:
    for name in ("_obs", "_next", "_oldest", "_actions", "_rewards", "_discounts"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    frames = [r._frames.array if hasattr(r._frames, "array") else r._frames.tensor.numpy() for r in (a, b)]
    np.testing.assert_array_equal(*frames)
    assert (a._pos, a._size, a.written, a.frames_written, a.added, a.unresolved) == (
        b._pos,
        b._size,
        b.written,
        b.frames_written,
        b.added,
        b.unresolved,
    )
    idx = np.arange(a.capacity)
    np.testing.assert_array_equal(a.valid(idx), b.valid(idx))
    x, y = a.sample(50, np.random.default_rng(4)), b.sample(50, np.random.default_rng(4))
    for k in x:
        np.testing.assert_array_equal(np.asarray(x[k]), np.asarray(y[k]), err_msg=k)


@pytest.mark.parametrize("device", [None, "cpu"])  # frames in numpy, or in a torch tensor
def test_a_frame_replay_restored_from_its_state_and_deltas_is_the_same_replay(device):
    from tianji_dask.roles.frame_replay import FrameReplay
    from tianji_dask.roles.replay_state import merged

    def replay():
        return FrameReplay(40, frame_shape=(3, 3), frame_capacity=42, device=device)

    chunks = frame_chunks(12, 9)
    live = replay()
    live.add(chunks[0])
    kept = live.state()
    assert kept.rings["frames"].arrays["frames"].shape == (13, 3, 3)  # only the frames written
    for c in chunks[1:]:  # both rings wrap; the oldest transitions lose frames
        live.add(c)
        delta = live.state(since=kept.mark())
        assert (
            len(delta.rings["frames"].arrays["frames"]) == 9 and len(delta.rings["transitions"].arrays["actions"]) == 9
        )
        kept = merged(kept, delta)
    assert live.unresolved == 0 and live.frames_written > 2 * 42 and not live.valid(np.arange(40)).all()
    restored = replay()
    restored.restore(kept)
    assert_same_frames(live, restored)
    # a new actor's stream (its first stack whole) goes on into the same rows of both
    fresh = frame_chunks(1, 5, stream=7)[0]
    live.add(fresh)
    restored.add(fresh)
    assert_same_frames(live, restored)
