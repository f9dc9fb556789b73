"""Atari building blocks: the DeepMind preprocessing of both backends, training-only reward
clipping and episodic life against full-game returns, the frame replay (bytes per transition,
exact stacks across episode boundaries, n-step windows, lost chunks), the Nature CNNs, the
config checks, and tiny Pong DQN and PPO runs on a real LocalCluster."""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest
import torch
import xarray as xr
from conftest import CONFIG, cli_here
from gymnasium.spaces import Discrete

from tianji_dask.algos.dqn.actor import DQNActorRole, NStepWindow
from tianji_dask.algos.dqn.core import DQNLearner, DQNPolicy
from tianji_dask.algos.networks import AtariActorCritic, NatureQNetwork, network_kind
from tianji_dask.algos.ppo.actor import PPOActorRole
from tianji_dask.algos.ppo.core import PPOLearner, PPOPolicy
from tianji_dask.algos.ppo.learner import PPOLearnerRole
from tianji_dask.channels import LocalQueue
from tianji_dask.config import ConfigError, check_env, load_config
from tianji_dask.envs import ATARI_OBS_SHAPE, AtariTrainingSignals, make_atari_vector_env, next_observations
from tianji_dask.roles.buffer import ReplayBufferRole
from tianji_dask.roles.frame_replay import FrameReplay, FrameStreams

cloudpickle.register_pickle_by_value(sys.modules[__name__])

DQN_SMALL = "configs/pong_dqn_small.yaml"
PPO_SMALL = "configs/pong_ppo_small.yaml"


def _needs_backend(backend: str) -> None:
    if backend == "gymnasium":
        pytest.importorskip("cv2", reason="the gymnasium backend needs opencv-python-headless")


# ------------------------------------------------------------------ preprocessing
@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["ale_vector", "gymnasium"])
def test_preprocessing_uint8_frame_stacks_for_both_backends(backend):
    _needs_backend(backend)
    n = 2
    env = make_atari_vector_env("ALE/Pong-v5", n, backend=backend)
    try:
        space = env.single_observation_space
        assert space.shape == ATARI_OBS_SHAPE == (4, 84, 84) and space.dtype == np.uint8
        assert env.single_action_space.n == 6  # Pong's minimal action set
        obs, infos = env.reset(seed=1)
        assert obs.shape == (n, 4, 84, 84) and obs.dtype == np.uint8
        assert np.asarray(infos["lives"]).shape == (n,)
        # the first stack of an episode is zero-padded: only its newest frame is a screen
        assert not obs[:, :3].any() and obs[:, 3].any()
        rng = np.random.default_rng(0)
        for _ in range(40):
            prev = obs
            obs, rewards, term, trunc, infos = env.step(rng.integers(0, 6, n))
            assert obs.shape == (n, 4, 84, 84) and obs.dtype == np.uint8
            assert rewards.shape == (n,) and not (term | trunc).any()
            # frame stack: each step shifts in one new 84x84 frame (4 emulator frames, max-pooled)
            np.testing.assert_array_equal(obs[:, :3], prev[:, 1:])
        assert 30 < obs[:, -1].mean() < 200  # a grayscale screen, not an empty or saturated one
    finally:
        env.close()


def test_training_signals_clip_rewards_and_end_lives_for_training_only():
    F, T = False, True
    sig = AtariTrainingSignals(lives=[3, 3, 5])
    rewards, term, dones = sig(
        np.array([4.0, -7.0, 0.0]), np.array([F, F, F]), np.array([F, F, F]), {"lives": np.array([3, 2, 5])}
    )
    np.testing.assert_array_equal(rewards, [1.0, -1.0, 0.0])
    assert rewards.dtype == np.float32
    np.testing.assert_array_equal(term, [F, T, F])  # env 1 lost a life: terminal for the learner
    np.testing.assert_array_equal(dones, [F, T, F])
    # a real game over (same-step autoreset: lives are already the new game's) and a time limit
    rewards, term, dones = sig(
        np.array([0.0, 0.0, 1.0]), np.array([T, F, F]), np.array([F, F, T]), {"lives": np.array([3, 2, 5])}
    )
    np.testing.assert_array_equal(term, [T, F, F])
    np.testing.assert_array_equal(dones, [T, F, T])
    assert sig.lives_lost == 1


