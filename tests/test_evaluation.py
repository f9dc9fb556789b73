"""``tianji-dask eval``: the input it refuses before an env is built, and the actions its
policies take without exploration. The trained policies' evaluations run where the runs are
trained: test_learning (CartPole, DQN and PPO) and test_atari (a tiny Pong run, end to end)."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import torch
from conftest import cli, cli_here

from tianji_dask.algos.ppo.core import PPOPolicy
from tianji_dask.algos.ppo.gaussian import GaussianPolicy
from tianji_dask.results.checkpoint import save_checkpoint


@pytest.fixture
def run_dir(tmp_path):
    """A run directory of CartPole DQN whose checkpoint holds an untrained network."""
    from tianji_dask.algos.dqn.core import DQNLearner
    from tianji_dask.config import load_config

    cfg = load_config("configs/cartpole_dqn.yaml", [])
    d = tmp_path / "run"
    d.mkdir()
    shutil.copy("configs/cartpole_dqn.yaml", d / "config.yaml")
    learner = DQNLearner(4, 2, cfg.algo, seed=0)
    save_checkpoint(d / "checkpoint", learner.state(), {"algo": "dqn", "env_id": "CartPole-v1", "updates": 0})
    return d


def test_outputs_go_into_the_run_dir_and_are_never_overwritten(run_dir, tmp_path):
    """Run from elsewhere, eval writes nothing where it was called: eval.nc, then eval-2.nc; a
    relative --out is relative to the run directory and numbered the same; an absolute one is
    taken as given."""
    here = tmp_path / "elsewhere"
    here.mkdir()
    first = cli_here("eval", run_dir, "--episodes", "3", "--envs", "2", cwd=here)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("episode ") == 3 and "3 episodes: return" in first.stdout
    assert f"wrote {run_dir / 'eval.nc'}" in first.stdout
    before = (run_dir / "eval.nc").read_bytes()
    again = cli_here("eval", run_dir, "--episodes", "2", cwd=here)
    assert again.returncode == 0, again.stderr
    assert f"wrote {run_dir / 'eval-2.nc'}" in again.stdout
    assert (run_dir / "eval.nc").read_bytes() == before
    for expected in ("best.nc", "best-2.nc"):
        named = cli_here("eval", run_dir, "--episodes", "2", "--out", "best.nc", cwd=here)
        assert named.returncode == 0 and f"wrote {run_dir / expected}" in named.stdout, named.stderr
    outside = tmp_path / "results" / "cartpole.nc"
    absolute = cli_here("eval", run_dir, "--episodes", "2", "--out", outside, cwd=here)
    assert absolute.returncode == 0 and outside.is_file(), absolute.stderr
    assert list(here.iterdir()) == []
    import xarray as xr

    assert [xr.load_dataset(run_dir / f).sizes["episode"] for f in ("eval.nc", "eval-2.nc", "best-2.nc")] == [3, 2, 2]


def test_two_claims_of_one_name_get_two_files(tmp_path):
    """The name is claimed as it is written: a second writer of the same default takes the next."""
    from tianji_dask.results.evaluation import _claim

    assert [_claim(tmp_path / "eval.nc").name for _ in range(3)] == ["eval.nc", "eval-2.nc", "eval-3.nc"]


def test_the_best_checkpoint_is_played_where_the_run_kept_one_and_latest_picks_the_other(run_dir):
    from tianji_dask.algos.dqn.core import DQNLearner
    from tianji_dask.config import load_config

    learner = DQNLearner(4, 2, load_config("configs/cartpole_dqn.yaml", []).algo, seed=1)
    meta = {"algo": "dqn", "env_id": "CartPole-v1", "updates": 7, "eval_return_mean": 20.0}
    save_checkpoint(run_dir / "checkpoint_best", learner.state(), meta)
    best = cli_here("eval", run_dir, "--episodes", "2", "--out", run_dir / "best.nc")
    assert best.returncode == 0, best.stderr
    assert "checkpoint_best at 7 updates" in best.stdout
    assert f"played {run_dir / 'checkpoint_best'}, the best evaluated while it trained" in best.stdout
    latest = cli_here("eval", run_dir, "--episodes", "2", "--latest", "--out", run_dir / "latest.nc")
    assert latest.returncode == 0, latest.stderr
    assert (
        "checkpoint at 0 updates" in latest.stdout and f"played {run_dir / 'checkpoint'}, the latest" in latest.stdout
    )
    import xarray as xr

    assert xr.load_dataset(run_dir / "best.nc").attrs["checkpoint"] == "checkpoint_best"
    assert xr.load_dataset(run_dir / "latest.nc").attrs["checkpoint"] == "checkpoint"


def test_a_best_checkpoint_asked_for_and_missing_names_the_setting(run_dir):
    from tianji_dask.config import ConfigError
    from tianji_dask.results.evaluation import evaluate

    with pytest.raises(
        ConfigError, match=r"no checkpoint directory at .*checkpoint_best.*run.eval_every_env_steps > 0"
    ):
        evaluate(run_dir, which="best")
    with pytest.raises(ConfigError, match="which='newest': one of latest, best"):
        evaluate(run_dir, which="newest")


@pytest.mark.parametrize(
    ("change", "args", "said"),
    [
        ("nothing", ["--episodes", "0"], "episodes=0: play at least one"),
        ("nothing", ["--epsilon", "1.5"], "epsilon=1.5: a probability"),
        ("no_dir", [], "no such directory"),
        ("a_file", [], "a file, not a run directory; give the directory a run wrote (runs/"),
        ("a_file_of_the_run", [], "a file, not a directory; give the run directory it is in, "),
        ("no_config", [], "not a run directory (no config.yaml)"),
        ("no_checkpoint", [], "no checkpoint directory at"),
        ("other_run", [], "its checkpoint is of dqn on CartPole-v1, the config of ppo on CartPole-v1"),
    ],
)
def test_bad_input_is_refused_naming_the_fix(run_dir, change, args, said):
    target = run_dir
    if change == "no_dir":
        target = run_dir / "missing"
    elif change == "a_file":
        target = run_dir.parent / "README.md"
        target.write_text("# not a run\n")
    elif change == "a_file_of_the_run":
        target = run_dir / "config.yaml"
        said += str(run_dir)
    elif change == "no_config":
        (run_dir / "config.yaml").unlink()
    elif change == "no_checkpoint":
        shutil.rmtree(run_dir / "checkpoint")
    elif change == "other_run":
        shutil.copy("configs/cartpole_ppo.yaml", run_dir / "config.yaml")
    r = cli_here("eval", target, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert said in r.stderr and not (run_dir / "eval.nc").exists()


def test_ppo_takes_its_most_likely_action():
    policy = PPOPolicy(4, 3, [16], seed=0)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    with torch.no_grad():
        logits, _ = policy.net.heads(torch.from_numpy(obs))
    np.testing.assert_array_equal(policy.most_likely(obs), logits.argmax(dim=-1).numpy())


def test_a_gaussian_policy_takes_its_clipped_mean():
    low, high = np.array([-0.1], np.float32), np.array([0.1], np.float32)
    policy = GaussianPolicy(3, low, high, [16], seed=0, gamma=0.99, num_envs=8)
    obs = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32) * 10
    first, second = policy.most_likely(obs), policy.most_likely(obs)
    np.testing.assert_array_equal(first, second)
    with torch.no_grad():
        mean, _, _ = policy.net.policy(torch.from_numpy(policy.normalize(obs)))
    np.testing.assert_array_equal(first, np.clip(mean.numpy(), low, high))


def test_the_video_has_one_frame_per_step_of_its_episode(run_dir, tmp_path):
    import gymnasium as gym
    import imageio.v2 as imageio
    import xarray as xr

    from tianji_dask.algos.dqn.core import DQNPolicy
    from tianji_dask.results.checkpoint import load_checkpoint

    video = tmp_path / "episode.mp4"
    r = cli_here("eval", run_dir, "--episodes", "2", "--epsilon", "0", "--seed", "5", "--video", video)
    assert r.returncode == 0, r.stderr
    # the same greedy policy on the same seed, stepped here: its episode's steps
    policy = DQNPolicy(4, 2, [64, 64], seed=0)
    policy.load(0, load_checkpoint(run_dir / "checkpoint")[0]["online"])
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=5)
    steps, ended = 0, False
    while not ended:
        obs, _, terminated, truncated, _ = env.step(int(policy.act(obs[None].astype(np.float32), 0.0)[0]))
        steps, ended = steps + 1, terminated or truncated
    with imageio.get_reader(video) as reader:
        frames = reader.count_frames()
    assert frames == steps, (frames, steps)
    assert f"video: {steps} frames" in r.stdout
    assert xr.load_dataset(run_dir / "eval.nc").attrs["video_frames"] == steps


@pytest.mark.parametrize(
    ("video", "hidden", "said"),
    [
        ("episode.gif", None, "name an .mp4 file"),
        ("episode.mp4", "pygame", "--video needs pygame, not installed: pip install 'tianji-dask[video]'"),
        ("episode.mp4", "imageio_ffmpeg", "--video needs imageio_ffmpeg"),
    ],
)
def test_a_video_that_cannot_be_made_is_refused_before_anything_plays(
    run_dir, tmp_path, monkeypatch, video, hidden, said
):
    import sys

    if hidden:
        monkeypatch.setitem(sys.modules, hidden, None)  # as if not installed
    r = cli_here("eval", run_dir, "--video", tmp_path / video)
    assert r.returncode == 2 and said in r.stderr, r.stderr
    assert not (run_dir / "eval.nc").exists() and not (tmp_path / video).exists()


# ---------------------------------------------------------------- trained runs
def _trained(root, config: str, *overrides: str):
    from tianji_dask.config import load_config
    from tianji_dask.runtime.driver import train

    cfg = load_config(config, ["stop.target_return=null", "run.metrics_interval=0.2", *overrides])
    result = train(cfg, serial=True, out=root / cfg.algo.name / cfg.env.id).wait(timeout=240)
    assert result.ok, result.error
    return result.run_dir


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Short serial runs, trained: CartPole DQN and PPO, Pendulum PPO (a Gaussian policy with gSDE)."""
    root = tmp_path_factory.mktemp("trained")
    return {
        "dqn": _trained(root, "configs/cartpole_dqn.yaml", "stop.max_env_steps=4000"),
        "ppo": _trained(root, "configs/cartpole_ppo.yaml", "stop.max_env_steps=4096"),
        "gaussian": _trained(root, "configs/pendulum_ppo.yaml", "stop.max_env_steps=4096", "algo.epochs=2"),
    }


