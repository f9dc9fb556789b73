"""Unit tests of the PPO pieces: GAE, the clipped loss, acting, the learner's update, and the
on-policy roles (rollout buffer and actor) on in-process channels. No cluster."""

from __future__ import annotations

import math
import time

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.spaces import Discrete

from tianji_dask.algos.ppo.actor import PPOActorRole
from tianji_dask.algos.ppo.buffer import RolloutBufferRole
from tianji_dask.algos.ppo.core import ActorCritic, PPOLearner, PPOPolicy, gae, ppo_loss, sample_categorical
from tianji_dask.algos.ppo.learner import PPOLearnerRole
from tianji_dask.channels import LocalQueue, LocalTopic
from tianji_dask.config import load_config
from tianji_dask.config.schema import PPOConfig
from tianji_dask.envs import make_vector_env

PPO_CONFIG = "configs/cartpole_ppo.yaml"

# CartPole with a 5-step time limit: from CartPole's start state no episode can terminate
# (pole angle > 12 degrees or cart off the track) within 5 steps, so every episode is truncated.
SHORT_ENV = "TianjiTestCartPole5-v0"
if SHORT_ENV not in gymnasium.registry:
    gymnasium.register(
        SHORT_ENV, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=5
    )


# ------------------------------------------------------------------ GAE
def test_gae_hand_computed_with_episode_end_and_bootstrap():
    gamma, lam = 0.5, 0.5  # gamma * lam = 0.25; every number below is exact in binary
    rewards = np.array([[1.0, 0.0], [2.0, 1.0], [0.0, 3.0]], np.float32)  # (T=3, N=2)
    values = np.array([[0.5, 1.0], [1.0, 0.0], [2.0, 1.0]], np.float32)
    dones = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]], np.float32)  # env 0's episode ends at t=1
    last_values = np.array([6.0, 2.0], np.float32)  # V(obs after the last step)
    # env 0:
    #   t=2: delta = 0 + 0.5*6 (bootstrap from last_values) - 2 = 1;        A = 1
    #   t=1: done, nothing bootstrapped nor carried: delta = 2 - 1 = 1;     A = 1
    #   t=0: delta = 1 + 0.5*V[1]=0.5*1 - 0.5 = 1;                          A = 1 + 0.25*1 = 1.25
    # env 1 (no episode end):
    #   t=2: delta = 3 + 0.5*2 - 1 = 3;                                      A = 3
    #   t=1: delta = 1 + 0.5*1 - 0 = 1.5;                                    A = 1.5 + 0.25*3 = 2.25
    #   t=0: delta = 0 + 0.5*0 - 1 = -1;                                     A = -1 + 0.25*2.25 = -0.4375
    # returns = A + V
    expected_adv = np.array([[1.25, -0.4375], [1.0, 2.25], [1.0, 3.0]], np.float32)
    expected_ret = np.array([[1.75, 0.5625], [2.0, 2.25], [3.0, 4.0]], np.float32)
    adv, ret = gae(rewards, values, dones, last_values, gamma, lam)
    assert adv.shape == ret.shape == (3, 2)
    assert adv.dtype == np.float32
    np.testing.assert_allclose(adv, expected_adv, rtol=0, atol=1e-6)
    np.testing.assert_allclose(ret, expected_ret, rtol=0, atol=1e-6)


def test_gae_lambda_limits():
    """lambda=0: one-step TD errors; lambda=1: discounted return-to-go (bootstrapped) minus V."""
    rng = np.random.default_rng(3)
    T, N, gamma = 6, 3, 0.9
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    dones = np.zeros((T, N), np.float32)
    dones[2, 1] = 1.0
    last = rng.normal(size=N).astype(np.float32)
    nxt = np.concatenate([values[1:], last[None]])
    td = rewards + gamma * nxt * (1 - dones) - values
    adv0, _ = gae(rewards, values, dones, last, gamma, 0.0)
    np.testing.assert_allclose(adv0, td, atol=1e-5)
    g = last.astype(np.float64)
    mc = np.zeros((T, N))
    for t in range(T - 1, -1, -1):
        g = rewards[t] + gamma * g * (1 - dones[t])
        mc[t] = g
    adv1, ret1 = gae(rewards, values, dones, last, gamma, 1.0)
    np.testing.assert_allclose(ret1, mc, atol=1e-5)
    np.testing.assert_allclose(adv1, mc - values, atol=1e-5)


# ------------------------------------------------------------------ loss
def _net_and_batch(n: int, seed: int = 0):
    torch.manual_seed(seed)
    net = ActorCritic(4, 2, [8])
    obs = torch.randn(n, 4)
    actions = torch.randint(0, 2, (n,))
    return net, obs, actions


@pytest.mark.parametrize(
    "ratio, adv, expected_pg, clipped",
    [
        (1.5, 2.0, -1.2 * 2.0, True),  # above 1+clip, A>0: the clipped term -A*(1+clip)
        (0.5, -1.0, 0.8 * 1.0, True),  # below 1-clip, A<0: the clipped term -A*(1-clip)
        (1.5, -1.0, 1.5 * 1.0, False),  # above 1+clip, A<0: pessimistic bound is the unclipped -A*r
        (0.5, 2.0, -0.5 * 2.0, False),  # below 1-clip, A>0: unclipped -A*r
        (1.1, 3.0, -1.1 * 3.0, False),  # inside the band: unclipped
    ],
    ids=["high-pos", "low-neg", "high-neg", "low-pos", "inside"],
)
def test_ppo_loss_clipping(ratio, adv, expected_pg, clipped):
    clip = 0.2
    net, obs, actions = _net_and_batch(4)
    with torch.no_grad():
        logp, _, value = net.evaluate(obs, actions)
    old_logp = logp - math.log(ratio)  # so that exp(logp - old_logp) == ratio
    advs = torch.full((4,), adv)
    loss, st = ppo_loss(
        net, obs, actions, old_logp, advs, value.clone(), clip, vf_coef=0.0, ent_coef=0.0, normalize=False
    )
    st = {k: float(v) for k, v in st.items()}  # 0-d tensors on the loss's device
    assert st["pg_loss"] == pytest.approx(expected_pg, abs=1e-5)
    assert loss.item() == pytest.approx(expected_pg, abs=1e-5)
    assert st["clipfrac"] == (1.0 if abs(ratio - 1) > clip else 0.0)
    assert st["approx_kl"] == pytest.approx((ratio - 1) - math.log(ratio), abs=1e-5)
    net.zero_grad()
    loss.backward()
    grad = sum(p.grad.abs().sum().item() for p in net.actor.parameters() if p.grad is not None)
    if clipped:
        assert grad == 0.0  # the clipped term is constant in the policy parameters
    else:
        assert grad > 0.0


