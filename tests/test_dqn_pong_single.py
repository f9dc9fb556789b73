"""benchmarks/dqn_pong_single.py, the single-process DQN that tianji-dask's Pong DQN is raced
against: its replay's n-step returns on a hand-computed case, and a short real run on the CPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import script_module

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "dqn_pong_single.py"


def single():
    return script_module(SCRIPT)


def test_the_replay_returns_n_step_returns_that_stop_at_an_episode_end():
    replay = single().Replay(slots=8, envs=1, device="cpu")
    # rewards 1, 2, 3, 4, 5 at steps 0..4; the episode ends at step 2
    for t, (r, end) in enumerate([(1, 0), (2, 0), (3, 1), (4, 0), (5, 0)]):
        replay.add(
            torch.full((1, 4, 84, 84), t, dtype=torch.uint8),
            torch.tensor([t]),
            torch.tensor([float(r)]),
            torch.tensor([float(end)]),
        )
    gen = torch.Generator().manual_seed(0)
    obs, actions, ret, disc, nxt = replay.sample(64, 2, 0.5, gen)
    for o, a, g, d, n in zip(obs[:, 0, 0, 0], actions, ret, disc, nxt[:, 0, 0, 0]):
        t = int(a)
        assert int(o) == t and int(n) == t + 2 and t <= 2  # the 2 steps after t are stored
        want = {0: (1 + 0.5 * 2, 0.25), 1: (2 + 0.5 * 3, 0.0), 2: (3, 0.0)}[t]
        assert (float(g), float(d)) == pytest.approx(want)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_short_run_on_the_cpu_trains_and_reports_json():
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--envs", "2", "--threads", "1", "--buffer-size", "4000",
         "--learning-starts", "100", "--n-step", "3", "--max-env-steps", "140", "--max-seconds", "90",
         "--device", "cpu"],
        capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["env_steps"] == 140 and res["updates"] > 0 and res["seconds_to_target"] is None


def test_the_race_runs_the_single_script_with_the_configs_hyperparameters():
    """benchmarks/vs_single.py hands the single DQN script the tianji-dask config's
    hyperparameters and its actors' envs (every flag one the script takes), gives PPO its own
    peer, and refuses a config the script cannot follow, before any run."""
    import argparse

    vs_single = script_module(SCRIPT.with_name("vs_single.py"))
    args = argparse.Namespace(
        config="configs/pong_dqn.yaml",
        overrides=["algo.lr=0.0003", "topology.actors=3"],
        target=18.0,
        max_seconds=600.0,
        single_max_seconds=900.0,
        envs=None,
        threads=16,
    )
    cmd, envs, algo = vs_single.single_command(args)
    assert (Path(cmd[0]).name, envs, algo) == ("dqn_pong_single.py", 3 * 8, "dqn")
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    assert flags["--lr"] == "0.0003" and flags["--envs"] == "24" and flags["--max-seconds"] == "900.0"
    assert flags["--train-freq"] == "2" and flags["--n-step"] == "3" and flags["--buffer-size"] == "100000"
    assert flags["--batch-size"] == "64" and flags["--target-update-interval"] == "500"
    source = SCRIPT.read_text()
    assert all(f'add_argument("{f}"' in source for f in flags), "a flag the script does not take"
    shorter_rollouts = ["env.num_envs=128", "algo.rollout_steps=64"]
    ppo_args = {**vars(args), "config": "configs/pong_ppo.yaml", "overrides": shorter_rollouts}
    cmd, envs, algo = vs_single.single_command(argparse.Namespace(**ppo_args))
    assert (Path(cmd[0]).name, envs, algo) == ("ppo_pong_single.py", 128, "ppo")
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    assert flags["--envs"] == "128" and flags["--steps"] == "64" and flags["--minibatches"] == "32"
    assert flags["--anneal-steps"] == "10000000" and flags["--lr"] == "0.00025"
    ppo_source = SCRIPT.with_name("peers").joinpath("ppo_pong_single.py").read_text()
    assert all(f'add_argument("{f}"' in ppo_source for f in flags), "a flag the PPO script does not take"
    with pytest.raises(SystemExit, match="only uniform replay"):
        vs_single.single_command(argparse.Namespace(**{**vars(args), "config": "configs/pong_dqn_apex.yaml"}))