@pytest.fixture
def dqn_run(trained, tmp_path):
    """A copy of the trained DQN run, for a test that writes into it."""
    d = tmp_path / "run"
    shutil.copytree(trained["dqn"], d)
    return d


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_readme_sequence_eval_then_video_writes_both_into_the_run_without_warnings(dqn_run, tmp_path):
    """The README's eval, then eval --video (no path): eval.nc, then eval-2.nc with eval.mp4, all
    in the run directory, nothing where the commands ran, and nothing on stderr (no SDL display
    error, no imageio resize warning for CartPole's 600 x 400 screen: a process of its own, whose
    stderr is where logging's warnings go)."""
    import imageio.v2 as imageio
    import xarray as xr

    here = tmp_path / "elsewhere"
    here.mkdir()
    first = cli_here("eval", dqn_run, "--episodes", "4", cwd=here)
    assert first.returncode == 0, first.stderr
    video = cli("eval", str(dqn_run), "--episodes", "4", "--video", cwd=here, timeout=120)
    assert video.returncode == 0, video.stderr
    assert video.stderr == "", video.stderr
    assert f"in {dqn_run / 'eval.mp4'}" in video.stdout and f"wrote {dqn_run / 'eval-2.nc'}" in video.stdout
    attrs = xr.load_dataset(dqn_run / "eval-2.nc").attrs
    assert attrs["video"] == str(dqn_run / "eval.mp4")
    with imageio.get_reader(dqn_run / "eval.mp4") as reader:
        assert reader.count_frames() == attrs["video_frames"] > 0
        assert reader.get_data(0).shape == (400, 600, 3)  # not resized
    again = cli_here("eval", dqn_run, "--episodes", "1", "--video", "clip.mp4", cwd=here)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert (dqn_run / "clip.mp4").is_file() and (dqn_run / "eval-3.nc").is_file()
    assert list(here.iterdir()) == []


