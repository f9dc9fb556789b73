"""Unit tests of the double-DQN pieces (tianji_dask/algos/dqn.py). No cluster."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import CONFIG

from tianji_dask.algos.dqn.core import DQNLearner, DQNPolicy, ape_x_epsilons, double_dqn_loss, epsilon_at
from tianji_dask.config import load_config
from tianji_dask.config.schema import DQNConfig


def dqn_config(**kw) -> DQNConfig:
    base = dict(
        name="dqn",
        hidden_sizes=[16],
        lr=1e-2,
        gamma=0.9,
        batch_size=32,
        learning_starts=32,
        target_update_interval=1000,
    )
    return DQNConfig(**{**base, **kw})


def fixed_batch(n=32, obs_dim=4, n_actions=2, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
        "next_obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
        "actions": rng.integers(0, n_actions, n).astype(np.int64),
        "rewards": rng.normal(size=n).astype(np.float32),
        "discounts": np.where(rng.random(n) < 0.2, 0.0, 0.9).astype(np.float32),
    }


def params_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ------------------------------------------------------------------ loss
def test_double_dqn_loss_hand_computed():
    gamma = 0.5
    q = torch.tensor([[1.0, 2.0, 0.0], [0.5, -1.0, 2.0], [0.0, 0.0, -2.0]], requires_grad=True)
    actions = torch.tensor([1, 0, 2])
    rewards = torch.tensor([1.0, 3.0, 0.0])
    dones = torch.tensor([0.0, 1.0, 0.0])
    discounts = gamma * (1.0 - dones)  # one-step transitions: gamma, 0 where terminal
    # Row 0: the online net picks a'=2, the target net's own argmax would be 0 (value 5).
    # Row 1: terminal, so the (large) next values must not matter.
    # Row 2: the online net picks a'=0, where the target net says -1 (its argmax is 1: 6).
    q_next_online = torch.tensor([[0.0, 1.0, 3.0], [1.0, 0.0, 0.0], [2.0, 1.0, 0.0]])
    q_next_target = torch.tensor([[5.0, 4.0, 1.0], [10.0, 10.0, 10.0], [-1.0, 6.0, 0.0]])
    # targets: 1 + 0.5 * Q_target[0, 2] = 1 + 0.5 * 1 = 1.5
    #          3 (terminal)
    #          0 + 0.5 * Q_target[2, 0] = 0.5 * -1 = -0.5
    # q_taken: 2.0, 0.5, -2.0 -> errors 0.5, -2.5, -1.5
    # Huber (beta 1): 0.5 * 0.5**2 = 0.125; 2.5 - 0.5 = 2.0; 1.5 - 0.5 = 1.0
    expected = (0.125 + 2.0 + 1.0) / 3  # 1.0416666...
    loss, q_taken, _ = double_dqn_loss(q, q_next_online, q_next_target, actions, rewards, discounts)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert q_taken.tolist() == [2.0, 0.5, -2.0]
    # Plain DQN (max over the target net) would give targets 3.5, 3, 2.5 -> errors -1.5, -2.5, -4.5
    assert loss.item() != pytest.approx((1.0 + 2.0 + 4.0) / 3, abs=1e-3)

    # Gradient flows only into the taken Q values: d/dq of mean Huber = clip(error, -1, 1) / 3
    loss.backward()
    grad = torch.zeros(3, 3)
    grad[0, 1], grad[1, 0], grad[2, 2] = 0.5 / 3, -1.0 / 3, -1.0 / 3
    torch.testing.assert_close(q.grad, grad)


def test_double_dqn_loss_n_step_discount():
    # An n-step transition carries its return and gamma**n: 3 steps of reward 1 at gamma 0.5
    # give R = 1 + 0.5 + 0.25 = 1.75 and discount 0.125; the online argmax picks a'=1 (target 8).
    q = torch.tensor([[2.0, 0.0]])
    loss, _, _ = double_dqn_loss(
        q,
        torch.tensor([[0.0, 1.0]]),
        torch.tensor([[100.0, 8.0]]),
        torch.tensor([0]),
        torch.tensor([1.75]),
        torch.tensor([0.125]),
    )
    # target 1.75 + 0.125 * 8 = 2.75, error -0.75 -> 0.5 * 0.75**2 = 0.28125
    assert loss.item() == pytest.approx(0.28125, abs=1e-7)


def test_double_dqn_loss_does_not_backprop_into_the_targets():
    q = torch.zeros(2, 2, requires_grad=True)
    nxt = torch.ones(2, 2, requires_grad=True)
    loss, _, _ = double_dqn_loss(q, nxt, nxt * 2, torch.tensor([0, 1]), torch.zeros(2), torch.full((2,), 0.9))
    loss.backward()
    assert nxt.grad is None
    assert q.grad is not None and q.grad.abs().sum() > 0


# ------------------------------------------------------------------ epsilon
def test_epsilon_schedule():
    assert epsilon_at(0, 1.0, 0.1, 100) == pytest.approx(1.0)
    assert epsilon_at(25, 1.0, 0.1, 100) == pytest.approx(0.775)
    assert epsilon_at(50, 1.0, 0.1, 100) == pytest.approx(0.55)
    assert epsilon_at(100, 1.0, 0.1, 100) == pytest.approx(0.1)
    assert epsilon_at(10_000, 1.0, 0.1, 100) == pytest.approx(0.1)  # stays at final
    values = [epsilon_at(s, 1.0, 0.04, 8000) for s in range(0, 10_000, 100)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # never increases
    assert epsilon_at(7, 0.3, 0.3, 10) == pytest.approx(0.3)


def test_ape_x_epsilons_per_env():
    """eps_k = 0.4 ** (1 + 7 k / (N - 1)) over the run's N envs (Ape-X, Horgan et al. 2018)."""
    want = [0.4, 0.4 ** (1 + 7 / 3), 0.4 ** (1 + 14 / 3), 0.4**8]
    np.testing.assert_allclose(ape_x_epsilons(0, 4, 4, 0.4, 7.0), want, rtol=1e-12)
    np.testing.assert_allclose(ape_x_epsilons(2, 2, 4, 0.4, 7.0), want[2:], rtol=1e-12)  # the second actor's envs
    np.testing.assert_allclose(ape_x_epsilons(0, 1, 1, 0.4, 7.0), [0.4])  # one env: the base
    assert ape_x_epsilons(0, 4, 4, 0.4, 7.0)[-1] == pytest.approx(0.00065536)