def test_ppo_loss_mixed_batch_and_value_entropy_terms():
    clip, vf_coef, ent_coef = 0.2, 0.5, 0.01
    net, obs, actions = _net_and_batch(5, seed=1)
    ratios = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.1])
    adv = torch.tensor([2.0, -1.0, -1.0, 2.0, 3.0])
    returns = torch.tensor([1.0, -2.0, 0.5, 3.0, 0.0])
    with torch.no_grad():
        logp, _, _ = net.evaluate(obs, actions)
        probs = torch.softmax(net.actor(obs), -1)
        entropy = -(probs * probs.log()).sum(-1).mean().item()
        v = net.critic(obs).squeeze(-1)
        v_loss = 0.5 * ((v - returns) ** 2).mean().item()
    old_logp = logp - ratios.log()
    # the five cases of test_ppo_loss_clipping: -2.4, 1.5, 0.8, -1.0, -3.3
    pg = (-2.4 + 1.5 + 0.8 - 1.0 - 3.3) / 5  # -0.88
    loss, st = ppo_loss(net, obs, actions, old_logp, adv, returns, clip, vf_coef, ent_coef, normalize=False)
    st = {k: float(v) for k, v in st.items()}
    assert st["pg_loss"] == pytest.approx(pg, abs=1e-5)
    assert st["entropy"] == pytest.approx(entropy, abs=1e-6)
    assert st["v_loss"] == pytest.approx(v_loss, abs=1e-5)
    assert st["clipfrac"] == pytest.approx(0.8)  # |r - 1| > clip in four of five samples
    assert loss.item() == pytest.approx(pg - ent_coef * entropy + vf_coef * v_loss, abs=1e-5)
    # with zero advantages, the value term trains only the critic and the entropy term only the actor
    zero = torch.zeros(5)
    net.zero_grad()
    ppo_loss(net, obs, actions, old_logp, zero, returns, clip, 1.0, 0.0, False)[0].backward()
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in net.actor.parameters())
    assert sum(p.grad.abs().sum().item() for p in net.critic.parameters()) > 0
    net.zero_grad()
    ppo_loss(net, obs, actions, old_logp, zero, returns, clip, 0.0, 1.0, False)[0].backward()
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in net.critic.parameters())
    assert sum(p.grad.abs().sum().item() for p in net.actor.parameters()) > 0


def test_ppo_loss_normalizes_advantages():
    net, obs, actions = _net_and_batch(6, seed=2)
    with torch.no_grad():
        logp, _, value = net.evaluate(obs, actions)
    old_logp = logp - torch.tensor([0.1, -0.1, 0.05, 0.3, -0.3, 0.0])
    adv = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    norm = (adv - adv.mean()) / (adv.std() + 1e-8)
    _, a = ppo_loss(net, obs, actions, old_logp, adv, value, 0.2, 0.0, 0.0, normalize=True)
    _, b = ppo_loss(net, obs, actions, old_logp, norm, value, 0.2, 0.0, 0.0, normalize=False)
    _, c = ppo_loss(net, obs, actions, old_logp, 10 * adv - 7, value, 0.2, 0.0, 0.0, normalize=True)
    a, b, c = ({k: float(v) for k, v in s.items()} for s in (a, b, c))
    assert a["pg_loss"] == pytest.approx(b["pg_loss"], abs=1e-6)
    assert a["pg_loss"] == pytest.approx(c["pg_loss"], abs=1e-5)  # invariant to scale and shift
    _, raw = ppo_loss(net, obs, actions, old_logp, adv, value, 0.2, 0.0, 0.0, normalize=False)
    assert abs(float(raw["pg_loss"]) - a["pg_loss"]) > 0.5


# ------------------------------------------------------------------ acting
def test_policy_act_shapes_dtypes_and_logp_match_evaluate():
    policy = PPOPolicy(4, 3, [16], seed=7)
    source = ActorCritic(4, 3, [16])  # load other weights, as an actor does
    policy.load(5, {k: v.numpy() for k, v in source.state_dict().items()})
    assert policy.version == 5
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    actions, logp, values = policy.act(obs)
    assert actions.shape == logp.shape == values.shape == (8,)
    assert actions.dtype == np.int64 and logp.dtype == np.float32 and values.dtype == np.float32
    assert ((actions >= 0) & (actions < 3)).all()
    assert (logp <= 0).all()
    with torch.no_grad():
        lp, ent, v = source.evaluate(torch.from_numpy(obs), torch.from_numpy(actions))
    np.testing.assert_allclose(logp, lp.numpy(), atol=1e-6)
    np.testing.assert_allclose(values, v.numpy(), atol=1e-6)
    np.testing.assert_allclose(policy.value(obs), v.numpy(), atol=1e-6)
    # same seed, same weights, same observations: the same actions
    again = PPOPolicy(4, 3, [16], seed=7)
    again.load(5, {k: v.numpy() for k, v in source.state_dict().items()})
    assert np.array_equal(again.act(obs)[0], actions)


# ------------------------------------------------------------------ learner
def _ppo_cfg(**kw) -> PPOConfig:
    base = dict(
        name="ppo", hidden_sizes=[16], lr=3e-3, epochs=3, minibatches=4, ent_coef=0.0, normalize_advantages=False
    )
    return PPOConfig(**{**base, **kw})


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _full_loss(learner: PPOLearner, batch, cfg) -> float:
    t = {k: torch.as_tensor(v) for k, v in batch.items()}
    with torch.no_grad():
        loss, _ = ppo_loss(
            learner.net,
            t["obs"],
            t["actions"],
            t["logp"],
            t["advantages"],
            t["returns"],
            cfg.clip_coef,
            cfg.vf_coef,
            cfg.ent_coef,
            cfg.normalize_advantages,
        )
    return loss.item()


def test_learner_train_reduces_loss_and_calls_grad_hook_per_minibatch_step(h):
    cfg = _ppo_cfg()
    learner = PPOLearner(4, 2, cfg, seed=0)
    batch = h.ppo_train_batch(learner, 64)
    before = _full_loss(learner, batch, cfg)
    calls = []

    def hook():  # runs after backward, before the optimizer step: gradients are there
        calls.append(all(p.grad is not None for p in learner.net.parameters()))

    stats = learner.train(batch, grad_hook=hook)
    assert len(calls) == cfg.epochs * cfg.minibatches == 12
    assert all(calls)
    assert learner.updates == 12
    after = _full_loss(learner, batch, cfg)
    assert after < before - 0.05, (before, after)
    assert {"loss", "pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac"} <= set(stats)
    for _ in range(5):
        learner.train(batch)
    assert _full_loss(learner, batch, cfg) < after