def _episodes(policy, env_id: str, seed: int, n: int) -> list[float]:
    """``n`` episodes of one gymnasium env seeded once, as an eval with one env plays them."""
    import gymnasium as gym

    env = gym.make(env_id)
    returns = []
    obs, _ = env.reset(seed=seed)
    for _ in range(n):
        total, ended = 0.0, False
        while not ended:
            obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
            total, ended = total + float(reward), terminated or truncated
        returns.append(total)
        obs, _ = env.reset()
    env.close()
    return returns


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_a_loaded_policy_plays_what_eval_plays(trained, tmp_path, algo):
    import tianji_dask
    from tianji_dask.results.evaluation import evaluate

    policy = tianji_dask.load_policy(trained[algo])
    assert policy.checkpoint == "checkpoint" and policy.env_steps > 0
    played = evaluate(trained[algo], episodes=3, envs=1, epsilon=0.0, seed=11, out=tmp_path / "eval.nc")
    assert _episodes(policy, "CartPole-v1", 11, 3) == list(played.returns)
    obs = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    actions = policy.act(obs)
    assert actions.shape == (256,) and set(np.unique(actions)) <= {0, 1}
    assert isinstance(policy.act(obs[0]), int) and policy.act(obs[0]) == actions[0]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_act_not_deterministic_draws_its_actions(trained):
    from tianji_dask.results.policy import load_policy

    obs = np.random.default_rng(0).normal(size=(512, 4)).astype(np.float32)
    always_random = load_policy(trained["dqn"], epsilon=1.0)
    greedy = always_random.act(obs)
    drawn = always_random.act(obs, deterministic=False)
    assert 0.3 < np.mean(drawn != greedy) < 0.7  # half of the random actions are the greedy one
    assert np.array_equal(load_policy(trained["dqn"], epsilon=0.0).act(obs, deterministic=False), greedy)
    ppo = load_policy(trained["ppo"], seed=3)
    most_likely, sampled = ppo.act(obs), ppo.act(obs, deterministic=False)
    assert np.array_equal(ppo.act(obs), most_likely) and not np.array_equal(sampled, most_likely)
    assert np.array_equal(load_policy(trained["ppo"], seed=3).act(obs, deterministic=False), sampled)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_gaussian_policy_acts_in_its_bounds(trained):
    from tianji_dask.results.policy import load_policy

    policy = load_policy(trained["gaussian"])
    obs = np.random.default_rng(0).uniform(-8, 8, size=(64, 3)).astype(np.float32)
    one = policy.act(obs[0])
    assert isinstance(one, np.ndarray) and one.dtype == np.float32 and one.shape == (1,)
    for deterministic in (True, False):
        actions = policy.act(obs, deterministic=deterministic)
        assert actions.shape == (64, 1) and actions.dtype == np.float32
        assert np.all(actions >= -2.0) and np.all(actions <= 2.0)
    assert np.array_equal(policy.act(obs), policy.act(obs))
    assert not np.array_equal(policy.act(obs, deterministic=False), policy.act(obs, deterministic=False))
    np.testing.assert_allclose(policy.act(obs[0]), policy.act(obs)[0], rtol=1e-6)  # batched float sums differ