@pytest.mark.slow  # plays Breakout
@pytest.mark.timeout(120)
def test_breakout_trains_on_lives_and_clipped_rewards_but_records_full_games():
    """One real Breakout game of 5 lives: 5 training episodes (zero discounts), one recorded
    episode with the raw full-game return."""
    cfg = load_config(DQN_SMALL, ["env.id=ALE/Breakout-v5", "env.num_envs=1", "algo.n_step=1", "channel.chunk_steps=8"])
    queue = LocalQueue(capacity_bytes=1 << 30)
    actor = DQNActorRole(cfg, 0, 7, queue, params=None, balance=False)
    raw = []
    step = actor.env.step

    def recording_step(actions):
        out = step(actions)
        raw.append(out[1].copy())
        return out

    actor.env.step = recording_step
    actor.probe_params = lambda: False
    lives0 = int(actor.training_signals.lives[0])
    try:
        for _ in range(5000):
            actor.step()
            if actor.tracker.count:
                break
        actor.flush()
    finally:
        actor.close()
    assert actor.tracker.count == 1, "no Breakout game ended"
    ret, length, _ = actor.tracker.drain()[0]
    raw = np.concatenate(raw)
    assert length == len(raw)
    assert ret == raw.sum() > 0  # the full game, every life, unclipped
    transitions = [item.payload for item in queue.poll()]
    rewards = np.concatenate([t["rewards"] for t in transitions])
    discounts = np.concatenate([t["discounts"] for t in transitions])
    assert len(rewards) == length
    np.testing.assert_array_equal(rewards, np.sign(raw))  # the learner's rewards are clipped
    # each lost life ends a training episode; the last life's loss is the game over
    assert lives0 == 5 and actor.training_signals.lives_lost == lives0 - 1
    assert int((discounts == 0).sum()) == lives0


# ------------------------------------------------------------------ frame replay
def test_frame_replay_bytes_per_transition():
    per = FrameReplay.nbytes_for(1_000_000) / 1_000_000
    print(
        f"\nframe replay: {per:.0f} bytes per transition, "
        f"{FrameReplay.nbytes_for(1_000_000) / 1e9:.2f} GB for 1,000,000 transitions"
    )
    assert 84 * 84 <= per < 7_300  # one 7,056-byte frame per transition plus ~2 % slack and 56 B
    assert FrameReplay.nbytes_for(1_000_000) < 10e9
    replay = FrameReplay(20_000)
    assert replay.nbytes == FrameReplay.nbytes_for(20_000)
    # the float32 ReplayMemory stores both stacks as float32: 2 * 4 * 84 * 84 * 4 = 225,792 B
    assert per < 2 * 4 * 84 * 84 * 4 / 30


def _recorded_actor_run(
    steps: int,
    n_step: int = 3,
    num_envs: int = 2,
    min_episodes: int = 1,
    env_id: str = "ALE/Pong-v5",
    backend: str = "ale_vector",
):
    """A DQN actor on a real Atari env with random actions; every chunk it pushes, and the
    transitions an n-step window over the *real* observations gives for the same steps."""
    cfg = load_config(
        DQN_SMALL,
        [
            f"env.id={env_id}",
            f"env.num_envs={num_envs}",
            f"algo.n_step={n_step}",
            "channel.chunk_steps=16",
            f"env.atari_backend={backend}",
        ],
        check_env=False,
    )
    queue = LocalQueue(capacity_bytes=1 << 34)
    actor = DQNActorRole(cfg, 3, 11, queue, params=None, balance=False)
    actor.probe_params = lambda: False
    shadow = NStepWindow(n_step, cfg.algo.gamma, num_envs, ATARI_OBS_SHAPE, np.uint8)
    signals = AtariTrainingSignals(actor.training_signals.lives)
    expected = []
    step = actor.env.step
    state = {"obs": actor.obs.copy()}

    def shadowing_step(actions):
        out = step(actions)
        nxt, rewards, term, trunc, infos = out
        tr_rewards, tr_term, tr_dones = signals(rewards, term, trunc, infos)
        got = shadow.add(
            state["obs"], actions, tr_rewards, next_observations(nxt, term | trunc, infos), tr_term, tr_dones
        )
        if got is not None:
            expected.append(got)
        state["obs"] = nxt.copy()
        return out

    actor.env.step = shadowing_step
    try:
        after = None  # steps run once an episode ended: the window must emit past the boundary
        for i in range(steps):
            actor.step()
            if after is None and i >= steps // 4 and actor.tracker.count >= min_episodes:
                after = 0
            if after is not None:
                after += 1
                if after > n_step + 20:
                    break
        actor.flush()
    finally:
        actor.close()
    chunks = [item.payload for item in queue.poll()]
    want = {k: np.concatenate([e[k] for e in expected]) for k in expected[0]}
    return cfg, actor, chunks, want


