"""The learner cores driven by their executor train as the algorithms' plain loops do.

Each reference below is the algorithm written out as a CleanRL-style loop (the loss, backward,
clipping, Adam's step, the target sync) over a copy of the learner's initial networks: the
learner's eager launches must give the same parameters bit for bit, its compiled ones (through
torch.compile's "aot_eager" backend: the same graphs, without code generation) the same up to
rounding. The CUDA-graphed launches are held to the eager ones in test_dqn.py and test_ppo.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn

from tianji_dask.algos.dqn.core import DQNLearner, double_dqn_loss
from tianji_dask.algos.ppo.core import PPOLearner, ppo_loss
from tianji_dask.config.schema import DQNConfig, PPOConfig

UPDATES = 7


def _dqn_batches(n_batches: int, rows: int = 32) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    return [
        {
            "obs": rng.normal(size=(rows, 4)).astype(np.float32),
            "next_obs": rng.normal(size=(rows, 4)).astype(np.float32),
            "actions": rng.integers(0, 2, rows).astype(np.int64),
            "rewards": rng.normal(size=rows).astype(np.float32),
            "discounts": np.where(rng.random(rows) < 0.2, 0.0, 0.9).astype(np.float32),
        }
        for _ in range(n_batches)
    ]


def _dqn_reference(learner: DQNLearner, batches: list[dict[str, np.ndarray]]) -> tuple[nn.Module, nn.Module]:
    """Double DQN as a plain loop, from ``learner``'s initial networks."""
    algo = learner.algo
    online, target = copy.deepcopy(learner.online), copy.deepcopy(learner.target)
    optim = torch.optim.Adam(online.parameters(), lr=algo.lr, fused=True)
    for step, b in enumerate(batches, start=1):
        t = {k: torch.as_tensor(v) for k, v in b.items()}
        with torch.no_grad():
            q_next_online, q_next_target = online(t["next_obs"]), target(t["next_obs"])
        loss, _, _ = double_dqn_loss(
            online(t["obs"]), q_next_online, q_next_target, t["actions"], t["rewards"], t["discounts"]
        )
        optim.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(online.parameters(), algo.max_grad_norm)
        optim.step()
        if step % algo.target_update_interval == 0:
            target.load_state_dict(online.state_dict())
    return online, target


def _assert_same(got: nn.Module, want: nn.Module, exact: bool) -> None:
    for (name, p), q in zip(got.state_dict().items(), want.state_dict().values(), strict=True):
        if exact:
            assert torch.equal(p, q), name
        else:
            torch.testing.assert_close(p, q, msg=name)


def test_the_eager_dqn_learner_trains_as_the_plain_loop(one_torch_thread):
    cfg = DQNConfig(name="dqn", hidden_sizes=[16], lr=1e-2, batch_size=32, learning_starts=32, target_update_interval=3)
    learner = DQNLearner(4, 2, cfg, seed=0)
    batches = _dqn_batches(UPDATES)
    online, target = _dqn_reference(learner, batches)
    for b in batches:
        learner.update(b)
    _assert_same(learner.online, online, exact=True)
    _assert_same(learner.target, target, exact=True)


def test_the_eager_dqn_learner_draws_launches_of_updates_that_train_as_the_plain_loop(one_torch_thread):
    """``update_sampled``: launches of ``updates_per_graph`` updates on one draw, the target's
    values of a whole draw in one forward, launches ending at each target sync."""
    cfg = DQNConfig(
        name="dqn",
        hidden_sizes=[16],
        lr=1e-2,
        batch_size=32,
        learning_starts=32,
        target_update_interval=5,
        updates_per_graph=3,
    )
    learner = DQNLearner(4, 2, cfg, seed=0)
    draws = iter(_dqn_batches(5, rows=3 * 32))  # a launch draws updates_per_graph batches at once
    used: list[dict[str, np.ndarray]] = []

    def sample(rows: int) -> dict[str, torch.Tensor]:
        draw = next(draws)
        assert rows == len(draw["obs"])
        return {k: torch.as_tensor(v) for k, v in draw.items()}

    # as the learner role calls it: launches of 3, 2 (a sync at 5), 3, 2 (a sync at 10), 1, each
    # on the first n of the 3 batches it draws
    launches = (3, 2, 3, 2, 1)
    for n in launches:
        learner.update_sampled(sample, n)
    for n, draw in zip(launches, _dqn_batches(5, rows=3 * 32), strict=True):
        used += [{k: v[i * 32 : (i + 1) * 32] for k, v in draw.items()} for i in range(n)]
    online, target = _dqn_reference(learner_at_start(cfg), used)
    assert learner.updates == 11
    _assert_same(learner.online, online, exact=False)  # the target's forward over 96 rows, not 32
    _assert_same(learner.target, target, exact=False)