def test_per_env_exploration_gives_each_actor_its_share_of_the_runs_epsilons():
    from tianji_dask.algos.dqn.actor import DQNActorRole
    from tianji_dask.channels.local import LocalQueue
    from tianji_dask.config import load_config

    sets = ["algo.exploration=per_env", "env.num_envs=3", "topology.actors=2", "topology.groups=2"]
    cfg = load_config("configs/cartpole_dqn.yaml", sets)
    actor = DQNActorRole(cfg, 3, 0, LocalQueue(capacity_bytes=1 << 20), params=None, balance=False)
    actor.probe_params = lambda: False
    total = 2 * 2 * 3  # groups x actors x envs
    want = ape_x_epsilons(9, 3, total, 0.4, 7.0)  # actor 3 (group 1, second actor) holds envs 9-11
    np.testing.assert_allclose(actor._env_eps, want)
    actor.step()
    assert actor.counters.epsilon == pytest.approx(float(np.mean(want)))
    linear = DQNActorRole(load_config("configs/cartpole_dqn.yaml"), 0, 0, LocalQueue(capacity_bytes=1 << 20), None)
    assert linear._env_eps is None


def test_policy_takes_one_epsilon_per_row():
    policy = DQNPolicy(4, 3, [8], seed=0)
    obs = np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32)
    greedy = policy.act(obs, 0.0)
    eps = np.where(np.arange(200) < 100, 0.0, 1.0)
    acted = policy.act(obs, eps)
    np.testing.assert_array_equal(acted[:100], greedy[:100])  # epsilon 0: always greedy
    assert (acted[100:] != greedy[100:]).sum() > 40  # epsilon 1: random, 2 in 3 differ from greedy