@pytest.fixture(scope="module")
def pong_run():
    return _recorded_actor_run(steps=2500)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["ale_vector", "gymnasium"])
def test_frame_replay_rebuilds_exactly_what_the_env_produced(backend, pong_run):
    _needs_backend(backend)
    run = pong_run if backend == "ale_vector" else _recorded_actor_run(2500, backend=backend)
    cfg, actor, chunks, want = run
    assert actor.tracker.count >= 1, "no Pong game ended: no episode boundary was crossed"
    # chunks move each frame once (plus the 4 frames of each episode's first stack)
    sent_frames = sum(len(c["frame_ids"]) for c in chunks)
    steps = actor.counters.env_steps
    assert sent_frames == steps + 4 * (actor.num_envs + actor.tracker.count)
    assert all(c["frames"].dtype == np.uint8 and c["obs"].dtype == np.int64 for c in chunks)

    buffer = ReplayBufferRole(
        LocalQueue(capacity_bytes=1 << 34), cfg.algo.buffer_size, ATARI_OBS_SHAPE, np.uint8, frame_stacks=True, seed=0
    )
    for c in chunks:
        buffer.inbox.push(c)
    assert buffer.ingest() == len(want["actions"])
    replay = buffer.replay
    assert isinstance(replay, FrameReplay) and replay.unresolved == 0
    assert len(replay) == len(want["actions"])
    got = replay.get(np.arange(len(replay)))
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    # the window crossed game overs (zero discounts), and the transition after one starts from
    # the next game's zero-padded first stack
    n_envs = actor.num_envs
    zero = (want["discounts"] == 0).reshape(-1, n_envs)  # one row of transitions per step
    starts = 0
    for e in range(n_envs):
        for j in np.flatnonzero(zero[:-1, e] & ~zero[1:, e]):
            first = got["obs"][(j + 1) * n_envs + e]
            assert not first[:3].any() and first[3].any()
            starts += 1
    assert starts >= 1
    # n-step: returns of 3 steps, discounts gamma**3 where no episode ended
    assert np.isclose(want["discounts"].max(), cfg.algo.gamma**3)
    # what the learner samples is among what the env produced
    batch = buffer.sample(64)
    assert batch["obs"].shape == (64, 4, 84, 84) and batch["obs"].dtype == np.uint8
    produced = {(o.tobytes(), n.tobytes()) for o, n in zip(want["obs"], want["next_obs"])}
    assert all((o.tobytes(), n.tobytes()) in produced for o, n in zip(batch["obs"], batch["next_obs"]))


