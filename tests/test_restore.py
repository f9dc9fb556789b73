"""A learner core restored from its checkpoint continues exactly where the saved one was: the
next updates are bit-identical (networks, Adam's moments and step counts, the DQN target's sync
schedule, PPO's learning rate and minibatch shuffling). The state goes through a real checkpoint
on disk, as a resume does. No cluster."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tianji_dask.algos.dqn.core import DQNLearner
from tianji_dask.algos.ppo.core import PPOLearner
from tianji_dask.config.schema import DQNConfig, PPOConfig
from tianji_dask.results.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def dqn_batch(seed: int, n: int = 32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(n, 4)).astype(np.float32),
        "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
        "actions": rng.integers(0, 2, n).astype(np.int64),
        "rewards": rng.normal(size=n).astype(np.float32),
        "discounts": np.where(rng.random(n) < 0.2, 0.0, 0.9).astype(np.float32),
    }


def through_disk(state, tmp_path):
    save_checkpoint(tmp_path / "checkpoint", state, {"final": True})
    return load_checkpoint(tmp_path / "checkpoint")[0]


def assert_same_state(a, b) -> None:
    sa, sb = a.state(), b.state()
    assert sa.keys() == sb.keys()
    for comp in sa:
        assert sa[comp].keys() == sb[comp].keys(), comp
        for name in sa[comp]:
            assert torch.equal(sa[comp][name], sb[comp][name]), (comp, name)


@pytest.mark.timeout(60)
def test_dqn_restored_learner_makes_bit_identical_updates(tmp_path):
    cfg = DQNConfig(name="dqn", hidden_sizes=[16], lr=1e-2, batch_size=32, learning_starts=32, target_update_interval=3)
    original = DQNLearner(4, 2, cfg, seed=0)
    for s in range(4):  # Adam has moments and steps; the target synced at update 3
        original.update(dqn_batch(s))
    restored = DQNLearner(4, 2, cfg, seed=1)  # other initial weights: restore must replace them all
    restored.restore(through_disk(original.state(), tmp_path))
    assert restored.updates == 4
    assert_same_state(original, restored)
    for s in range(4, 9):  # past the next target sync (update 6)
        assert torch.equal(original.update(dqn_batch(s)), restored.update(dqn_batch(s)))
        assert_same_state(original, restored)
    assert not torch.equal(
        original.online.state_dict()["0.weight"], DQNLearner(4, 2, cfg, seed=0).online.state_dict()["0.weight"]
    )


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_ppo_restored_learner_makes_bit_identical_updates(h, tmp_path, device):
    """On CUDA the original replays its captured minibatch step while the restored learner starts
    with eager steps and captures its own graph: the updates must still agree bit for bit."""
    cfg = PPOConfig(name="ppo", hidden_sizes=[16], lr=3e-3, epochs=2, minibatches=4, lr_anneal_steps=10_000)
    original = PPOLearner(4, 2, cfg, seed=0, device=device)
    for s, env_steps in enumerate((1000, 3000)):
        original.set_lr_for(env_steps)
        original.train(h.ppo_train_batch(original, 64, s))
    restored = PPOLearner(4, 2, cfg, seed=1, device=device)  # other weights and another shuffling generator
    restored.restore(through_disk(original.state(), tmp_path))
    lrs = [float(learner.optim.param_groups[0]["lr"]) for learner in (original, restored)]
    assert lrs[0] == lrs[1] == pytest.approx(3e-3 * 0.7)
    assert_same_state(original, restored)
    batch = h.ppo_train_batch(original, 64, 2)
    assert original.train(batch) == restored.train(batch)  # the learning rate in effect, not a fresh one
    assert_same_state(original, restored)
    for learner in (original, restored):
        learner.set_lr_for(6000)
    batch = h.ppo_train_batch(original, 64, 3)
    assert original.train(batch) == restored.train(batch)
    assert_same_state(original, restored)


def test_a_learner_restored_from_a_live_learners_state_shares_no_tensor_with_it(h):
    """``state()`` hands out the learner's own tensors; a restore in the same process (a
    snapshot taken and loaded without a disk in between) must copy them, or the two optimisers
    update one set of moments."""
    cfg = PPOConfig(name="ppo", hidden_sizes=[16], epochs=2, minibatches=4)
    original = PPOLearner(4, 2, cfg, seed=0)
    original.train(h.ppo_train_batch(original, 64, 0))
    restored = PPOLearner(4, 2, cfg, seed=1)
    restored.restore(original.state())
    batch = h.ppo_train_batch(original, 64, 1)
    assert original.train(batch) == restored.train(batch)
    assert_same_state(original, restored)


def test_a_checkpoint_of_another_algorithm_is_refused_by_name(tmp_path):
    dqn = DQNLearner(4, 2, DQNConfig(name="dqn", hidden_sizes=[16]), seed=0)
    ppo = PPOLearner(4, 2, PPOConfig(name="ppo", hidden_sizes=[16]), seed=0)
    with pytest.raises(CheckpointError, match=r"this PPO checkpoint has no 'net' component \(it has \['online'"):
        ppo.restore(through_disk(dqn.state(), tmp_path))