@pytest.mark.parametrize("n", [64, 70, 255])
def test_learner_train_runs_exactly_the_configured_minibatches(h, n, monkeypatch):
    """``minibatches`` per epoch whatever the batch size: no extra tiny minibatch of the remainder."""
    cfg = _ppo_cfg(epochs=2, minibatches=4)
    learner = PPOLearner(4, 2, cfg, seed=0)
    sizes = []
    real = ppo_loss

    def spy(net, obs, *args, **kwargs):
        sizes.append(len(obs))
        return real(net, obs, *args, **kwargs)

    monkeypatch.setattr("tianji_dask.algos.ppo.core.ppo_loss", spy)
    learner.train(h.ppo_train_batch(learner, n))
    assert len(sizes) == cfg.epochs * cfg.minibatches, sizes
    assert sum(sizes) == cfg.epochs * n  # every sample once per epoch
    assert max(sizes) - min(sizes) <= 1


def test_grad_hook_sees_gradients_before_the_step(h):
    """Zeroing the gradients in the hook (where data-parallel learners average them) means Adam
    moves nothing: the hook runs between backward and step."""
    cfg = _ppo_cfg()
    learner = PPOLearner(4, 2, cfg, seed=0)
    before = {k: v.clone() for k, v in learner.net.state_dict().items()}

    def zero():
        for p in learner.net.parameters():
            p.grad.zero_()

    learner.train(h.ppo_train_batch(learner, 64), grad_hook=zero)
    assert all(torch.equal(before[k], v) for k, v in learner.net.state_dict().items())
    learner.train(h.ppo_train_batch(learner, 64))
    assert not all(torch.equal(before[k], v) for k, v in learner.net.state_dict().items())


# ------------------------------------------------------------------ rollout buffer
def _rollout(version: int, T: int = 4, N: int = 2, tag: int = 0) -> dict:
    return {
        "obs": np.zeros((T, N, 4), np.float32),
        "actions": np.full((T, N), tag, np.int64),
        "rewards": np.zeros((T, N), np.float32),
        "version": np.array(version, np.int64),
        "created": np.array(time.time(), np.float64),
    }


def _buffer(*overrides):
    cfg = load_config(PPO_CONFIG, list(overrides), check_env=False)
    inbox = LocalQueue(capacity_bytes=1 << 26, full_policy="wait")
    return RolloutBufferRole(cfg, inbox), inbox


def _tags(rollouts) -> list[int]:
    return [int(r.data["actions"].flat[0]) for r in rollouts]


def test_buffer_drops_rollouts_beyond_max_policy_lag_and_counts_transitions():
    buf, inbox = _buffer("algo.max_policy_lag=1", "topology.actors=4")
    inbox.push(_rollout(0, tag=1))  # lag 2 at learner version 2: dropped
    inbox.push(_rollout(1, tag=2))  # lag 1: still usable
    inbox.push(_rollout(2, tag=3))
    assert buf.ingest() == 3 * 8
    assert buf.stale_dropped == 0
    assert _tags(buf.take(2)) == [3]  # the newest first
    assert buf.stale_dropped == 8  # 4 steps x 2 envs of the version-0 rollout
    assert _tags(buf.take(2)) == [2]  # lag exactly max_policy_lag is kept
    assert buf.take(2) == []
    assert buf.stale_dropped == 8
    assert buf.heartbeat().counters.stale_dropped == 8
    # a rollout that was used and later goes stale is not counted as dropped unused
    buf2, inbox2 = _buffer("algo.max_policy_lag=1", "algo.sample_reuse=2", "topology.actors=4")
    inbox2.push(_rollout(0, tag=1))
    buf2.ingest()
    assert _tags(buf2.take(0)) == [1]
    assert buf2.take(5) == []
    assert buf2.stale_dropped == 0


def test_buffer_serves_newest_first_and_each_rollout_once_with_reuse_1():
    buf, inbox = _buffer("algo.sample_reuse=1", "algo.max_policy_lag=8", "topology.actors=3")
    for tag in (1, 2, 3):
        inbox.push(_rollout(0, tag=tag))
    buf.ingest()
    served = [_tags(buf.take(v)) for v in range(4)]
    assert served == [[3], [2], [1], []]
    assert len(buf) == 0 and buf.stale_dropped == 0
    # a newer arrival is served before older ones still waiting
    for tag in (4, 5):
        inbox.push(_rollout(4, tag=tag))
    buf.ingest()
    assert _tags(buf.take(4)) == [5]
    inbox.push(_rollout(5, tag=6))
    buf.ingest()
    assert _tags(buf.take(5)) == [6]
    assert _tags(buf.take(6)) == [4]


def test_a_balanced_buffer_serves_the_oldest_version_first_so_a_late_rollout_is_not_dropped():
    # two actors, the learner takes one rollout of each; actor 0's version-1 rollout arrives after
    # actor 1's versions 1 and 2 (actor 1 ran a rollout ahead)
    arrivals = [(1, 1), (2, 2), (1, 3)]  # (version, tag)
    served, dropped = {}, {}
    for tolerance in ("0.25", "null"):
        buf, inbox = _buffer(
            f"algo.ratio_tolerance={tolerance}",
            "algo.max_policy_lag=1",
            "algo.rollouts_per_update=2",
            "topology.actors=2",
        )
        for version, tag in arrivals:
            inbox.push(_rollout(version, tag=tag))
        buf.ingest()
        first = _tags(buf.take(2))
        inbox.push(_rollout(2, tag=4))
        buf.ingest()
        served[tolerance] = [first, _tags(buf.take(3))]
        dropped[tolerance] = buf.stale_dropped
    assert served["0.25"] == [[1, 3], [2, 4]]  # balanced: version 1 first, in arrival order
    assert dropped["0.25"] == 0
    assert served["null"] == [[3, 2], []]  # unbalanced: the newest; tag 1 went stale, tag 4 waits for a second
    assert dropped["null"] == 8


def test_buffer_sample_reuse_8_serves_a_rollout_up_to_8_times():
    buf, inbox = _buffer("algo.sample_reuse=8", "algo.max_policy_lag=8")
    inbox.push(_rollout(0, tag=1))
    buf.ingest()
    served = [_tags(buf.take(v)) for v in range(10)]  # learner versions 0..9; lag <= 7 while served
    assert served == [[1]] * 8 + [[], []]
    assert buf.stale_dropped == 0
    # a newer rollout takes over at once; the older one comes back after the newer is used up
    inbox.push(_rollout(10, tag=2))
    inbox.push(_rollout(10, tag=3))
    buf.ingest()
    served = [_tags(buf.take(v)) for v in range(10, 10 + 17)]
    assert served[:8] == [[3]] * 8
    assert served[8] == [2]  # lag 8 == max_policy_lag: still allowed
    assert served[9:] == [[]] * 8  # lag 9: dropped, with 7 uses left it was used once
    assert buf.stale_dropped == 0