@pytest.mark.slow  # a recorded Pong actor run
@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_frame_replay_on_a_torch_device_gives_the_host_replays_batch(pong_run, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    _, _, chunks, _ = pong_run
    host, on_device = FrameReplay(300, frame_capacity=290), FrameReplay(300, frame_capacity=290, device=device)
    for c in chunks:  # a small ring: wrapped, and the oldest transitions lost frames
        assert np.array_equal(host.add(c)[0], on_device.add(c)[0])
    idx = np.random.default_rng(0).integers(0, 300, 256)
    assert np.array_equal(host.valid(idx), on_device.valid(idx))
    want, got = host.get(idx), on_device.get(idx)
    for k in ("obs", "next_obs"):
        assert isinstance(got[k], torch.Tensor) and got[k].device.type == device
        np.testing.assert_array_equal(got[k].cpu().numpy(), want[k], err_msg=k)
    for k in ("actions", "rewards", "discounts"):
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    # the transitions mirrored on the device: 8 positions, oldest count, action (int64), return,
    # discount (float32), and three int64 scalars
    assert on_device.nbytes == host.nbytes + 300 * (8 * 8 + 8 + 8 + 4 + 4) + 3 * 8


@pytest.mark.slow  # a recorded Pong actor run
@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_device_replay_draws_stored_transitions_uniformly_on_the_device(pong_run, device):
    """``sample_on_device`` draws uniformly among the transitions that still have their frames,
    and each drawn row is the transition at its ring index: frames, action, return, discount."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    _, _, chunks, _ = pong_run
    host, on_device = FrameReplay(300, frame_capacity=290), FrameReplay(300, frame_capacity=290, device=device)
    for c in chunks:  # wrapped, and the oldest transitions lost frames
        host.add(c)
        on_device.add(c)
    valid = host.valid(np.arange(300))
    assert 0 < valid.sum() < 300
    torch.manual_seed(0)
    counts = np.zeros(300, np.int64)
    for i in range(60):
        batch = on_device.sample_on_device(256)
        idx = batch["indices"].cpu().numpy()
        assert valid[idx].all()
        if i < 4:  # 1,024 rows compared whole (frame stacks are what make a comparison slow)
            want = host.get(idx)
            for k in want:
                np.testing.assert_array_equal(batch[k].cpu().numpy(), want[k], err_msg=k)
        counts += np.bincount(idx, minlength=300)
    expected = counts.sum() / valid.sum()
    # each valid transition drawn about equally often: within 5 binomial standard deviations
    assert np.abs(counts[valid] - expected).max() < 5 * np.sqrt(expected)


def _warmed_up_serial_run(overrides: list[str], transitions: int):
    """A serial run of the small Pong DQN config whose buffer holds ``transitions``."""
    from tianji_dask.runtime.serial import SerialRun

    run = SerialRun(load_config(DQN_SMALL, overrides))
    run.learner.publish()
    run.actor.probe_params()
    while len(run.buffer) < transitions:
        run.actor.step()
        run.actor.flush()
        run.buffer.ingest()
    return run


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("replay", ["uniform", "prioritized"])
def test_a_dqn_learner_trains_from_a_replay_on_its_device(replay, device):
    """Uniform: batches drawn on the device (on CUDA, draw and update replayed as one graph
    from the third update); prioritized: drawn by the host's sum-tree, stacks gathered there."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    overrides = [
        "algo.replay_device=learner",
        f"algo.replay={replay}",
        "algo.learning_starts=64",
        "env.num_envs=2",
        f"learner.device={device}",
    ]
    run = _warmed_up_serial_run([*overrides, "algo.batch_size=32", "algo.ratio_tolerance=null"], 64)
    assert isinstance(run.buffer.sample(4)["obs"], torch.Tensor)
    assert (run.buffer.device_sampler() is None) == (replay == "prioritized")
    for _ in range(5):
        assert run.learner.step()
        run.actor.step()  # the buffer's adds between updates
        run.actor.flush()
        run.buffer.ingest()
    counters = run.learner.heartbeat().message()["counters"]
    assert counters["updates"] == 5 and np.isfinite(counters["loss"]) and np.isfinite(counters["q_mean"])
    run.actor.close()


@pytest.mark.timeout(120)
def test_a_learner_on_a_device_replay_makes_updates_per_graph_a_launch_up_to_each_publication():
    """``algo.updates_per_graph=4`` with a publication every 6 updates: launches of 4 and 2
    updates (a launch ends where a publication is due), each publication at its update count,
    the heartbeat's statistics the mean over the updates (here on the CPU, where a launch's
    updates run in turn; the CUDA graph of several updates is tested in test_dqn.py)."""
    overrides = [
        "algo.replay_device=learner",
        "algo.learning_starts=64",
        "algo.batch_size=8",
        "algo.ratio_tolerance=null",
        "algo.updates_per_graph=4",
        "env.num_envs=2",
        "learner.device=cpu",
        "learner.publish_interval=6",
    ]
    run = _warmed_up_serial_run(overrides, 64)
    seen = []
    for _ in range(4):
        assert run.learner.step()
        seen.append((run.learner.counters.updates, run.learner.counters.param_version))
    assert seen == [(4, 0), (6, 6), (10, 6), (12, 12)]
    counters = run.learner.heartbeat().counters
    assert counters.samples == 12 * 8 and np.isfinite(counters.loss)
    run.actor.close()
    with pytest.raises(ConfigError, match="replay_device=learner keeps a frame replay.*env.kind=atari"):
        load_config(CONFIG, ["algo.replay_device=learner"])