def test_load_policy_refuses_what_is_not_a_run_naming_the_fix(run_dir, tmp_path):
    from tianji_dask.config import ConfigError
    from tianji_dask.results.policy import load_policy

    readme = tmp_path / "README.md"
    readme.write_text("# not a run\n")
    with pytest.raises(ConfigError, match="a file, not a run directory; give the directory a run wrote"):
        load_policy(readme)
    with pytest.raises(ConfigError, match="no checkpoint directory at .*checkpoint_best"):
        load_policy(run_dir, which="best")
    with pytest.raises(ValueError, match=r"obs of shape \(3,\): one observation of shape \(4,\)"):
        load_policy(run_dir).act(np.zeros(3))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_analysis_doc_plays_a_loaded_policy_as_pasted(trained, tmp_path, monkeypatch, capsys):
    """docs/analysis.md's load_policy block, where the run it names is the trained DQN run."""
    from conftest import ROOT, doc_python_block

    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "CartPole-v1__dqn__0__20260102-030405").symlink_to(trained["dqn"], target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    exec(doc_python_block(ROOT / "docs" / "analysis.md", "## Using a trained policy from Python"), {})
    said = capsys.readouterr().out
    assert re.fullmatch(r"return \d+ from checkpoint at [\d,]+ env steps\n", said), said