def test_buffer_waits_for_a_full_batch_of_rollouts():
    # several rollouts per iteration (configs/pong_ppo.yaml): training on whatever arrived first would
    # take several times the serial algorithm's gradient steps per sample
    buf, inbox = _buffer("algo.rollouts_per_update=3", "algo.max_policy_lag=1", "topology.actors=3")
    for tag in (1, 2):
        inbox.push(_rollout(0, tag=tag))
    buf.ingest()
    assert buf.take(0) == [] and len(buf) == 2 * 8  # nothing used up while waiting
    inbox.push(_rollout(0, tag=3))
    buf.ingest()
    assert sorted(_tags(buf.take(0))) == [1, 2, 3]
    assert buf.take(1) == [] and buf.stale_dropped == 0


# ------------------------------------------------------------------ PPO learner role
def _full_rollout(version: int, T: int, N: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(T, N, 4)).astype(np.float32),
        "actions": rng.integers(0, 2, (T, N)).astype(np.int64),
        "logp": np.full((T, N), math.log(0.5), np.float32),
        "values": np.zeros((T, N), np.float32),
        "rewards": np.ones((T, N), np.float32),
        "dones": np.zeros((T, N), np.float32),
        "last_values": np.zeros(N, np.float32),
        "version": np.array(version, np.int64),
        "created": np.array(time.time(), np.float64),
    }


@pytest.mark.parametrize("reuse", [1, 8])
def test_learner_lr_schedule_follows_training_not_production(reuse):
    """As in the serial algorithm, one iteration advances the lr schedule by the env steps of one
    rollout per ``sample_reuse``, however many transitions the actors produced (and the buffer
    dropped) meanwhile."""
    cfg = load_config(PPO_CONFIG, [f"algo.sample_reuse={reuse}", f"algo.max_policy_lag={reuse}"], check_env=False)
    a = cfg.algo
    per_iteration = a.rollout_steps * cfg.env.num_envs / reuse  # 256 or 32 env steps
    buf, inbox = _buffer(f"algo.sample_reuse={reuse}", f"algo.max_policy_lag={reuse}")
    learner = PPOLearnerRole(cfg, buf, LocalTopic(), 4, Discrete(2), seed=0)
    lrs = []
    for i in range(6):
        inbox.push(_full_rollout(learner.version, a.rollout_steps, cfg.env.num_envs, seed=i))
        buf.ingest()
        buf.received += 50_000  # actors far ahead of the learner: their transitions were dropped
        assert learner.step()
        lrs.append(learner.learner_core.optim.param_groups[0]["lr"])
    expected = [a.lr * max(1 - i * per_iteration / a.lr_anneal_steps, 0.05) for i in range(6)]
    assert lrs == pytest.approx(expected, rel=1e-9)
    assert lrs[-1] > 0.9 * a.lr  # production (300k transitions) did not anneal it to its floor


def test_a_restored_learner_role_continues_the_lr_schedule():
    """A learner role restored from another's state (a restart, a resumed run) anneals on from
    the iterations that state had trained, not from the start of the schedule."""
    cfg = load_config(PPO_CONFIG, check_env=False)
    a = cfg.algo
    buf, inbox = _buffer()
    trained = PPOLearnerRole(cfg, buf, LocalTopic(), 4, Discrete(2), seed=0)
    for i in range(3):
        inbox.push(_full_rollout(trained.version, a.rollout_steps, cfg.env.num_envs, seed=i))
        buf.ingest()
        assert trained.step()
    buf2, inbox2 = _buffer()
    restored = PPOLearnerRole(cfg, buf2, LocalTopic(), 4, Discrete(2), seed=1)
    restored.restore(trained.learner_core.state())
    for learner, b, box in ((trained, buf, inbox), (restored, buf2, inbox2)):
        box.push(_full_rollout(learner.version, a.rollout_steps, cfg.env.num_envs, seed=9))
        b.ingest()
        assert learner.step()
    per_iteration = a.rollout_steps * cfg.env.num_envs
    want = a.lr * max(1 - 3 * per_iteration / a.lr_anneal_steps, 0.05)
    assert restored.learner_core.optim.param_groups[0]["lr"] == pytest.approx(want, rel=1e-9)
    assert trained.learner_core.optim.param_groups[0]["lr"] == pytest.approx(want, rel=1e-9)


# ------------------------------------------------------------------ PPO actor
def _actor_cfg(*extra):
    return load_config(PPO_CONFIG, [f"env.id={SHORT_ENV}", "env.num_envs=2", "algo.rollout_steps=8", *extra])


def _params(seed: int) -> tuple[ActorCritic, dict]:
    torch.manual_seed(seed)
    net = ActorCritic(4, 2, [64, 64])
    return net, {k: v.numpy().copy() for k, v in net.state_dict().items()}


def _logp_under(net: ActorCritic, r: dict) -> np.ndarray:
    with torch.no_grad():
        lp, _, _ = net.evaluate(torch.from_numpy(r["obs"].reshape(-1, 4)), torch.from_numpy(r["actions"].reshape(-1)))
    return lp.numpy().reshape(r["actions"].shape)


def test_actor_tags_each_rollout_with_the_version_it_started_with():
    cfg = _actor_cfg()
    queue, topic = LocalQueue(capacity_bytes=1 << 26), LocalTopic()
    actor = PPOActorRole(cfg, 0, 123, queue, topic.subscribe(), n_actors=1)
    net0, p0 = _params(0)
    net1, p1 = _params(1)
    topic.publish(0, {"params": p0, "consumed": 0})
    actor.wait_for_params(5.0)
    for _ in range(4):
        actor.step()
    topic.publish(1, {"params": p1, "consumed": 256})  # mid-rollout
    for _ in range(4):
        actor.step()
    (first,) = [item.payload for item in queue.poll()]
    assert int(first["version"]) == 0
    assert actor.policy.version == 0  # not swapped mid-rollout
    np.testing.assert_allclose(first["logp"], _logp_under(net0, first), atol=1e-5)  # all 8 steps by v0
    for _ in range(8):
        actor.step()
    (second,) = [item.payload for item in queue.poll()]
    assert int(second["version"]) == 1
    np.testing.assert_allclose(second["logp"], _logp_under(net1, second), atol=1e-5)
    assert not np.allclose(second["logp"], _logp_under(net0, second), atol=1e-3)
    assert first["obs"].shape == (8, 2, 4) and first["actions"].shape == (8, 2)
    assert first["last_values"].shape == (2,)
    assert float(second["created"]) >= float(first["created"])
    hb = actor.heartbeat().counters
    assert hb.env_steps == 32 and hb.messages_sent == 2 and hb.param_version == 1