@pytest.mark.slow  # a recorded Pong actor run
@pytest.mark.timeout(120)
def test_frame_replay_wraps_and_skips_transitions_that_lost_frames(pong_run):
    _, _, chunks, want = pong_run
    # a small ring: transitions wrap many times and frames are overwritten under old transitions
    replay = FrameReplay(300, frame_capacity=290)
    for c in chunks:
        replay.add(c)
    assert len(replay) == 300 and replay.frames_written > 3 * 290
    idx = np.arange(300)
    valid = replay.valid(idx)
    assert 0 < valid.sum() < 300  # the slack was too small on purpose: the oldest lost frames
    # ring index -> position in the stream of all transitions
    newest_first = (replay._pos - 1 - np.arange(300)) % 300
    order = len(want["actions"]) - 1 - np.arange(300)
    for ring, k in zip(newest_first, order):
        if valid[ring]:
            got = replay.get(np.array([ring]))
            np.testing.assert_array_equal(got["obs"][0], want["obs"][k])
            np.testing.assert_array_equal(got["next_obs"][0], want["next_obs"][k])
    batch = replay.sample(200, np.random.default_rng(0))  # never an invalid one
    produced = {o.tobytes() for o in want["obs"]}
    assert all(o.tobytes() in produced for o in batch["obs"])


@pytest.mark.slow  # a recorded Pong actor run
@pytest.mark.timeout(120)
def test_frame_replay_skips_transitions_whose_frames_were_dropped(pong_run):
    _, _, chunks, want = pong_run
    replay = FrameReplay(100_000)
    lost = 5
    for i, c in enumerate(chunks):
        if i != lost:  # a chunk dropped on the way (full_policy: drop_oldest)
            replay.add(c)
    n_lost = len(chunks[lost]["actions"])
    assert 0 < replay.unresolved <= 2 * 8  # the next chunk's first transitions need its frames
    assert len(replay) == len(want["actions"]) - n_lost - replay.unresolved
    produced = {(o.tobytes(), n.tobytes()) for o, n in zip(want["obs"], want["next_obs"])}
    got = replay.get(np.arange(len(replay)))
    assert all((o.tobytes(), n.tobytes()) in produced for o, n in zip(got["obs"], got["next_obs"]))


def test_frame_streams_emit_each_frame_once():
    streams = FrameStreams(actor_id=2, num_envs=2)
    obs = np.zeros((2, 4, 2, 2), np.uint8)
    obs[:, 3] = [[[1]], [[2]]]
    streams.start(obs)
    first = streams.ids.copy()
    nxt = np.stack([obs[0], obs[1]])
    nxt[:, :3], nxt[:, 3] = obs[:, 1:], 9
    real = streams.step(nxt, np.array([False, False]), {})
    np.testing.assert_array_equal(real[:, :3], first[:, 1:])
    frames, ids = streams.take()
    assert len(frames) == len(ids) == 8 + 2 and len(set(ids.tolist())) == 10
    assert streams.take()[1].size == 0


