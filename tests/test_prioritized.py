"""Prioritized replay: the sum-tree, the importance weights, the replay's priorities and the
learner that updates them."""

import numpy as np
import pytest
import torch
from conftest import CONFIG

from tianji_dask.algos.dqn.core import double_dqn_loss
from tianji_dask.config import load_config
from tianji_dask.roles.buffer import ReplayMemory
from tianji_dask.roles.prioritized import PrioritizedReplay, PrioritySettings, importance_weights
from tianji_dask.roles.sum_tree import SumTree


def frequencies(tree: SumTree, n: int, seed: int = 0) -> np.ndarray:
    drawn = tree.sample(n, np.random.default_rng(seed))
    return np.bincount(drawn, minlength=tree.capacity) / n


def test_the_sum_tree_draws_in_proportion_to_the_priorities_and_follows_updates():
    tree = SumTree(5)  # not a power of two
    tree.update(np.arange(5), np.array([1.0, 2.0, 3.0, 4.0, 0.0]))
    assert tree.total == 10 and tree.min == 1
    np.testing.assert_allclose(frequencies(tree, 40_000), [0.1, 0.2, 0.3, 0.4, 0.0], atol=0.005)
    tree.update(np.array([0, 4, 4]), np.array([6.0, 9.0, 5.0]))  # a repeated index: the last value
    assert tree.total == 20 and list(tree[np.arange(5)]) == [6, 2, 3, 4, 5]
    np.testing.assert_allclose(frequencies(tree, 40_000, seed=1), [0.3, 0.1, 0.15, 0.2, 0.25], atol=0.005)
    tree.update(np.array([1]), np.array([0.0]))
    assert tree.min == 3 and frequencies(tree, 10_000)[1] == 0


def test_the_sum_tree_finds_each_leaf_of_a_prefix_sum():
    tree = SumTree(4)
    tree.update(np.arange(4), np.array([1.0, 0.0, 2.0, 1.0]))
    # cumulative 1, 1, 3, 4: a mass falls in the first leaf whose cumulative sum exceeds it
    assert list(tree.find(np.array([0.0, 0.999, 1.0, 2.5, 3.0, 3.999]))) == [0, 0, 2, 2, 3, 3]
    single = SumTree(1)
    single.update(np.array([0]), np.array([0.5]))
    assert list(single.sample(3, np.random.default_rng(0))) == [0, 0, 0]
    with pytest.raises(ValueError, match="all zero"):
        SumTree(3).sample(1, np.random.default_rng(0))
    with pytest.raises(IndexError):
        tree.update(np.array([4]), np.array([1.0]))


def test_importance_weights_on_a_hand_computed_case():
    # scaled priorities 1 and 3 (total 4) of 2 transitions, beta 0.5: P = 0.25, 0.75;
    # w = (2 P)^-0.5 = 1.41421, 0.81650; the largest weight is the smallest priority's, 1.41421
    w = importance_weights(np.array([1.0, 3.0]), 4.0, 1.0, 2, 0.5)
    np.testing.assert_allclose(w, [1.0, 0.81650 / 1.41421], rtol=1e-4)
    assert importance_weights(np.array([3.0]), 4.0, 1.0, 2, 0.0)[0] == 1.0  # beta 0: no correction


def memory_of(n: int, capacity: int = 8) -> PrioritizedReplay:
    settings = PrioritySettings(alpha=1.0, beta=0.4, beta_steps=100, eps=1e-6)
    replay = PrioritizedReplay(ReplayMemory(capacity, (1,)), settings)
    replay.add(
        {
            "obs": np.arange(n, dtype=np.float32)[:, None],
            "next_obs": np.zeros((n, 1), np.float32),
            "actions": np.zeros(n, np.int64),
            "rewards": np.arange(n, dtype=np.float32),
            "discounts": np.ones(n, np.float32),
        }
    )
    return replay