def test_actor_bootstraps_truncated_steps_but_reports_the_env_return():
    cfg = _actor_cfg()
    gamma = cfg.algo.gamma
    seed = 321
    queue, topic = LocalQueue(capacity_bytes=1 << 26), LocalTopic()
    actor = PPOActorRole(cfg, 0, seed, queue, topic.subscribe(), n_actors=1)
    net, p = _params(4)
    topic.publish(0, {"params": p, "consumed": 0})
    actor.wait_for_params(5.0)
    for _ in range(8):
        actor.step()
    (r,) = [item.payload for item in queue.poll()]
    # replay the same actions in a twin env to find where episodes ended and their final obs
    twin = make_vector_env(SHORT_ENV, 2, seed)
    obs, _ = twin.reset(seed=seed)
    np.testing.assert_array_equal(r["obs"][0], obs)
    expected = np.empty((8, 2), np.float32)
    truncations = 0
    for t in range(8):
        obs, rew, term, trunc, info = twin.step(r["actions"][t])
        expected[t] = rew
        for i in np.flatnonzero(trunc & ~term):
            truncations += 1
            with torch.no_grad():
                v_final = net.value(torch.from_numpy(info["final_obs"][i].astype(np.float32)[None]))[0].item()
            assert abs(gamma * v_final) > 1e-3  # the bootstrap is visible in the reward
            expected[t, i] += gamma * v_final
        np.testing.assert_array_equal(r["dones"][t], (term | trunc).astype(np.float32))
        if t < 7:
            np.testing.assert_allclose(r["obs"][t + 1], obs, atol=1e-6)
    assert truncations == 2  # both envs hit the 5-step limit at t=4
    assert r["dones"][4].tolist() == [1.0, 1.0] and r["dones"].sum() == 2
    np.testing.assert_allclose(r["rewards"], expected, atol=1e-5)
    assert not np.allclose(r["rewards"][4], 1.0)
    assert np.all(r["rewards"][[0, 1, 2, 3, 5, 6, 7]] == 1.0)
    episodes = actor.heartbeat().episodes
    assert [(ret, length) for ret, length, _ in episodes] == [(5.0, 5), (5.0, 5)]  # the env's own sum


def test_ppo_train_reports_float_means(h):
    learner = PPOLearner(4, 2, _ppo_cfg(), seed=0)
    stats = learner.train(h.ppo_train_batch(learner, 64))
    assert set(stats) == {"pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "behaviour_weight", "loss"}
    assert all(type(v) is float and math.isfinite(v) for v in stats.values()), stats


def test_sample_categorical_inverts_the_cdf_at_the_uniforms():
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]] * 5))  # CDF 0.2, 0.7, 1.0
    uniforms = torch.tensor([0.1, 0.25, 0.69, 0.71, 0.999999])
    assert sample_categorical(logits, uniforms).tolist() == [0, 1, 1, 2, 2]
    # a CDF that sums to just below 1 never yields an action past the last one
    assert sample_categorical(torch.tensor([[0.0, 0.0]]), torch.tensor([1.0 - 1e-9])).tolist() == [1]


def test_sample_categorical_draws_the_policys_distribution():
    probs = torch.tensor([0.1, 0.6, 0.05, 0.25])
    n = 200_000
    gen = torch.Generator().manual_seed(0)
    actions = sample_categorical(torch.log(probs).expand(n, 4), torch.rand(n, generator=gen))
    freq = torch.bincount(actions, minlength=4).double() / n
    torch.testing.assert_close(freq, probs.double(), atol=4e-3, rtol=0)  # ~4 standard errors


def test_ppo_policy_acts_with_the_seeds_uniforms_and_the_networks_probabilities():
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    policy = PPOPolicy(4, 3, [8], seed=5)
    actions, logp, values = policy.act(obs)
    with torch.no_grad():
        logits, want_values = policy.net.heads(torch.from_numpy(obs))
    uniforms = torch.rand(16, generator=torch.Generator().manual_seed(5))
    want = sample_categorical(logits, uniforms)
    np.testing.assert_array_equal(actions, want.numpy())
    np.testing.assert_allclose(logp, torch.log_softmax(logits, -1).gather(1, want[:, None]).squeeze(1), rtol=1e-6)
    np.testing.assert_allclose(values, want_values.numpy(), rtol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ppo_policy_on_cuda_acts_as_on_the_cpu():
    """Same parameters, observations and seed: the same actions whichever device runs the net."""
    obs = np.random.default_rng(1).integers(0, 256, (64, 4, 84, 84), dtype=np.uint8)
    cpu = PPOPolicy(0, 6, [], seed=9, network="nature_cnn")
    gpu = PPOPolicy(0, 6, [], seed=9, network="nature_cnn", device="cuda")
    gpu.load(0, {k: v.numpy() for k, v in cpu.net.state_dict().items()})
    for _ in range(3):
        a_cpu, logp_cpu, v_cpu = cpu.act(obs)
        a_gpu, logp_gpu, v_gpu = gpu.act(obs)
        np.testing.assert_array_equal(a_gpu, a_cpu)
        # cuDNN convolutions use TF32 by default: agreement to about 1e-3, not float32's 1e-6
        np.testing.assert_allclose(logp_gpu, logp_cpu, atol=2e-3)
        np.testing.assert_allclose(v_gpu, v_cpu, atol=2e-3)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_acting_in_two_halves_gives_what_acting_at_once_gives(device):
    """``act_async`` launches the inference and its returned call reads the results (on a GPU
    from pinned memory after the graph): the same actions, log-probs and values as ``act`` with
    the same generator state, and the next launch does not change what was read."""
    rng = np.random.default_rng(2)
    batches = [rng.integers(0, 256, (32, 4, 84, 84), dtype=np.uint8) for _ in range(5)]
    at_once = PPOPolicy(0, 6, [], seed=4, network="nature_cnn", device=device)
    halves = PPOPolicy(0, 6, [], seed=4, network="nature_cnn", device=device)
    halves.load(0, {k: v.cpu().numpy() for k, v in at_once.net.state_dict().items()})
    for obs in batches:  # through the eager calls and into the graph's replays on a GPU
        want = at_once.act(obs)
        got = halves.act_async(obs)()
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)
    read = halves.act_async(batches[0])()
    kept = [x.copy() for x in read]
    halves.act_async(batches[1])()  # reuses the pinned buffer: what was read is a copy
    for a, b in zip(read, kept):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ppo_policy_on_cuda_replays_a_graph_that_acts_as_the_eager_inference():
    """The CUDA policy acts from a CUDA graph after two eager calls: the same actions, log-probs
    and values as eager inference on the same device, also after new parameters are loaded
    (the graph reads the tensors ``load`` copies into)."""
    rng = np.random.default_rng(2)
    graphed = PPOPolicy(0, 6, [], seed=4, network="nature_cnn", device="cuda")
    eager = PPOPolicy(0, 6, [], seed=4, network="nature_cnn", device="cuda")
    eager._graphed = None
    other = PPOPolicy(0, 6, [], seed=1, network="nature_cnn")
    for i in range(6):  # eager, eager, capture and replay, replays
        if i == 4:
            params = {k: v.numpy() for k, v in other.net.state_dict().items()}
            graphed.load(1, params)
            eager.load(1, params)
        else:
            eager.load(0, {k: v.cpu().numpy() for k, v in graphed.net.state_dict().items()})
        obs = rng.integers(0, 256, (64, 4, 84, 84), dtype=np.uint8)
        got, want = graphed.act(obs), eager.act(obs)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], atol=1e-5)
        np.testing.assert_allclose(got[2], want[2], atol=1e-5)
    assert graphed._graphed is not None and len(graphed._graphed._graphs) == 1