# ------------------------------------------------------------------ networks
def test_nature_cnn_forward_shapes_and_uint8_input():
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    q = NatureQNetwork(6)
    out = q(obs)
    assert out.shape == (5, 6) and out.dtype == torch.float32
    torch.testing.assert_close(out, q(obs.float() / 255.0))  # divided by 255 inside
    convs = [m for m in q.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (32, (8, 8), (4, 4)),
        (64, (4, 4), (2, 2)),
        (64, (3, 3), (1, 1)),
    ]
    assert q.head.in_features == 512
    assert sum(p.numel() for p in q.parameters()) == 1_687_206  # the Nature DQN for 6 actions

    ac = AtariActorCritic(6)
    logits, value = ac.heads(obs)
    assert logits.shape == (5, 6) and value.shape == (5,)
    logp, ent, v = ac.evaluate(obs, torch.zeros(5, dtype=torch.long))
    assert logp.shape == ent.shape == v.shape == (5,)
    torch.testing.assert_close(ac.value(obs), value)
    # cleanrl's init: orthogonal, zero biases, small policy head
    assert all(
        float(m.bias.detach().abs().max()) == 0
        for m in ac.modules()
        if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))
    )
    w = ac.actor.weight
    torch.testing.assert_close(w @ w.T, 0.01**2 * torch.eye(6), atol=1e-6, rtol=0)
    assert float(logits.detach().std()) < 0.05  # near-uniform initial policy


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("step_groups", [1, 2])
def test_ppo_rollouts_carry_each_frame_once_and_rebuild_exactly_the_envs_stacks(step_groups, one_torch_thread):
    """A PPO actor on real Pong, every observation its policy acted on recorded: each pushed
    rollout's ``frames[obs_frames]`` is exactly those stacks, across episode ends, in about a
    quarter of the stacks' bytes, whether its envs step as one vector env or in two groups; the
    learner's batch of several rollouts rebuilds them too."""
    num_envs, T = 2, 64
    overrides = [f"env.num_envs={num_envs}", f"algo.rollout_steps={T}", f"env.step_groups={step_groups}"]
    cfg = load_config(PPO_SMALL, overrides, check_env=False)
    queue = LocalQueue(capacity_bytes=1 << 34)
    actor = PPOActorRole(cfg, 2, 7, queue, params=None, balance=False)
    actor.probe_params = lambda: False
    pieces = []  # what each act call saw: one group's observations
    act = actor.policy.act

    def recording_act(obs, envs=slice(None)):
        pieces.append(obs.copy())
        return act(obs, envs)

    actor.policy.act = recording_act
    try:
        rollouts_after_an_end = 0
        while rollouts_after_an_end < 2:
            for _ in range(T):
                actor.step()
            if actor.tracker.count >= 1:
                rollouts_after_an_end += 1
    finally:
        actor.close()
    seen = [np.concatenate(pieces[i : i + step_groups]) for i in range(0, len(pieces), step_groups)]
    rollouts = [item.payload for item in queue.poll()]
    assert len(rollouts) == len(seen) // T and actor.tracker.count >= 1
    for i, r in enumerate(rollouts):
        assert "obs" not in r and r["frames"].dtype == np.uint8 and r["obs_frames"].dtype == np.int32
        want = np.stack(seen[i * T : (i + 1) * T])  # (T, N, 4, 84, 84)
        np.testing.assert_array_equal(r["frames"][r["obs_frames"]], want)
        # each step's new frame once, plus the first stacks and the stacks of new episodes
        assert len(r["frames"]) <= T * num_envs + 4 * num_envs + 5 * actor.tracker.count
    # the learner's batch of several rollouts: frames concatenated, positions shifted to match
    learner = PPOLearnerRole(cfg, buffer=None, publisher=None, obs_dim=4 * 84 * 84, action_space=Discrete(6), seed=0)

    class Held:
        def __init__(self, data):
            self.data = data

    batch = learner.batch_from([Held(r) for r in rollouts[-2:]])
    want = np.stack(seen[len(rollouts) * T - 2 * T : len(rollouts) * T]).reshape(-1, 4, 84, 84)
    np.testing.assert_array_equal(batch["frames"][batch["obs_frames"]], want)


@pytest.mark.timeout(60)
def test_ppo_trains_the_same_on_frames_and_positions_as_on_the_stacks():
    cfg = load_config(PPO_SMALL)
    rng = np.random.default_rng(1)
    n, n_frames = 32, 40
    frames = rng.integers(0, 256, (n_frames, 84, 84), dtype=np.uint8)
    positions = rng.integers(0, n_frames, (n, 4)).astype(np.int32)
    common = {
        "actions": rng.integers(0, 6, n),
        "logp": np.full(n, -np.log(6), np.float32),
        "advantages": rng.normal(size=n).astype(np.float32),
        "returns": rng.normal(size=n).astype(np.float32),
    }
    on_stacks = PPOLearner(4 * 84 * 84, 6, cfg.algo, seed=3, network="nature_cnn")
    on_frames = PPOLearner(4 * 84 * 84, 6, cfg.algo, seed=3, network="nature_cnn")
    want = on_stacks.train({**common, "obs": frames[positions]})
    got = on_frames.train({**common, "frames": frames, "obs_frames": positions})
    assert got == want
    for a, b in zip(on_stacks.policy_params().values(), on_frames.policy_params().values()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.timeout(60)
def test_dqn_and_ppo_learners_train_on_uint8_stacks():
    cfg = load_config(DQN_SMALL)
    assert network_kind(cfg) == "nature_cnn"
    rng = np.random.default_rng(0)
    n = 16
    batch = {
        "obs": rng.integers(0, 256, (n, 4, 84, 84), dtype=np.uint8),
        "next_obs": rng.integers(0, 256, (n, 4, 84, 84), dtype=np.uint8),
        "actions": rng.integers(0, 6, n),
        "rewards": np.ones(n, np.float32),
        "discounts": np.full(n, 0.99, np.float32),
    }
    learner = DQNLearner(4 * 84 * 84, 6, cfg.algo, seed=0, network="nature_cnn")
    loss, q = learner.update(batch).tolist()
    assert np.isfinite(loss) and np.isfinite(q)
    policy = DQNPolicy(4 * 84 * 84, 6, [], seed=0, network="nature_cnn")
    policy.load(1, learner.policy_params())
    acts = policy.act(batch["obs"][:3], eps=0.0)
    assert acts.shape == (3,) and acts.dtype == np.int64

    pcfg = load_config(PPO_SMALL)
    ppo = PPOLearner(4 * 84 * 84, 6, pcfg.algo, seed=0, network="nature_cnn")
    stats = ppo.train(
        {
            "obs": batch["obs"],
            "actions": batch["actions"],
            "logp": np.full(n, -np.log(6), np.float32),
            "advantages": rng.normal(size=n).astype(np.float32),
            "returns": rng.normal(size=n).astype(np.float32),
        }
    )
    assert np.isfinite(stats["loss"])
    pol = PPOPolicy(4 * 84 * 84, 6, [], seed=0, network="nature_cnn")
    pol.load(1, ppo.policy_params())
    a, logp, v = pol.act(batch["obs"][:3])
    assert a.shape == logp.shape == v.shape == (3,)


# ------------------------------------------------------------------ config
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["env.kind=gym"], "env.id='ALE/Pong-v5' is an Atari game: set env.kind=atari"),
        (["env.atari_backend=native"], "env.atari_backend='native': Input should be 'ale_vector' or 'gymnasium'"),
        (["env.atari_threads=0"], "env.atari_threads=0"),
    ],
)
def test_bad_atari_configs_name_the_fix(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(DQN_SMALL, overrides, check_env=False)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "env_id, message",
    [
        ("ALE/Pongg-v5", "did you mean ALE/Pong-v5?"),
        ("PongNoFrameskip-v4", "did you mean ALE/Pong-v5?"),
        ("CartPole-v1", "a non-Atari gymnasium env needs env.kind=gym"),
    ],
)
def test_an_id_that_is_no_game_of_ale_py_is_refused_by_the_machine_check(env_id, message):
    overrides = [f"env.id={env_id}"]
    assert load_config(DQN_SMALL, overrides, check_env=False).env.id == env_id  # the schema cannot know
    with pytest.raises(ConfigError) as err:
        load_config(DQN_SMALL, overrides)
    assert f"env.id={env_id!r} (env.kind=atari)" in str(err.value) and message in str(err.value)


