"""PPO's Gaussian policy for Box action spaces: its log-prob and entropy, the running
normalisation statistics (kept by the learner, published to the actors, checkpointed), and the
rollouts a Pendulum actor makes with it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium.spaces import Box, Discrete
from gymnasium.wrappers.utils import RunningMeanStd

from tianji_dask.algos.ppo.actor import PPOActorRole
from tianji_dask.algos.ppo.buffer import RolloutBufferRole
from tianji_dask.algos.ppo.core import PPOLearner, network_for
from tianji_dask.algos.ppo.gaussian import GaussianActorCritic, GaussianPolicy, gaussian_entropy, gaussian_log_prob
from tianji_dask.algos.ppo.learner import PPOLearnerRole
from tianji_dask.algos.ppo.normalization import VARIANCE_EPS, Moments, RolloutNormalizer
from tianji_dask.channels import LocalQueue, LocalTopic
from tianji_dask.config import ConfigError, load_config
from tianji_dask.config.schema import PPOConfig
from tianji_dask.envs import make_vector_env
from tianji_dask.results.checkpoint import load_checkpoint, save_checkpoint

PENDULUM = "configs/pendulum_ppo.yaml"
PENDULUM_ACTIONS = Box(-2.0, 2.0, (1,), np.float32)


# ------------------------------------------------------------------ the distribution
def test_gaussian_log_prob_and_entropy_on_hand_computed_cases():
    half_log_2pi = 0.5 * math.log(2 * math.pi)  # 0.9189385
    # one dimension, standard normal, at its mean: log N(0; 0, 1) = -1/2 log(2 pi)
    zero = torch.zeros(1, 1, dtype=torch.float64)
    assert gaussian_log_prob(zero, zero, zero).item() == pytest.approx(-half_log_2pi, abs=1e-12)
    assert gaussian_entropy(zero).item() == pytest.approx(0.5 + half_log_2pi, abs=1e-12)  # 1.4189385
    # two dimensions: mean (1, -1), std (1, 2), action (2, 1); each is one std from its mean
    #   dim 0: -1/2 * 1^2 - log 1 - 0.9189385 = -1.4189385
    #   dim 1: -1/2 * ((1 - -1) / 2)^2 - log 2 - 0.9189385 = -0.5 - 0.6931472 - 0.9189385 = -2.1120857
    mean = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    log_std = torch.tensor([[0.0, math.log(2.0)]], dtype=torch.float64)
    action = torch.tensor([[2.0, 1.0]], dtype=torch.float64)
    assert gaussian_log_prob(mean, log_std, action).item() == pytest.approx(-3.5310242, abs=1e-7)
    # entropy: (1/2 + 0.9189385 + 0) + (1/2 + 0.9189385 + 0.6931472) = 1.4189385 + 2.1120857
    assert gaussian_entropy(log_std).item() == pytest.approx(3.5310242, abs=1e-7)


def test_gaussian_log_prob_and_entropy_agree_with_torch_normal():
    g = torch.Generator().manual_seed(0)
    mean, log_std = torch.randn(50, 3, generator=g), torch.randn(50, 3, generator=g) * 0.5
    actions = mean + torch.randn(50, 3, generator=g) * 2.0
    ref = torch.distributions.Normal(mean, log_std.exp())
    torch.testing.assert_close(gaussian_log_prob(mean, log_std, actions), ref.log_prob(actions).sum(-1))
    torch.testing.assert_close(gaussian_entropy(log_std), ref.entropy().sum(-1))


def test_network_evaluates_the_log_prob_of_the_given_actions_with_its_log_std():
    net = GaussianActorCritic(3, 2, [8])
    with torch.no_grad():
        net.actor_logstd.copy_(torch.tensor([0.5, -1.0]))
    obs, actions = torch.randn(5, 3), torch.randn(5, 2) * 3
    logp, entropy, value = net.evaluate(obs, actions)
    mean = net.actor_mean(obs)
    ref = torch.distributions.Normal(mean, torch.tensor([0.5, -1.0]).exp())
    torch.testing.assert_close(logp, ref.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, ref.entropy().sum(-1))
    assert value.shape == (5,)


# ------------------------------------------------------------------ gSDE
def _sde_net(log_stds: list[float]) -> GaussianActorCritic:
    """One observation, two features fixed at (0.6, -0.8) (zero input weights, biases atanh of
    them), mean = z0 + z1 = -0.2, the given log-stds per feature for the one action."""
    net = GaussianActorCritic(1, 1, [2], sde=True)
    with torch.no_grad():
        hidden, out = net.actor_mean[0], net.actor_mean[-1]
        hidden.weight.zero_()
        hidden.bias.copy_(torch.atanh(torch.tensor([0.6, -0.8])))
        out.weight.copy_(torch.tensor([[1.0, 1.0]]))
        out.bias.zero_()
        net.actor_logstd.copy_(torch.tensor(log_stds).reshape(2, 1))
    return net


def test_gsde_log_prob_and_entropy_on_a_hand_computed_case():
    # variance = z^2 @ std^2 + 1e-6 = 0.36 * 1 + 0.64 * 4 + 1e-6 = 2.920001
    net = _sde_net([0.0, math.log(2.0)])
    var = 2.920001
    logp, entropy, _ = net.evaluate(torch.zeros(1, 1), torch.tensor([[1.5]]))
    # log N(1.5; -0.2, var) = -1/2 * 1.7^2 / var - 1/2 log var - 1/2 log(2 pi)
    want = -0.5 * 1.7**2 / var - 0.5 * math.log(var) - 0.5 * math.log(2 * math.pi)
    assert logp.item() == pytest.approx(want, abs=1e-6)
    assert entropy.item() == pytest.approx(0.5 + 0.5 * math.log(2 * math.pi) + 0.5 * math.log(var), abs=1e-6)
    # the std's gradient reaches the log-stds, not the features (detached, as stable-baselines3's)
    logp.sum().backward()
    assert net.actor_logstd.grad is not None and net.actor_logstd.grad.abs().sum() > 0
    assert net.actor_mean[0].bias.grad is not None  # through the mean
    mean_only = net.actor_mean[0].bias.grad.clone()
    net.zero_grad()
    (-0.5 * (1.5 - net.policy(torch.zeros(1, 1))[0]) ** 2 / var).sum().backward()
    torch.testing.assert_close(net.actor_mean[0].bias.grad, mean_only)


def test_gsde_noise_is_the_features_times_each_envs_matrix_drawn_every_sample_freq_steps():
    net = _sde_net([math.log(0.5), math.log(3.0)])
    policy = GaussianPolicy(1, np.array([-2.0]), np.array([2.0]), [2], 0, 0.9, 3, sde_sample_freq=2)
    policy.load(0, {k: v.numpy() for k, v in net.state_dict().items()})
    obs = np.zeros((3, 1), np.float32)
    features = torch.tensor([0.6, -0.8])

    def step(t):
        policy.exploration_step(t)
        return policy.act(obs)

    a0, logp0, _ = step(0)
    assert policy._exploration is not None and policy._exploration.shape == (3, 2, 1)
    np.testing.assert_allclose(a0[:, 0], -0.2 + (features @ policy._exploration).numpy()[:, 0], atol=1e-6)
    assert len(set(np.round(a0[:, 0], 6))) == 3  # a matrix of its own for each env
    a1, _, _ = step(1)
    np.testing.assert_array_equal(a1, a0)  # same observation, same matrices: same action
    a2, _, _ = step(2)
    assert not np.allclose(a2, a0)  # drawn again at step 2
    # the rows of one env group are those envs' matrices
    part, _, _ = policy.act(obs[1:3], envs=slice(1, 3))
    np.testing.assert_array_equal(part, a2[1:3])
    # log-probs are those of the state-dependent Gaussian
    logp_net, _, _ = net.evaluate(torch.zeros(3, 1), torch.from_numpy(a0))
    np.testing.assert_allclose(logp0, logp_net.detach().numpy(), atol=1e-6)
    once = GaussianPolicy(1, np.array([-2.0]), np.array([2.0]), [2], 0, 0.9, 3, sde_sample_freq=-1)
    once.exploration_step(0)
    first = once._exploration.clone()
    for t in range(1, 9):
        once.exploration_step(t)
    torch.testing.assert_close(once._exploration, first)  # -1: once a rollout


def test_gsde_actions_spread_as_the_state_dependent_std_says():
    # 20,000 envs, one matrix each: the actions at one state are N(-0.2, 0.36 * 0.25 + 0.64 * 9)
    net = _sde_net([math.log(0.5), math.log(3.0)])
    n = 20_000
    policy = GaussianPolicy(1, np.array([-2.0]), np.array([2.0]), [2], 3, 0.9, n, sde_sample_freq=4)
    policy.load(0, {k: v.numpy() for k, v in net.state_dict().items()})
    policy.exploration_step(0)
    actions, _, _ = policy.act(np.zeros((n, 1), np.float32))
    assert actions.mean() == pytest.approx(-0.2, abs=0.05)
    assert actions.std() == pytest.approx(math.sqrt(0.36 * 0.25 + 0.64 * 9), rel=0.02)


def test_gsde_config_is_checked():
    with pytest.raises(ConfigError, match=r"algo.sde_sample_freq=0.*-1 for one draw a rollout"):
        load_config(PENDULUM, ["algo.sde_sample_freq=0"], check_env=False)
    with pytest.raises(ConfigError, match=r"algo.use_sde \(gSDE\) explores continuous \(Box\) actions"):
        load_config("configs/cartpole_ppo.yaml", ["algo.use_sde=true"])


def test_a_gsde_actor_and_learner_agree_on_the_log_probs_of_a_pendulum_rollout():
    learner, actor, _, (r,) = _learner_and_rollouts("algo.use_sde=true")
    assert actor.policy.net.sde and actor.policy.sde_sample_freq == 4
    with torch.no_grad():
        logp, _, _ = learner.learner_core.net.evaluate(
            torch.from_numpy(r["obs"].reshape(-1, 3)), torch.from_numpy(r["actions"].reshape(-1, 1))
        )
    np.testing.assert_allclose(r["logp"], logp.numpy().reshape(16, 2), atol=1e-5)


def test_the_action_space_chooses_the_policy():
    cfg = load_config(PENDULUM, check_env=False)
    assert network_for(cfg, PENDULUM_ACTIONS) == ("gaussian_mlp", 1)
    assert network_for(cfg, Box(-1.0, 1.0, (6,), np.float32)) == ("gaussian_mlp", 6)
    cartpole = load_config("configs/cartpole_ppo.yaml", check_env=False)
    assert network_for(cartpole, Discrete(2)) == ("mlp", 2)


# ------------------------------------------------------------------ running statistics
def test_moments_merge_as_gymnasiums_running_mean_std():
    """From the same start (mean 0, var 1, count 1e-4) and the same batches, the merged moments
    are those of gymnasium's RunningMeanStd, which cleanrl's wrappers use."""
    rng = np.random.default_rng(0)
    ours, theirs = Moments.initial((3,)), RunningMeanStd(shape=(3,))
    for n in (5, 1, 200, 37):
        batch = rng.normal(loc=[1.0, -20.0, 300.0], scale=[0.1, 5.0, 40.0], size=(n, 3))
        ours = ours.merged(Moments.of(batch))
        theirs.update(batch)
    assert ours.count == pytest.approx(theirs.count, rel=1e-12)
    np.testing.assert_allclose(ours.mean, theirs.mean, rtol=1e-12)
    np.testing.assert_allclose(ours.var, theirs.var, rtol=1e-10)
    back = Moments.unpack(ours.pack(), (3,))
    assert back.count == ours.count and np.array_equal(back.mean, ours.mean) and np.array_equal(back.var, ours.var)


def test_moments_of_parts_merge_to_the_moments_of_the_whole():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(90, 2)) * [1.0, 7.0] + [3.0, -2.0]
    merged = Moments.of(x[:10]).merged(Moments.of(x[10:60])).merged(Moments.of(x[60:]))
    whole = Moments.of(x)
    assert merged.count == 90
    np.testing.assert_allclose(merged.mean, whole.mean, rtol=1e-12)
    np.testing.assert_allclose(merged.var, whole.var, rtol=1e-12)
    same = whole.merged(Moments.of(np.empty((0, 2))))  # an empty rollout adds nothing
    assert same.count == 90 and np.array_equal(same.mean, whole.mean) and np.array_equal(same.var, whole.var)


def test_normalizer_uses_the_loaded_statistics_and_reports_the_rollouts_own():
    norm = RolloutNormalizer(num_envs=2, obs_shape=(2,), gamma=0.5)
    norm.load(Moments(10.0, np.array([1.0, 2.0]), np.array([4.0, 9.0])), Moments(10.0, np.array(0.0), np.array(4.0)))
    raw = np.array([[3.0, 2.0], [1.0, 500.0]])
    np.testing.assert_allclose(norm.observe(raw), [[1.0, 0.0], [0.0, 10.0]], atol=1e-6)  # (x - mean) / std, clipped
    np.testing.assert_allclose(norm.normalize(np.array([[1.0, 5.0]])), [[0.0, 1.0]], atol=1e-6)  # not recorded
    # G = G * gamma * (1 - terminated) + r per env; rewards scaled by 1 / sqrt(var(G) + 1e-8) = 1/2
    r1 = norm.rewards(np.array([2.0, 4.0]), np.array([False, False]))
    r2 = norm.rewards(np.array([2.0, 100.0]), np.array([True, False]))
    np.testing.assert_allclose(r1, [1.0, 2.0], atol=1e-6)
    np.testing.assert_allclose(r2, [1.0, 10.0], atol=1e-6)  # 50, clipped
    stats = norm.take()
    obs = Moments.unpack(stats["obs_moments"], (2,))
    assert obs.count == 2 and np.allclose(obs.mean, raw.mean(0)) and np.allclose(obs.var, raw.var(0))
    # env 0: G = 2, then terminated: 2 * 0.5 * 0 + 2 = 2; env 1: G = 4, then 4 * 0.5 + 100 = 102
    returns = Moments.unpack(stats["return_moments"], ())
    g = np.array([2.0, 4.0, 2.0, 102.0])
    assert returns.count == 4 and returns.mean == pytest.approx(g.mean()) and returns.var == pytest.approx(g.var())
    assert Moments.unpack(norm.take()["obs_moments"], (2,)).count == 0  # take starts the next rollout


def test_a_normalizer_switched_off_passes_observations_and_rewards_through_unclipped():
    norm = RolloutNormalizer(num_envs=2, obs_shape=(2,), gamma=0.5, observations=False, rewards=False)
    norm.load(Moments(10.0, np.array([1.0, 2.0]), np.array([4.0, 9.0])), Moments(10.0, np.array(0.0), np.array(4.0)))
    raw = np.array([[3.0, 2.0], [1.0, 500.0]])
    seen = norm.observe(raw)
    assert seen.dtype == np.float32
    np.testing.assert_array_equal(seen, raw)
    np.testing.assert_array_equal(norm.rewards(np.array([-16.5, 40.0]), np.array([False, False])), [-16.5, 40.0])
    stats = norm.take()  # the moments are gathered all the same
    assert Moments.unpack(stats["obs_moments"], (2,)).count == 2
    assert Moments.unpack(stats["return_moments"], ()).count == 2


def test_the_pendulum_config_trains_on_the_envs_own_observations_and_rewards():
    _, actor, _, (r,) = _learner_and_rollouts("algo.normalize_observations=false", "algo.normalize_rewards=false")
    twin = make_vector_env("Pendulum-v1", 2, 5)
    raw, _ = twin.reset(seed=5)
    for t in range(16):
        np.testing.assert_allclose(r["obs"][t], raw, rtol=1e-6)
        raw, reward, *_ = twin.step(np.clip(r["actions"][t], -2.0, 2.0))
        np.testing.assert_allclose(r["rewards"][t], reward, rtol=1e-6)
    assert load_config(PENDULUM, check_env=False).algo.normalize_rewards is False


# ------------------------------------------------------------------ the actor
def _pendulum_cfg(*extra):
    """The config's Pendulum with cleanrl's normalisation and the state-independent log-std
    (gSDE and the env's own observations and rewards have tests of their own)."""
    cleanrl = ["algo.use_sde=false", "algo.normalize_observations=true", "algo.normalize_rewards=true"]
    small = ["env.num_envs=2", "algo.rollout_steps=16", "algo.rollouts_per_update=1", "algo.minibatches=4"]
    return load_config(PENDULUM, [*small, *cleanrl, *extra])


def _gaussian_params(seed: int, log_std: float, obs: Moments, returns: Moments) -> tuple[GaussianActorCritic, dict]:
    torch.manual_seed(seed)
    net = GaussianActorCritic(3, 1, [64, 64])
    with torch.no_grad():
        net.actor_logstd.fill_(log_std)
        for running, m in ((net.obs_moments, obs), (net.return_moments, returns)):
            running.count.fill_(m.count)
            running.mean.copy_(torch.as_tensor(m.mean))
            running.var.copy_(torch.as_tensor(m.var))
    return net, {k: v.numpy().copy() for k, v in net.state_dict().items()}


def test_actor_keeps_the_unclipped_actions_and_normalised_views_of_a_pendulum_rollout():
    """With the statistics of version 0: the rollout's observations and rewards are the env's,
    normalised and scaled with them; its actions are the sampled ones (many beyond Pendulum's
    torque bound of 2, the std being 3) with their log-probabilities; the env got them clipped;
    the rollout carries the moments of the raw observations and returns it saw."""
    cfg = _pendulum_cfg()
    seed = 77
    obs_m = Moments(50.0, np.array([0.5, -0.2, 1.0]), np.array([0.25, 4.0, 9.0]))
    ret_m = Moments(50.0, np.array(-3.0), np.array(16.0))
    net, params = _gaussian_params(3, math.log(3.0), obs_m, ret_m)
    queue, topic = LocalQueue(capacity_bytes=1 << 26), LocalTopic()
    actor = PPOActorRole(cfg, 0, seed, queue, topic.subscribe(), n_actors=1)
    assert isinstance(actor.policy, GaussianPolicy)
    topic.publish(0, {"params": params, "consumed": 0})
    actor.wait_for_params(5.0)
    for _ in range(16):
        actor.step()
    (r,) = [item.payload for item in queue.poll()]
    assert r["actions"].shape == (16, 2, 1) and r["actions"].dtype == np.float32
    assert np.abs(r["actions"]).max() > 2.0  # unclipped
    with torch.no_grad():
        logp, _, _ = net.evaluate(
            torch.from_numpy(r["obs"].reshape(-1, 3)), torch.from_numpy(r["actions"].reshape(-1, 1))
        )
    np.testing.assert_allclose(r["logp"], logp.numpy().reshape(16, 2), atol=1e-5)
    # replay the clipped actions in a twin env: the raw observations and rewards behind the rollout
    twin = make_vector_env("Pendulum-v1", 2, seed)
    raw, _ = twin.reset(seed=seed)
    seen_obs, returns, g = [], [], np.zeros(2)
    for t in range(16):
        want = np.clip((raw - obs_m.mean) / np.sqrt(obs_m.var + VARIANCE_EPS), -10, 10)
        np.testing.assert_allclose(r["obs"][t], want, atol=1e-5)
        raw, reward, terminated, truncated, _ = twin.step(np.clip(r["actions"][t], -2.0, 2.0))
        assert not (terminated | truncated).any()  # 16 steps of a 200-step episode
        np.testing.assert_allclose(r["rewards"][t], reward / math.sqrt(16.0 + VARIANCE_EPS), rtol=1e-5)
        g = g * cfg.algo.gamma + reward
        seen_obs.append(raw)
        returns.append(g.copy())
    obs_seen = Moments.unpack(r["obs_moments"], (3,))
    assert obs_seen.count == 32
    np.testing.assert_allclose(obs_seen.mean, np.concatenate(seen_obs).mean(0), rtol=1e-5)
    np.testing.assert_allclose(obs_seen.var, np.concatenate(seen_obs).var(0), rtol=1e-5)
    returns_seen = Moments.unpack(r["return_moments"], ())
    assert returns_seen.count == 32 and returns_seen.mean == pytest.approx(np.concatenate(returns).mean(), rel=1e-6)
    # what the env gets is clipped to the bounds
    env_actions, actions, _, _ = actor._choose(0, r["obs"][0])
    np.testing.assert_array_equal(env_actions, np.clip(actions, -2.0, 2.0))


# ------------------------------------------------------------------ the learner
def _learner_and_rollouts(*extra, n_rollouts: int = 1):
    cfg = _pendulum_cfg(*extra)
    queue, topic = LocalQueue(capacity_bytes=1 << 26), LocalTopic()
    buffer = RolloutBufferRole(cfg, queue)
    learner = PPOLearnerRole(cfg, buffer, topic, 3, PENDULUM_ACTIONS, seed=0)
    actor = PPOActorRole(cfg, 0, 5, queue, topic.subscribe(), n_actors=1)
    learner.publish()
    actor.wait_for_params(5.0)
    rollouts = []
    for _ in range(16 * n_rollouts):
        actor.step()
    for item in queue.poll():
        rollouts.append(item.payload)
        queue.push(item.payload)
    buffer.ingest()
    return learner, actor, topic, rollouts


def test_learner_folds_each_rollouts_statistics_in_once_and_publishes_them():
    learner, actor, topic, (rollout,) = _learner_and_rollouts("algo.sample_reuse=2", "algo.max_policy_lag=2")
    net = learner.learner_core.net
    start = net.obs_moments.moments()
    assert learner.step() and learner.step()  # the same rollout, used twice
    assert not learner.step()
    want = start.merged(Moments.unpack(rollout["obs_moments"], (3,)))
    got = net.obs_moments.moments()
    assert got.count == pytest.approx(want.count) and got.count == pytest.approx(32 + 1e-4)
    np.testing.assert_allclose(got.mean, want.mean, rtol=1e-12)
    np.testing.assert_allclose(got.var, want.var, rtol=1e-12)
    assert net.return_moments.moments().count == pytest.approx(32 + 1e-4)
    # they travel with the parameters: the actor normalises with them from its next rollout
    actor.probe_params()
    assert actor.policy.version == 2
    np.testing.assert_array_equal(actor.policy.net.obs_moments.mean.numpy(), got.mean)
    np.testing.assert_allclose(actor.policy.normalize(want.mean[None]), 0.0, atol=1e-6)


def test_normalisation_statistics_restored_from_a_checkpoint_equal_the_saved_ones(tmp_path):
    learner, _, _, _ = _learner_and_rollouts(n_rollouts=1)
    assert learner.step()
    saved = {name: m.moments() for name, m in learner.learner_core._statistics.items()}
    assert set(saved) == {"obs_moments", "return_moments"} and saved["obs_moments"].count > 1
    save_checkpoint(tmp_path / "ckpt", learner.state(), {"updates": learner.learner_core.updates})
    state, _ = load_checkpoint(tmp_path / "ckpt")
    cfg = _pendulum_cfg()
    restored = PPOLearner(3, 1, cfg.algo_as(PPOConfig), seed=9, network="gaussian_mlp")
    fresh = restored.net.obs_moments.moments()
    assert fresh.count != saved["obs_moments"].count
    restored.restore(state)
    for name, running in restored._statistics.items():
        got = running.moments()
        assert got.count == saved[name].count
        np.testing.assert_array_equal(got.mean, saved[name].mean)
        np.testing.assert_array_equal(got.var, saved[name].var)
        assert running.mean.dtype == torch.float64
    for k, v in learner.learner_core.policy_params().items():
        np.testing.assert_array_equal(restored.policy_params()[k], v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gaussian_learner_on_cuda_replays_its_iteration_as_the_eager_minibatch_loop():
    """The MuJoCo learner's path on a GPU (``learner.device=cuda``, ``algo.cuda_graph:
    iteration``): the Gaussian MLP's whole iteration replayed as one CUDA graph from the second
    iteration, against the eager minibatch loop (a grad hook keeps it eager) on the same batches:
    the same statistics, parameters and Adam state within float rounding."""
    cfg = _pendulum_cfg("algo.epochs=2", "algo.minibatches=4", "algo.lr_anneal_steps=10000").algo_as(PPOConfig)
    graphed, eager = (PPOLearner(3, 1, cfg, seed=0, device="cuda", network="gaussian_mlp") for _ in range(2))
    rng = np.random.default_rng(0)
    for s in range(3):  # eager warm-up, capture, replay
        n = 64
        batch = {
            "obs": rng.normal(size=(n, 3)).astype(np.float32),
            "actions": rng.normal(size=(n, 1)).astype(np.float32),
            "logp": rng.normal(-1.0, 0.1, size=n).astype(np.float32),
            "advantages": rng.normal(size=n).astype(np.float32),
            "returns": rng.normal(size=n).astype(np.float32),
        }
        for learner in (graphed, eager):
            learner.set_lr_for(1000 * s)
        got, want = graphed.train(batch), eager.train(batch, grad_hook=lambda: None)
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), s
    assert graphed.run.graphs and len(graphed.run.captured["iteration"]._graphs) == 1
    for comp in ("net", "optim_state"):
        mine, theirs = graphed.state()[comp], eager.state()[comp]
        for name, value in mine.items():
            torch.testing.assert_close(value, theirs[name], msg=f"{comp} {name}")
    assert graphed.updates == eager.updates == 3 * 2 * 4