def _atari_batch(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n_frames = n + 3
    return {
        "frames": rng.integers(0, 256, (n_frames, 84, 84), dtype=np.uint8),
        "obs_frames": (np.arange(n)[:, None] + np.arange(4)).astype(np.int32),
        "actions": rng.integers(0, 6, n).astype(np.int64),
        "logp": np.log(rng.uniform(0.1, 0.3, n)).astype(np.float32),
        "advantages": rng.normal(size=n).astype(np.float32),
        "returns": rng.normal(size=n).astype(np.float32),
    }


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cuda_graph", ["iteration", "minibatch"])
def test_ppo_learner_on_cuda_graph_trains_as_the_eager_step(monkeypatch, cuda_graph):
    """The CUDA learner replays its whole iteration as one CUDA graph after one eager iteration
    (``algo.cuda_graph: iteration``), or its minibatch step as a graph after two eager warm-up
    steps (``minibatch``); a grad hook (data-parallel learners) keeps every step eager. Same
    seeds, same batches: the same parameters, optimiser state and stats, bit for bit. cuDNN's
    default convolution backward is not deterministic (two eager learners drift apart by
    percents within three batches), so the comparison runs with deterministic cuDNN."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    cfg = PPOConfig(
        name="ppo",
        epochs=2,
        minibatches=4,
        staleness_correction="decoupled",
        lr_anneal_steps=10_000,
        cuda_graph=cuda_graph,
    )
    graphed = PPOLearner(0, 6, cfg, seed=0, device="cuda", network="nature_cnn")
    eager = PPOLearner(0, 6, cfg, seed=0, device="cuda", network="nature_cnn")
    for s in range(3):  # warm-up, warm-up and capture, replays
        for learner in (graphed, eager):
            learner.set_lr_for(1000 * s)
        batch = _atari_batch(256, s)
        stats_graphed = graphed.train(batch)
        stats_eager = eager.train(batch, grad_hook=lambda: None)
        assert stats_graphed == stats_eager
    state_graphed, state_eager = graphed.state(), eager.state()
    for comp in ("net", "optim_state"):
        for name, value in state_graphed[comp].items():
            assert torch.equal(value, state_eager[comp][name]), (comp, name)
    assert graphed.updates == eager.updates == 3 * 2 * 4


@pytest.mark.parametrize(
    "ratio, weight, adv, expected_pg",
    [
        (1.5, 0.5, 1.0, -0.5 * 1.2),  # clipped at 1 + clip against the proximal policy, then weighted
        (0.7, 3.0, -1.0, 2.0 * 0.8),  # clipped at 1 - clip; the weight truncated at weight_max = 2
        (1.05, 1.0, 2.0, -2.1),  # inside the band: the plain ratio
    ],
)
def test_decoupled_ppo_loss_clips_against_the_proximal_policy_and_weights_by_the_acting_one(
    ratio, weight, adv, expected_pg
):
    """pi / pi_prox = ratio and pi_prox / pi_acted = weight, by construction of the log-probs."""
    net, obs, actions = _net_and_batch(4)
    with torch.no_grad():
        logp, _, value = net.evaluate(obs, actions)
    prox_logp = logp - math.log(ratio)
    acted_logp = prox_logp - math.log(weight)
    advs = torch.full((4,), adv)
    _, st = ppo_loss(
        net, obs, actions, acted_logp, advs, value, 0.2, 0.0, 0.0, normalize=False, prox_logp=prox_logp, weight_max=2.0
    )
    assert float(st["pg_loss"]) == pytest.approx(expected_pg, abs=1e-5)
    assert float(st["behaviour_weight"]) == pytest.approx(min(weight, 2.0), abs=1e-5)


def test_decoupled_ppo_loss_is_ppos_when_the_proximal_policy_acted():
    net, obs, actions = _net_and_batch(6, seed=3)
    with torch.no_grad():
        logp, _, value = net.evaluate(obs, actions)
    acted = logp - torch.tensor([0.2, -0.2, 0.05, 0.3, -0.3, 0.0])
    adv = torch.tensor([1.0, -2.0, 0.5, 3.0, -1.0, 2.0])
    plain, a = ppo_loss(net, obs, actions, acted, adv, value, 0.2, 0.5, 0.01, normalize=True)
    decoupled, b = ppo_loss(net, obs, actions, acted, adv, value, 0.2, 0.5, 0.01, normalize=True, prox_logp=acted)
    assert decoupled.item() == pytest.approx(plain.item(), abs=1e-7)
    assert float(b["behaviour_weight"]) == 1.0 and float(a["behaviour_weight"]) == 1.0


def test_learner_with_decoupled_correction_takes_the_proximal_log_probs_of_the_whole_batch(h):
    cfg = _ppo_cfg(staleness_correction="decoupled")
    learner = PPOLearner(4, 2, cfg, seed=0)
    batch = h.ppo_train_batch(learner, 100)
    t = {k: torch.as_tensor(v) for k, v in batch.items()}
    with torch.no_grad():
        want = learner.net.evaluate(t["obs"], t["actions"])[0]
    got = learner._proximal_logp(lambda idx: t["obs"][idx], t["actions"], chunk=32)
    torch.testing.assert_close(got, want)
    stats = learner.train(batch)
    # the batch's log-probs are the current policy's (ppo_train_batch), so the weights start at 1
    assert 0.9 < stats["behaviour_weight"] <= 1.0 + 1e-6


# ------------------------------------------------------------------ the iteration's fast path
def _atari_frames_batch(n: int, seed: int, extra_frames: int = 3) -> dict[str, np.ndarray]:
    """An Atari batch whose ``n`` stacks share ``n + extra_frames`` frames at random positions (a
    rollout's frame count varies with its episode starts)."""
    rng = np.random.default_rng(seed)
    n_frames = n + extra_frames
    return {
        "frames": rng.integers(0, 256, (n_frames, 84, 84), dtype=np.uint8),
        "obs_frames": (rng.integers(0, n_frames - 3, n)[:, None] + np.arange(4)).astype(np.int32),
        "actions": rng.integers(0, 6, n).astype(np.int64),
        "logp": np.log(rng.uniform(0.1, 0.3, n)).astype(np.float32),
        "advantages": rng.normal(size=n).astype(np.float32),
        "returns": rng.normal(size=n).astype(np.float32),
    }


def _same_learners(a: PPOLearner, b: PPOLearner) -> None:
    state_a, state_b = a.state(), b.state()
    for comp in ("net", "optim_state"):
        for name, value in state_a[comp].items():
            assert torch.equal(value, state_b[comp][name]), (comp, name)
    assert a.updates == b.updates


def _graph_on_the_cpu(learner: PPOLearner, calls: list) -> None:
    """Stands in for the iteration's CUDA graph on the CPU: runs the iteration eagerly, as the
    graph's warm-up does, and records the shapes and dtypes of its inputs (a graph replays only
    the shapes it was captured with)."""

    def graphed(inputs):
        calls.append({k: (tuple(v.shape), v.dtype) for k, v in inputs.items()})
        learner.run.zero_grad()
        return learner._iteration(inputs)

    learner.run.graphs = True  # the host's side of a graphed learner, its launches the stand-in's
    learner.run.captured["iteration"] = graphed  # type: ignore[assignment]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("network", ["mlp", "nature_cnn"])
@pytest.mark.parametrize("correction", ["none", "decoupled"])
def test_iteration_path_trains_as_the_minibatch_loop(h, network, correction):
    """Without a grad hook an iteration is ``_iteration`` (the code a CUDA learner captures as one
    graph: minibatches gathered on the device from the epochs' permutations); with one, the
    minibatch loop. On the CPU both run eagerly: the same stats, parameters and Adam state, bit
    for bit, over iterations of different batch and frame counts."""
    cfg = _ppo_cfg(epochs=2, minibatches=3, staleness_correction=correction, normalize_advantages=True)
    kw = {"network": network} if network == "nature_cnn" else {}
    obs_dim, n_actions = (0, 6) if network == "nature_cnn" else (4, 2)
    fast = PPOLearner(obs_dim, n_actions, cfg, seed=3, **kw)
    loop = PPOLearner(obs_dim, n_actions, cfg, seed=3, **kw)
    hooked = []
    for s, n in enumerate((48, 50, 48)):
        batch = (
            _atari_frames_batch(n, s, extra_frames=3 + 5 * s)
            if network == "nature_cnn"
            else h.ppo_train_batch(fast, n, seed=s)
        )
        got = fast.train(batch)
        want = loop.train(batch, grad_hook=lambda: hooked.append(1))
        assert got == want
    assert len(hooked) == 3 * 2 * 3
    _same_learners(fast, loop)


@pytest.mark.timeout(60)
def test_iteration_graph_inputs_keep_their_shapes_as_the_frame_count_varies():
    """The host's side of the iteration graph, on the CPU (the graph replaced by the iteration run
    eagerly): each batch's frames go into a buffer with room to spare, so batches of varying
    frame counts reach the graph with the same shapes (one capture) until one holds more than
    the buffer; the results equal the minibatch loop's."""
    cfg = _ppo_cfg(epochs=2, minibatches=2, staleness_correction="decoupled", normalize_advantages=True)
    fast = PPOLearner(0, 6, cfg, seed=1, network="nature_cnn")
    loop = PPOLearner(0, 6, cfg, seed=1, network="nature_cnn")
    calls: list = []
    _graph_on_the_cpu(fast, calls)
    for s, extra in enumerate((10, 3, 12, 40)):  # 42 frames make room for 52; 80 more than that
        batch = _atari_frames_batch(32, s, extra_frames=extra)
        assert fast.train(batch) == loop.train(batch, grad_hook=lambda: None)
    assert calls[0] == calls[1] == calls[2] != calls[3]
    assert calls[0]["frames"] == ((42 + 42 // 4, 84, 84), torch.uint8)
    assert calls[3]["frames"] == ((72 + 72 // 4, 84, 84), torch.uint8)
    assert calls[0]["perms"] == ((2, 32), torch.int64)
    _same_learners(fast, loop)


def _minibatch_loss_and_grads(learner: PPOLearner, batch: dict[str, np.ndarray]):
    t = {k: torch.as_tensor(v) for k, v in batch.items()}
    obs = t["frames"][t["obs_frames"].long()]
    learner.run.zero_grad()
    loss, stats = ppo_loss(
        learner.net, obs, t["actions"], t["logp"], t["advantages"], t["returns"], 0.1, 0.5, 0.01, True
    )
    loss.backward()
    with torch.no_grad():
        features = learner.net.features(obs)
        logits, values = learner.net.heads(obs)
    return loss, stats, features, logits, values, {n: p.grad.clone() for n, p in learner.net.named_parameters()}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "precision, features_rtol, grad_cosine, loss_rtol",
    [
        # channels-last frames, float32 arithmetic: the same values up to the order of summation
        ("tf32", 1e-5, 1 - 1e-6, 1e-5),
        # bfloat16 trunk (8 significant bits): features within 3 %, every gradient tensor's direction
        # within 0.98 cosine (about 10 % relative error on random frames), the loss within 1 %
        ("bf16", 3e-2, 0.98, 1e-2),
    ],
)
def test_precision_changes_only_the_trunk_within_tolerance(precision, features_rtol, grad_cosine, loss_rtol):
    """``algo.precision`` on the CPU (bfloat16 autocast works there): the loss, its stats and every
    gradient within the stated tolerances of float32's; the heads, the features handed to them,
    the parameters and their gradients stay float32; the convolutions' weights are channels-last
    like the frames (and leave the learner in the usual layout)."""
    batch = _atari_frames_batch(64, 5)
    ref = PPOLearner(0, 6, PPOConfig(name="ppo"), seed=2, network="nature_cnn")
    other = PPOLearner(0, 6, PPOConfig(name="ppo", precision=precision), seed=2, network="nature_cnn")
    assert other.net.precision == precision and ref.net.precision == "fp32"
    loss_a, stats_a, feat_a, logits_a, values_a, grads_a = _minibatch_loss_and_grads(ref, batch)
    loss_b, stats_b, feat_b, logits_b, values_b, grads_b = _minibatch_loss_and_grads(other, batch)
    for x in (loss_b, feat_b, logits_b, values_b, *grads_b.values()):
        assert x.dtype == torch.float32
    for name, p in other.net.named_parameters():
        layout = torch.channels_last if p.dim() == 4 else torch.contiguous_format  # the convolutions'
        assert p.is_contiguous(memory_format=layout) and grads_b[name].stride() == p.stride(), name
    for name, array in other.policy_params().items():
        assert array.flags["C_CONTIGUOUS"], name  # what actors and checkpoints receive
    assert not torch.equal(feat_a, feat_b) or precision == "tf32"  # bf16 really ran
    scale = feat_a.abs().max()
    assert float((feat_a - feat_b).abs().max() / scale) < features_rtol
    assert float(loss_b.detach()) == pytest.approx(float(loss_a.detach()), rel=loss_rtol)
    for k in ("pg_loss", "v_loss", "entropy"):
        assert float(stats_b[k]) == pytest.approx(float(stats_a[k]), rel=loss_rtol, abs=1e-5), k
    for name, g in grads_a.items():
        cos = float(torch.nn.functional.cosine_similarity(g.flatten(), grads_b[name].flatten(), dim=0))
        assert cos > grad_cosine, (name, cos)


@pytest.mark.timeout(60)
def test_bf16_learner_trains_an_iteration_close_to_float32(one_torch_thread):
    """A whole iteration (8 minibatch steps of Adam) in bfloat16 against float32 from the same
    start: the stats agree within 2 %, and each parameter tensor's change points the same way as
    float32's (cosine above 0.95; its norm differs by at most 35 %: Adam's first steps are about
    lr x sign(gradient), so elements with small gradients flip with bfloat16's rounding). One
    torch thread, as in a worker: the rounding depends on how the reductions are split, and the
    last conv's bias measured 0.968 and 25 % with one thread, 0.975 and 22 % with two."""
    cfg = dict(name="ppo", epochs=2, minibatches=4, staleness_correction="decoupled", lr=2.5e-4)
    ref = PPOLearner(0, 6, PPOConfig(**cfg), seed=4, network="nature_cnn")
    bf16 = PPOLearner(0, 6, PPOConfig(**cfg, precision="bf16"), seed=4, network="nature_cnn")
    start = {k: v.clone() for k, v in ref.net.state_dict().items()}
    batch = _atari_frames_batch(128, 6)
    stats_ref, stats_bf16 = ref.train(batch), bf16.train(batch)
    for k in ("loss", "pg_loss", "v_loss", "entropy", "behaviour_weight"):
        assert stats_bf16[k] == pytest.approx(stats_ref[k], rel=2e-2, abs=1e-4), k
    for name, p in ref.net.state_dict().items():
        moved_ref, moved_bf16 = p - start[name], bf16.net.state_dict()[name] - start[name]
        cos = float(torch.nn.functional.cosine_similarity(moved_ref.flatten(), moved_bf16.flatten(), dim=0))
        assert cos > 0.95, (name, cos)
        assert float((moved_bf16 - moved_ref).norm() / moved_ref.norm()) < 0.35, name


def test_precision_other_than_fp32_needs_the_nature_cnn():
    with pytest.raises(ValueError, match="needs the Nature CNN"):
        PPOLearner(4, 2, _ppo_cfg(precision="bf16"), seed=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_ppo_learner_on_cuda_iteration_graph_trains_as_the_eager_loop(monkeypatch, precision):
    """The iteration's CUDA graph against the eager minibatch loop (a grad hook) on the same GPU,
    at each precision, with deterministic cuDNN: the same stats, parameters and Adam state, bit
    for bit (the same kernels on the same data, gathered inside the graph instead of from
    Python), over iterations whose frame counts vary: one eager iteration, a capture, replays,
    and a second capture when a batch holds more frames than the first graph's buffer."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    # precision tf32 allows TF32 matmuls for the process: restored after the test, by hand, as
    # monkeypatch's undo deletes what it finds outside an instance's __dict__ and cuBLASModule
    # keeps this switch in cuBLAS, not in its __dict__
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        _graph_against_eager(precision)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _graph_against_eager(precision: str) -> None:
    cfg = PPOConfig(
        name="ppo",
        epochs=2,
        minibatches=4,
        staleness_correction="decoupled",
        lr_anneal_steps=10_000,
        precision=precision,
    )
    graphed = PPOLearner(0, 6, cfg, seed=0, device="cuda", network="nature_cnn")
    eager = PPOLearner(0, 6, cfg, seed=0, device="cuda", network="nature_cnn")
    for s, extra in enumerate((3, 9, 5, 90, 7)):
        for learner in (graphed, eager):
            learner.set_lr_for(1000 * s)
        batch = _atari_frames_batch(256, s, extra_frames=extra)
        assert graphed.train(batch) == eager.train(batch, grad_hook=lambda: None), s
    _same_learners(graphed, eager)
    assert graphed.run.graphs and len(graphed.run.captured["iteration"]._graphs) == 2
    # the policy the graph trained acts in float32 as the eager learner's does
    obs = torch.from_numpy(_atari_frames_batch(64, 9)["frames"][:64].reshape(16, 4, 84, 84)).cuda()
    with torch.no_grad():
        assert torch.equal(graphed.net.heads(obs)[0], eager.net.heads(obs)[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ppo_learner_on_cuda_restored_captures_a_new_iteration_graph(monkeypatch):
    """``restore`` builds a new optimiser and graph: a restored learner trains on, bit for bit,
    as the learner it was saved from (deterministic cuDNN)."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    cfg = PPOConfig(name="ppo", epochs=2, minibatches=4, staleness_correction="decoupled")
    a = PPOLearner(0, 6, cfg, seed=0, device="cuda", network="nature_cnn")
    for s in range(3):
        a.train(_atari_frames_batch(256, s))
    b = PPOLearner(0, 6, cfg, seed=1, device="cuda", network="nature_cnn")
    b.restore(a.state())
    for s in range(3, 6):
        batch = _atari_frames_batch(256, s)
        assert a.train(batch) == b.train(batch), s
    _same_learners(a, b)