def test_an_atari_config_loads_without_ale_py_unless_the_env_is_checked(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # import ale_py raises ImportError
    cfg = load_config(DQN_SMALL, check_env=False)
    with pytest.raises(ConfigError, match=r"env.kind=atari needs ale-py \(.*\); pip install 'ale-py>=0.12'"):
        check_env(cfg)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["ale_vector", "gymnasium"])
def test_check_env_gives_the_preprocessed_spaces(backend):
    _needs_backend(backend)
    cfg = load_config(DQN_SMALL, [f"env.atari_backend={backend}"])  # runs check_env
    obs_space, act_space = check_env(cfg)
    assert obs_space.shape == (4, 84, 84) and obs_space.dtype == np.uint8 and act_space.n == 6


def test_shipped_pong_configs_load():
    for name in ("pong_dqn_small", "pong_ppo_small", "pong_dqn", "pong_dqn_apex", "pong_ppo"):
        cfg = load_config(f"configs/{name}.yaml", check_env=False, check_device=False)
        assert cfg.env.kind == "atari" and cfg.env.id == "ALE/Pong-v5"
    big = load_config("configs/pong_dqn.yaml", check_env=False, check_device=False)
    # the Ape-X twin differs in its replay and exploration only (Fig. 4a-b's comparison)
    apex = load_config("configs/pong_dqn_apex.yaml", check_env=False, check_device=False).model_dump()
    plain = big.model_dump()
    assert {k for k in plain["algo"] if plain["algo"][k] != apex["algo"][k]} == {"exploration", "replay"}
    assert all(plain[s] == apex[s] for s in plain if s != "algo")
    assert big.algo.buffer_size == 100_000 and big.algo.target_replay_ratio == 32
    assert FrameReplay.nbytes_for(big.algo.buffer_size) < 10e9
    ppo = load_config("configs/pong_ppo.yaml", check_env=False, check_device=False)
    # a rollout carries each frame once: its steps' new frames plus each env's first stack
    # (and, rarely, a few more where episodes end)
    rollout = (ppo.algo.rollout_steps + 4) * ppo.env.num_envs * 84 * 84
    assert 1.1 * rollout < ppo.channel.capacity_bytes  # one rollout fits the credit window