# ------------------------------------------------------------------ policy
def test_policy_greedy_at_eps0_is_argmax():
    torch.manual_seed(0)  # an actor's net is initialised by torch and then loaded; fix the init here
    policy = DQNPolicy(obs_dim=4, n_actions=3, hidden=[8], seed=0)
    obs = np.random.default_rng(1).normal(size=(500, 4)).astype(np.float32)
    with torch.no_grad():
        expected = policy.net(torch.from_numpy(obs)).argmax(dim=1).numpy()
    actions = policy.act(obs, 0.0)
    assert actions.dtype == np.int64 and actions.shape == (500,)
    np.testing.assert_array_equal(actions, expected)
    assert len(set(expected.tolist())) > 1  # the check means something: not a constant net


def test_policy_uniform_at_eps1():
    n_actions, n = 3, 6000
    policy = DQNPolicy(obs_dim=4, n_actions=n_actions, hidden=[8], seed=0)
    # one repeated observation: greedy would always pick the same action
    obs = np.tile(np.array([[0.1, -0.2, 0.3, 0.4]], dtype=np.float32), (n, 1))
    counts = np.bincount(policy.act(obs, 1.0), minlength=n_actions)
    assert counts.sum() == n
    # 2000 expected each, sigma ~37: a 5-sigma band
    assert np.all(np.abs(counts - n / n_actions) < 5 * np.sqrt(n * (1 / 3) * (2 / 3))), counts
    # eps=0.5: about half greedy plus a third of the random half on the greedy action
    greedy = policy.act(obs[:1], 0.0)[0]
    frac = np.mean(policy.act(obs, 0.5) == greedy)
    assert frac == pytest.approx(0.5 + 0.5 / 3, abs=0.04)


def test_policy_load_swaps_parameters_and_version():
    learner = DQNLearner(4, 2, dqn_config(), seed=3)
    policy = DQNPolicy(4, 2, [16], seed=9)
    policy.load(7, learner.policy_params())
    assert policy.version == 7
    assert params_equal(policy.net, learner.online)


# ------------------------------------------------------------------ learner
def fixed_batch_loss(learner: DQNLearner, b: dict[str, np.ndarray]) -> float:
    t = {k: torch.as_tensor(v) for k, v in b.items()}
    with torch.no_grad():
        loss, _, _ = double_dqn_loss(
            learner.online(t["obs"]),
            learner.online(t["next_obs"]),
            learner.target(t["next_obs"]),
            t["actions"],
            t["rewards"],
            t["discounts"],
        )
    return loss.item()


def test_learner_update_reduces_loss_on_a_fixed_batch():
    learner = DQNLearner(4, 2, dqn_config(lr=1e-2, hidden_sizes=[64]), seed=0)
    b = fixed_batch()
    before = fixed_batch_loss(learner, b)
    first, _ = learner.update(b).tolist()
    assert first == pytest.approx(before, rel=1e-5)  # update() reports the loss before its step
    for _ in range(99):
        loss, q_mean = learner.update(b).tolist()
        assert np.isfinite(loss) and np.isfinite(q_mean)
    after = fixed_batch_loss(learner, b)
    assert learner.updates == 100
    # 32 transitions fit by a 64-unit net (the target net stays fixed: interval 1000)
    assert after < 0.1 * before, (before, after)


def test_learner_is_seeded():
    a = DQNLearner(4, 2, dqn_config(), seed=5).policy_params()
    b = DQNLearner(4, 2, dqn_config(), seed=5).policy_params()
    c = DQNLearner(4, 2, dqn_config(), seed=6).policy_params()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not all(np.array_equal(a[k], c[k]) for k in a)