def test_new_transitions_enter_with_the_largest_priority_and_the_learner_sets_their_own():
    replay = memory_of(4)
    batch = replay.sample(4, np.random.default_rng(0), beta=0.4)
    np.testing.assert_array_equal(batch["weights"], np.ones(4, np.float32))  # all at priority 1
    keys = np.stack([np.arange(4), np.ones(4, np.int64)])  # slots 0..3, written by the first add
    replay.update_priorities(keys, np.array([1.0, -3.0, 0.0, 4.0]))
    assert replay.max_priority == pytest.approx(4.0)
    p = np.array([1.0, 3.0, 0.0, 4.0]) + 1e-6
    np.testing.assert_allclose(replay.tree[np.arange(4)], p)
    drawn = replay.sample(8_000, np.random.default_rng(1), beta=1.0)
    freq = np.bincount(drawn["rewards"].astype(int), minlength=4) / 8_000
    np.testing.assert_allclose(freq, p / p.sum(), atol=0.01)
    # beta 1: w_i = (N P_i)^-1 normalised by the smallest priority's: p_min / p_i
    rows = drawn["keys"][0]
    np.testing.assert_allclose(drawn["weights"], (p[2] / p[rows]).astype(np.float32), rtol=1e-5)


def test_a_slot_written_again_keeps_its_new_transitions_priority():
    replay = memory_of(8, capacity=8)
    batch = replay.sample(2, np.random.default_rng(0), beta=0.4)
    keys = batch["keys"]
    replay.add({k: v[:1] for k, v in replay.memory.get(np.arange(8)).items()})  # overwrites slot 0
    before = replay.tree[np.arange(8)].copy()
    replay.update_priorities(np.stack([np.array([0, 1]), np.array([1, 1])]), np.array([50.0, 7.0]))
    after = replay.tree[np.arange(8)]
    assert after[0] == before[0]  # slot 0 holds the second add's transition now
    assert after[1] == pytest.approx(7.0)
    assert keys.shape == (2, 2)


def test_the_weighted_loss_and_the_td_errors_on_a_hand_computed_case():
    q = torch.tensor([[1.0, 2.0], [3.0, 0.0]], requires_grad=True)
    nxt = torch.zeros(2, 2)
    # targets = rewards (discount 0): TD errors 0.5 - 1 = -0.5 and 5 - 3 = 2
    loss, _, td = double_dqn_loss(
        q, nxt, nxt, torch.tensor([0, 0]), torch.tensor([0.5, 5.0]), torch.zeros(2), torch.tensor([1.0, 0.25])
    )
    np.testing.assert_allclose(td.numpy(), [-0.5, 2.0])
    # Huber: 0.5 * 0.25 = 0.125 and 2 - 0.5 = 1.5; weighted mean (0.125 + 0.25 * 1.5) / 2 = 0.25
    assert loss.item() == pytest.approx(0.25)


def test_a_prioritized_learner_gives_the_transitions_it_trained_on_their_td_errors():
    from tianji_dask.runtime.serial import SerialRun

    cfg = load_config(CONFIG, ["algo.replay=prioritized", "algo.learning_starts=256", "algo.ratio_tolerance=null"])
    run = SerialRun(cfg)
    run.learner.publish()
    run.actor.probe_params()
    while len(run.buffer) < 256:
        run.actor.step()
        run.buffer.ingest()
    replay = run.buffer.replay
    assert isinstance(replay, PrioritizedReplay)
    stored = np.arange(len(replay))
    before = replay.tree[stored].copy()  # the actor's priorities
    for _ in range(20):
        assert run.learner.step()
    changed = replay.tree[stored] != before
    assert 0 < changed.sum() <= 20 * cfg.algo.batch_size
    run.actor.close()