def learner_at_start(cfg: DQNConfig) -> DQNLearner:
    return DQNLearner(4, 2, cfg, seed=0)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_compiled_dqn_learner_trains_as_the_plain_loop(one_torch_thread, monkeypatch):
    import tianji_dask.algos.executor as executor

    monkeypatch.setattr(executor, "COMPILE_BACKEND", "aot_eager")
    cfg = DQNConfig(
        name="dqn",
        hidden_sizes=[16],
        lr=1e-2,
        batch_size=32,
        learning_starts=32,
        target_update_interval=3,
        compile=True,
    )
    learner = DQNLearner(4, 2, cfg, seed=0)
    batches = _dqn_batches(UPDATES)
    online, target = _dqn_reference(learner, batches)
    for b in batches:
        learner.update(b)
    _assert_same(learner.online, online, exact=False)
    _assert_same(learner.target, target, exact=False)


def _ppo_batch(learner: PPOLearner, n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    actions = rng.integers(0, 2, n).astype(np.int64)
    with torch.no_grad():
        logp, _, _ = learner.net.evaluate(torch.from_numpy(obs), torch.from_numpy(actions))
    return {
        "obs": obs,
        "actions": actions,
        "logp": logp.numpy() - 0.05 * rng.random(n).astype(np.float32),  # an older policy acted
        "advantages": rng.normal(size=n).astype(np.float32),
        "returns": rng.normal(size=n).astype(np.float32),
    }


def _ppo_reference(learner: PPOLearner, batches: list[dict[str, np.ndarray]], seed: int) -> nn.Module:
    """PPO's minibatch epochs as a plain loop (decoupled: the proximal log-probs first), from
    ``learner``'s initial network, the permutations drawn as the learner draws them."""
    algo = learner.algo
    net = copy.deepcopy(learner.net)
    optim = torch.optim.Adam(net.parameters(), lr=algo.lr, eps=1e-5, fused=True)
    rng = np.random.default_rng(seed)
    for b in batches:
        t = {k: torch.as_tensor(v) for k, v in b.items()}
        n = len(t["actions"])
        perms = [torch.as_tensor(rng.permutation(n)) for _ in range(algo.epochs)]
        with torch.no_grad():
            prox = net.evaluate(t["obs"], t["actions"])[0]
        for perm in perms:
            for idx in torch.tensor_split(perm, algo.minibatches):
                loss, _ = ppo_loss(
                    net,
                    t["obs"][idx],
                    t["actions"][idx],
                    t["logp"][idx],
                    t["advantages"][idx],
                    t["returns"][idx],
                    algo.clip_coef,
                    algo.vf_coef,
                    algo.ent_coef,
                    algo.normalize_advantages,
                    prox_logp=prox[idx],
                    weight_max=algo.behaviour_weight_max,
                )
                optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(net.parameters(), algo.max_grad_norm)
                optim.step()
    return net


@pytest.mark.parametrize("hooked", [False, True], ids=["iteration", "minibatch-loop"])
def test_the_ppo_learner_trains_as_the_plain_loop(one_torch_thread, hooked):
    """Without a grad hook the learner runs its iteration (what CUDA captures as one graph), with
    one the minibatch loop: both as the plain loop, bit for bit."""
    cfg = PPOConfig(
        name="ppo",
        hidden_sizes=[16],
        lr=3e-3,
        epochs=2,
        minibatches=3,
        ent_coef=0.01,
        normalize_advantages=True,
        staleness_correction="decoupled",
    )
    learner = PPOLearner(4, 2, cfg, seed=4)
    batches = [_ppo_batch(learner, n, seed=s) for s, n in enumerate((48, 50, 47))]
    want = _ppo_reference(learner, batches, seed=4)
    hook = (lambda: None) if hooked else None
    for b in batches:
        learner.train(b, grad_hook=hook)
    assert learner.updates == 3 * 2 * 3
    _assert_same(learner.net, want, exact=True)