def test_actor_params_are_fresh_copies():
    learner = DQNLearner(4, 2, dqn_config(), seed=0)
    before = {k: v.clone() for k, v in learner.online.state_dict().items()}
    p1, p2 = learner.policy_params(), learner.policy_params()
    assert set(p1) == set(before)
    for k, arr in p1.items():
        assert isinstance(arr, np.ndarray) and arr.dtype == np.float32
        assert arr.shape == tuple(before[k].shape)
        assert not np.shares_memory(arr, p2[k])
        arr[...] = 123.0  # a channel or actor mutating what it got...
    for k, t in learner.online.state_dict().items():  # ...does not reach the learner
        assert torch.equal(t, before[k]), k
    # and an update afterwards does not reach arrays handed out earlier
    learner.update(fixed_batch())
    for k, arr in p2.items():
        np.testing.assert_array_equal(arr, before[k].numpy())


def test_target_syncs_every_target_update_interval():
    learner = DQNLearner(4, 2, dqn_config(target_update_interval=3, lr=1e-2), seed=0)
    b = fixed_batch()
    assert params_equal(learner.online, learner.target)  # starts in sync
    synced = []
    target_before = {k: v.clone() for k, v in learner.target.state_dict().items()}
    for _ in range(7):
        learner.update(b)
        synced.append(params_equal(learner.online, learner.target))
        if not synced[-1]:  # between syncs the target net does not move at all
            now = learner.target.state_dict()
            assert all(torch.equal(now[k], target_before[k]) for k in now)
        target_before = {k: v.clone() for k, v in learner.target.state_dict().items()}
    assert synced == [False, False, True, False, False, True, False]