def test_actors_send_the_td_errors_of_their_own_q_network_as_priorities():
    """Ape-X's initial priorities: |R + discount * max Q(s') - Q(s, a)| with the actor's network,
    the bootstrap of the window's last step completed one step later or at the flush."""
    from tianji_dask.runtime.serial import SerialRun

    overrides = ["algo.replay=prioritized", "algo.n_step=3", "algo.ratio_tolerance=null", "channel.chunk_steps=10"]
    run = SerialRun(load_config(CONFIG, overrides))
    run.learner.publish()
    run.actor.probe_params()
    for _ in range(95):  # 9 full chunks and a partial one: the flush completes the last rows
        run.actor.step()
    run.actor.flush()
    chunks = [item.payload for item in run.queue.poll()]
    assert len(chunks) == 10
    policy = run.actor.policy
    for c in chunks:
        q = policy.q_values(c["obs"])[np.arange(len(c["actions"])), c["actions"]]
        bootstrap = c["discounts"] * policy.q_values(c["next_obs"]).max(axis=1)
        np.testing.assert_allclose(c["priorities"], np.abs(c["rewards"] + bootstrap - q), rtol=1e-5, atol=1e-5)
    assert (np.concatenate([c["discounts"] for c in chunks]) == 0).any()  # episodes ended on the way
    replay = run.buffer.replay
    for c in chunks:  # the replay takes them as the transitions' first priorities
        replay.add(c)
    stored = np.concatenate([c["priorities"] for c in chunks])
    np.testing.assert_allclose(replay.tree[np.arange(len(stored))], (stored + 1e-6) ** 0.6, rtol=1e-5)
    run.actor.close()


@pytest.mark.parametrize("frames", [False, True])
def test_a_prioritized_replay_restored_from_its_state_and_deltas_samples_the_same(frames):
    """Priorities, which add wrote each slot, the largest priority and the tree's sums and
    minima: all bit for bit, so the restored replay draws the same batches with the same weights."""
    from test_replay import frame_chunks

    from tianji_dask.roles.frame_replay import FrameReplay
    from tianji_dask.roles.replay_state import merged

    settings = PrioritySettings(alpha=0.6, beta=0.4, beta_steps=1000, eps=1e-6)

    def replay():
        memory = FrameReplay(40, frame_shape=(3, 3), frame_capacity=46) if frames else ReplayMemory(40, (2,))
        return PrioritizedReplay(memory, settings)

    def chunks():
        if frames:
            yield from frame_chunks(10, 9)
            return
        for start in range(0, 90, 9):
            k = np.arange(start, start + 9)
            obs = np.stack([k, -k], axis=1).astype(np.float32)
            yield {"obs": obs, "next_obs": obs + 1, "actions": k, "rewards": k / 3, "discounts": np.ones(9, np.float32)}

    live, kept, rng = replay(), None, np.random.default_rng(0)
    for i, c in enumerate(chunks()):
        if i % 3 == 1:
            c = {**c, "priorities": rng.random(len(c["actions"])) * 5}  # an actor's own (Ape-X)
        live.add(c)
        batch = live.sample(16, rng, beta=0.5)
        live.update_priorities(batch["keys"], rng.normal(size=16) * 3)
        delta = live.state(since=None if kept is None else kept.mark())
        kept = delta if kept is None else merged(kept, delta)
    restored = replay()
    restored.restore(kept)
    np.testing.assert_array_equal(live.tree._sum, restored.tree._sum)
    np.testing.assert_array_equal(live.tree._min, restored.tree._min)
    np.testing.assert_array_equal(live._written_by, restored._written_by)
    assert (live.max_priority, live._writes) == (restored.max_priority, restored._writes)
    x, y = live.sample(64, np.random.default_rng(9), beta=0.7), restored.sample(64, np.random.default_rng(9), beta=0.7)
    for k in x:
        np.testing.assert_array_equal(np.asarray(x[k]), np.asarray(y[k]), err_msg=k)
    # the learner's new priorities land in the same slots of both
    live.update_priorities(x["keys"], np.arange(64.0))
    restored.update_priorities(y["keys"], np.arange(64.0))
    np.testing.assert_array_equal(live.tree._sum, restored.tree._sum)