# ------------------------------------------------------------------ end to end
def _check_files(h, run_dir, cfg) -> dict:
    """What every run directory holds (docs/metrics.md's variables), for PPO runs."""
    import xarray as xr

    assert {"config.yaml", "metrics.nc", "episodes.nc", "checkpoint"} <= {p.name for p in run_dir.iterdir()}
    assert load_config(run_dir / "config.yaml") == cfg
    docs = h.documented_tables()
    with xr.open_dataset(run_dir / "metrics.nc", engine="netcdf4") as ds:
        assert set(docs["metrics.nc"]) <= set(ds.data_vars)
        assert ds.attrs["mode"] == "distributed" and ds.sizes["time"] >= 2
        assert np.all(np.diff(ds["env_steps"].values) >= 0)
        return {"env_steps": int(ds["env_steps"][-1]), "updates": int(ds["updates"][-1]), "rows": int(ds.sizes["time"])}


def _check_atari_run(h, result, cfg, algo: str) -> dict:
    import xarray as xr

    from tianji_dask.results.checkpoint import load_checkpoint

    assert result is not None, "the run did not end"
    assert result.error is None, result.error
    assert result.status == "max_env_steps" and result.ok
    if algo == "dqn":  # conftest's checker of the metrics contract knows DQN's replay
        n = h.check_run_dir(result.run_dir, cfg, mode="distributed", checkpoint=False)
    else:
        n = _check_files(h, result.run_dir, cfg)
    assert n["updates"] > 0 and n["env_steps"] >= cfg.stop.max_env_steps
    with xr.open_dataset(result.run_dir / "episodes.nc", engine="netcdf4") as eps:
        returns, lengths = eps["return"].values, eps["length"].values
    # full Pong games: one side reached 21 points, hundreds of agent steps, integer returns
    assert len(returns) >= 1, "no Pong game ended"
    assert np.all(np.abs(returns) <= 21) and np.all(returns == np.round(returns))
    assert np.all(lengths > 500)
    state, meta = load_checkpoint(result.run_dir / "checkpoint")
    assert meta["env_id"] == "ALE/Pong-v5" and meta["algo"] == algo
    net = state["online"] if algo == "dqn" else state["net"]
    assert tuple(net["trunk.0.weight"].shape) == (32, 4, 8, 8)
    head = net["head.weight"] if algo == "dqn" else net["actor.weight"]
    assert tuple(head.shape) == (6, 512)
    return n


TINY_DQN = [
    "env.num_envs=2",
    "stop.max_env_steps=2400",
    "algo.learning_starts=500",
    "algo.train_freq=16",
    "algo.ratio_tolerance=null",
    "stop.max_seconds=200",
]
TINY_RUNS = {
    "dqn": (DQN_SMALL, TINY_DQN),
    "dqn_prioritized": (DQN_SMALL, [*TINY_DQN, "algo.replay=prioritized"]),
    "ppo": (  # the actor on an asynchronous env: the other env steps while the policy chooses for one
        PPO_SMALL,
        [
            "env.num_envs=2",
            "env.async_batch=1",
            "algo.rollout_steps=128",
            "algo.epochs=1",
            "algo.minibatches=2",
            "stop.max_env_steps=2400",
            "stop.max_seconds=200",
        ],
    ),
}


@pytest.fixture(scope="module")
def pong_client(h):
    """One LocalCluster, made as a run makes its own, for the tiny runs in turn (one actor each:
    two workers)."""
    with h.run_cluster_client(2) as client:
        yield client


@pytest.mark.integration
@pytest.mark.timeout(240)
@pytest.mark.parametrize("algo", sorted(TINY_RUNS))
def test_tiny_pong_run_on_a_local_cluster(h, tmp_path, algo, pong_client):
    from tianji_dask.runtime.driver import train

    path, overrides = TINY_RUNS[algo]
    result = train(load_config(path, overrides), pong_client, out=tmp_path / algo).wait(timeout=220)
    n = _check_atari_run(h, result, load_config(path, overrides), algo.split("_")[0])
    print(f"\npong {algo}: {n}")
    # the checkpoint plays a whole game on the env's own rewards (21 points to one side)
    played = cli_here("eval", result.run_dir, "--episodes", "1")
    assert played.returncode == 0, played.stderr
    with xr.open_dataset(result.run_dir / "eval.nc", engine="netcdf4") as ds:
        assert ds.sizes["episode"] == 1 and abs(float(ds["return"][0])) <= 21 and int(ds["length"][0]) > 0
        assert ds.attrs["checkpoint_env_steps"] > 0
    assert "1 episodes: return" in played.stdout