def test_batch_mover_on_cpu_keeps_values_and_dtypes():
    from tianji_dask.algos.executor import BatchMover

    batch = {
        "obs": np.arange(12, dtype=np.uint8).reshape(3, 4),
        "actions": np.array([0, 2, 1], np.int64),
        "rewards": np.array([0.5, -1.0, 0.0], np.float32),
    }
    out = BatchMover(torch.device("cpu"))(batch)
    for k, v in batch.items():
        assert out[k].dtype == torch.from_numpy(v).dtype
        np.testing.assert_array_equal(out[k].numpy(), v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batch_mover_on_cuda_reuses_pinned_buffers():
    from tianji_dask.algos.executor import BatchMover

    mover = BatchMover(torch.device("cuda"))
    a = {"obs": np.ones((4, 2), np.float32)}
    first = mover(a)["obs"]
    buf = mover._pinned["obs"]
    # no wait for the device in between: the mover waits for the first copy before it reuses
    second = mover({"obs": np.full((4, 2), 3, np.float32)})["obs"]
    assert mover._pinned["obs"] is buf and buf.is_pinned()
    assert first.device.type == "cuda" and float(first.sum()) == 8
    assert float(second.sum()) == 24


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batch_mover_on_cuda_reuses_pinned_buffers_for_fields_of_varying_length():
    from tianji_dask.algos.executor import BatchMover

    mover = BatchMover(torch.device("cuda"))
    frames = mover({"frames": np.arange(40, dtype=np.uint8).reshape(10, 2, 2)})["frames"]
    buf = mover._pinned["frames"]
    np.testing.assert_array_equal(frames.cpu().numpy(), np.arange(40, dtype=np.uint8).reshape(10, 2, 2))
    shorter = mover({"frames": np.full((9, 2, 2), 7, np.uint8)})["frames"]
    assert mover._pinned["frames"] is buf and shorter.shape == (9, 2, 2) and int(shorter.sum()) == 7 * 36
    longer = mover({"frames": np.ones((20, 2, 2), np.uint8)})["frames"]
    assert mover._pinned["frames"] is not buf and longer.shape == (20, 2, 2) and int(longer.sum()) == 80


def test_a_dueling_head_adds_the_value_to_the_centred_advantages():
    from tianji_dask.algos.networks import DuelingHead

    head = DuelingHead(2, 3)
    with torch.no_grad():
        head.value.weight.copy_(torch.tensor([[1.0, 0.0]]))
        head.value.bias.zero_()
        head.advantage.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
        head.advantage.bias.zero_()
    # features (2, 4): V = 2, A = (2, 4, 0) with mean 2, so Q = 2 + (0, 2, -2)
    q = head(torch.tensor([[2.0, 4.0]]))
    torch.testing.assert_close(q, torch.tensor([[2.0, 4.0, 0.0]]))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("network", ["mlp", "nature_cnn"])
def test_a_dueling_learner_trains_and_its_actors_load_its_parameters(network):
    cfg = load_config(CONFIG, ["algo.dueling=true"]).algo
    obs_dim, shape, dtype = (4, (4,), np.float32) if network == "mlp" else (4 * 84 * 84, (4, 84, 84), np.uint8)
    learner = DQNLearner(obs_dim, 3, cfg, seed=0, network=network)
    assert any("advantage" in k for k in learner.policy_params())
    rng = np.random.default_rng(0)
    batch = {
        "obs": rng.integers(0, 255, (8, *shape)).astype(dtype),
        "next_obs": rng.integers(0, 255, (8, *shape)).astype(dtype),
        "actions": rng.integers(0, 3, 8),
        "rewards": rng.normal(size=8).astype(np.float32),
        "discounts": np.full(8, 0.9, np.float32),
    }
    loss, _ = learner.update(batch).tolist()
    assert np.isfinite(loss)
    policy = DQNPolicy(obs_dim, 3, cfg.hidden_sizes, seed=0, network=network, dueling=True)
    policy.load(1, learner.policy_params())
    assert policy.act(batch["obs"], 0.0).shape == (8,)


def _atari_batch_on(device: str, n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randint(0, 256, (n, 4, 84, 84), generator=g, dtype=torch.uint8).to(device),
        "next_obs": torch.randint(0, 256, (n, 4, 84, 84), generator=g, dtype=torch.uint8).to(device),
        "actions": torch.randint(0, 6, (n,), generator=g).to(device),
        "rewards": torch.randn(n, generator=g).to(device),
        "discounts": (torch.rand(n, generator=g) > 0.1).float().mul(0.99).to(device),
    }


def _cuda_learner_pair(
    monkeypatch, target_update_interval: int, graphs: tuple[bool, bool] = (True, True)
) -> tuple[DQNLearner, DQNLearner]:
    """Two Nature-CNN learners of one seed on CUDA (``graphs``: each one's), under deterministic
    cuDNN (its default convolution backward is not deterministic); cuDNN's benchmark switch,
    which a CUDA learner turns on for its process, is restored after the test."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)
    cfg = dqn_config(lr=1e-4, target_update_interval=target_update_interval)
    first, second = (DQNLearner(0, 6, cfg, seed=0, device="cuda", network="nature_cnn", graphs=g) for g in graphs)
    return first, second


def _same_state(a: DQNLearner, b: DQNLearner) -> None:
    state_a, state_b = a.state(), b.state()
    for comp in ("online", "target", "optim_state"):
        for name, value in state_a[comp].items():
            assert torch.equal(value, state_b[comp][name]), (comp, name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_dqn_learner_on_cuda_replays_draw_and_update_as_a_graph_that_trains_as_the_eager_step(monkeypatch):
    """``update_sampled`` on CUDA runs two eager warm-up steps, then captures the draw and the
    update as one CUDA graph and replays it; the draw here reads tensors refilled in place before
    each update. Same seeds, same batches, target syncs in between: the same statistics,
    parameters and optimiser state as eager updates, bit for bit (deterministic cuDNN: its
    default convolution backward is not deterministic)."""
    graphed, eager = _cuda_learner_pair(monkeypatch, target_update_interval=2)
    source = _atari_batch_on("cuda", 32, seed=0)
    for s in range(6):  # warm-up, warm-up, capture, replays
        batch = _atari_batch_on("cuda", 32, seed=s)
        for k, v in batch.items():
            source[k].copy_(v)
        got = graphed.update_sampled(lambda rows: dict(source)).clone()
        want = eager.update(batch)
        assert torch.equal(got, want), s
    assert graphed.run.graphs and len(graphed.run.captured[1]._graphs) == 1
    _same_state(graphed, eager)
    assert graphed.updates == eager.updates == 6


def _drawing_sampler(pool: dict[str, torch.Tensor]):
    """A device sampler as a replay's: ``rows`` rows of ``pool`` drawn with device operations
    and the device's generator only, reading the same tensors on every call."""
    size = pool["actions"].shape[0]

    def sample(rows: int) -> dict[str, torch.Tensor]:
        idx = torch.randint(0, size, (rows,), device=pool["actions"].device)
        return {k: v[idx] for k, v in pool.items()}

    return sample


def test_a_cpu_learner_makes_count_sampled_updates_in_launches_of_one_draw_each(one_torch_thread):
    """``update_sampled(sample, count)`` on the CPU: launches that end where a target sync is due
    (3 updates with a sync every 2: a launch of 2, then 1), each on one draw of its batches, make
    the updates ``update`` makes on those draws' batches one at a time, target syncs included;
    the statistics are their sum. (The launch computes the target's values of a whole draw in
    one forward: equal up to float rounding.)"""
    cfg = dqn_config(lr=1e-3, target_update_interval=2)
    pool = {k: torch.as_tensor(v) for k, v in fixed_batch(n=64).items()}
    counted, single = DQNLearner(4, 2, cfg, seed=0), DQNLearner(4, 2, cfg, seed=0)
    torch.manual_seed(5)
    got = counted.update_sampled(_drawing_sampler(pool), count=3)
    torch.manual_seed(5)
    sample = _drawing_sampler(pool)
    first, second = sample(2 * 32), sample(32)
    batches = [{k: v[i * 32 : (i + 1) * 32] for k, v in first.items()} for i in range(2)] + [second]
    want = sum(single.update(batch) for batch in batches)
    torch.testing.assert_close(got, want)
    assert counted.updates == single.updates == 3
    for a, b in ((counted.online, single.online), (counted.target, single.target)):
        for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
            torch.testing.assert_close(x, y, msg=name)


@pytest.mark.parametrize("updates_per_graph, draw", [(1, 96), (4, 128)])
def test_a_launch_draws_its_batches_at_once_and_the_targets_values_in_one_forward(
    one_torch_thread, updates_per_graph, draw
):
    """A launch of 3 updates at batch 32 calls the sampler once, for 96 rows (128 where
    ``algo.updates_per_graph`` is 4: a short launch draws a full one's rows, so the target's
    forward keeps its shape), and runs the target network once, over all of them; the online
    network runs once an update over the batch's observations and once over its next
    observations (32 rows each)."""
    cfg = dqn_config(target_update_interval=100, updates_per_graph=updates_per_graph)
    learner = DQNLearner(4, 2, cfg, seed=0)
    pool = {k: torch.as_tensor(v) for k, v in fixed_batch(n=64).items()}
    draws: list[int] = []
    drawing = _drawing_sampler(pool)

    def sample(rows: int) -> dict[str, torch.Tensor]:
        draws.append(rows)
        return drawing(rows)

    rows_seen: dict[str, list[int]] = {"online": [], "target": []}
    for name in rows_seen:
        getattr(learner, name).register_forward_hook(
            lambda _m, args, _out, name=name: rows_seen[name].append(len(args[0]))
        )
    learner.update_sampled(sample, count=3)
    assert draws == [draw]
    assert rows_seen == {"online": [32] * 6, "target": [draw]}
    assert learner.updates == 3


def _four_a_launch_and_four_eager(
    graphed: DQNLearner, eager: DQNLearner, calls: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The statistics of ``calls`` calls of ``update_sampled(sample, 4)`` on a pool of Atari
    batches, by a learner that replays its launches as CUDA graphs and by one that runs them
    eagerly (``graphs=False``), from the same CUDA generator state."""
    pool = _atari_batch_on("cuda", 256, seed=0)
    got, want = [], []
    for learner, out in ((graphed, got), (eager, want)):
        torch.cuda.manual_seed(7)
        out += [learner.update_sampled(_drawing_sampler(pool), count=4).clone() for _ in range(calls)]
    return got, want


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_dqn_learner_on_cuda_makes_k_updates_in_one_launch_as_k_eager_updates(monkeypatch):
    """``update_sampled(sample, 4)`` on CUDA replays four draws and updates as one CUDA graph a
    launch; with a target sync every 6 updates the launches are 4, 2, 4, 2, ... (a launch ends
    where a sync is due). Against the same launches run eagerly on the same draws (the same CUDA
    generator state: a capture does not advance it, a replay advances it as the eager draws do),
    with deterministic cuDNN: the same statistics, parameters, target and Adam state, bit for bit."""
    graphed, eager = _cuda_learner_pair(monkeypatch, target_update_interval=6, graphs=(True, False))
    got, want = _four_a_launch_and_four_eager(graphed, eager, calls=9)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"call {i}"
    assert graphed.run.graphs and sorted(graphed.run.captured) == [2, 4]
    assert all(len(g._graphs) == 1 for g in graphed.run.captured.values())  # captured, then replayed
    assert not eager.run.graphs and not eager.run.captured
    assert graphed.updates == eager.updates == 36
    _same_state(graphed, eager)


@pytest.mark.timeout(60)
def test_bf16_dqn_learner_trains_close_to_float32(one_torch_thread):
    """The Nature CNN trunk in bfloat16 (``algo.precision=bf16``) against float32, from the same
    start, over 8 updates on the same batches: the losses within 2 % (mean Q, near 0, within
    0.001), every parameter's change pointing the same way (cosine above 0.9; Adam's first steps
    are about lr x sign(gradient), so elements with small gradients flip with bfloat16's
    rounding). Actors' networks stay fp32."""
    ref = DQNLearner(0, 6, dqn_config(lr=1e-4), seed=3, network="nature_cnn")
    bf16 = DQNLearner(0, 6, dqn_config(lr=1e-4, precision="bf16"), seed=3, network="nature_cnn")
    assert bf16.online.precision == bf16.target.precision == "bf16"
    start = {k: v.clone() for k, v in ref.online.state_dict().items()}
    for s in range(8):
        batch = _atari_batch_on("cpu", 32, seed=s)
        got, want = bf16.update(batch).tolist(), ref.update(batch).tolist()
        assert got == pytest.approx(want, rel=2e-2, abs=1e-3), s  # mean Q is near 0
    cosines = {}
    for name, p in ref.online.state_dict().items():
        moved_ref, moved_bf16 = p - start[name], bf16.online.state_dict()[name] - start[name]
        cosines[name] = float(torch.nn.functional.cosine_similarity(moved_ref.flatten(), moved_bf16.flatten(), dim=0))
    assert min(cosines.values()) > 0.9, cosines  # the first conv's bias the lowest (0.94)
    policy = DQNPolicy(0, 6, [], seed=0, network="nature_cnn")
    policy.load(1, bf16.policy_params())
    assert policy.net.precision == "fp32"


def test_a_dqn_precision_other_than_fp32_needs_the_nature_cnn():
    with pytest.raises(ValueError, match="needs the Nature CNN"):
        DQNLearner(4, 2, dqn_config(precision="bf16"), seed=0)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_compiled_learner_trains_as_the_eager_one_and_resumes(one_torch_thread, monkeypatch):
    """``algo.compile``: the loss (forward and backward) and the clipped Adam step through
    torch.compile. Five updates on the same batches, a target sync among them: parameters,
    target and statistics as the eager learner's, up to the fused kernels' rounding; its state
    restored into another compiled learner (a new optimiser, compiled again) goes on as the
    eager one does. Through torch.compile's "aot_eager" backend: the same graphs, forward and
    backward, without inductor's code generation, which takes half a minute of C++ compiling on
    this machine; inductor's kernels are checked on CUDA
    (:func:`test_a_compiled_cuda_learner_replays_k_updates_a_launch_as_the_eager_learner`)."""
    import tianji_dask.algos.executor as executor

    monkeypatch.setattr(executor, "COMPILE_BACKEND", "aot_eager")
    cfg = dqn_config(lr=1e-3, target_update_interval=3)
    frames = torch._dynamo.utils.counters["frames"]
    before = frames["ok"]
    eager, fused = DQNLearner(4, 2, cfg, seed=0), DQNLearner(4, 2, cfg.model_copy(update={"compile": True}), seed=0)
    assert frames["ok"] == before  # nothing compiled as it is built: its first parameters go out first
    fused.prepare()
    assert isinstance(fused.optim, torch.optim.Adam) and fused.optim.defaults["foreach"]
    compiled_at_start = frames["ok"]
    assert compiled_at_start >= before + 2  # the loss and the step, as it prepares, before the first update
    for s in range(5):
        batch = fixed_batch(seed=s)
        torch.testing.assert_close(fused.update(batch), eager.update(batch), msg=f"update {s}")
    assert frames["ok"] == compiled_at_start  # nothing compiled again
    for a, b in ((fused.online, eager.online), (fused.target, eager.target)):
        for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
            torch.testing.assert_close(p, q, msg=name)
    resumed = DQNLearner(4, 2, cfg.model_copy(update={"compile": True}), seed=1)
    resumed.restore(fused.state())
    resumed.prepare()  # compiled with the state it restored, which it keeps
    batch = fixed_batch(seed=9)
    torch.testing.assert_close(resumed.update(batch), eager.update(batch))
    assert resumed.updates == eager.updates == 6
    for (name, p), q in zip(resumed.online.state_dict().items(), eager.online.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_compiled_cuda_learner_replays_k_updates_a_launch_as_the_eager_learner(monkeypatch):
    """``algo.compile`` on CUDA: the compiled loss and Adam step, compiled as the learner is
    built, are captured with the draws in the launch's CUDA graph; 4 updates a launch, a target
    sync every 6, against the uncompiled learner's launches on the same draws. Not bit for bit: the fused kernels
    round differently, and Adam's first steps move each parameter by about lr x the sign of its
    gradient, so an element whose gradient is within rounding of 0 moves the other way. So: the
    losses within 0.2 %, every parameter's change, online and target, pointing the same way as
    the eager learner's (cosine above 0.99)."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)
    cfg = dqn_config(lr=1e-4, target_update_interval=6)
    eager = DQNLearner(0, 6, cfg, seed=0, device="cuda", network="nature_cnn")
    fused = DQNLearner(0, 6, cfg.model_copy(update={"compile": True}), seed=0, device="cuda", network="nature_cnn")
    start = {k: v.clone() for k, v in eager.online.state_dict().items()}
    got, want = _four_a_launch_and_four_eager(fused, eager, calls=6)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g[0].item() == pytest.approx(w[0].item(), rel=2e-3), f"loss of call {i}"
    assert fused.run.graphs and all(len(g._graphs) == 1 for g in fused.run.captured.values())
    assert fused.updates == eager.updates == 24
    for comp in ("online", "target"):  # the target synced at update 24 from each learner's own online net
        mine, theirs = fused.state()[comp], eager.state()[comp]
        for name, p in mine.items():
            moved, moved_eager = (p - start[name]).flatten(), (theirs[name] - start[name]).flatten()
            cosine = torch.nn.functional.cosine_similarity(moved, moved_eager, dim=0).item()
            assert cosine > 0.99, (comp, name, cosine)
