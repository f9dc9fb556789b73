"""``tianji-dask train --resume RUN_DIR``: a run stopped by SIGTERM goes on in its own directory
(learner from its checkpoint, curve and episodes extended), and every bad input is refused with
exit 2 and nothing in the directory changed. Real CLI processes on a real LocalCluster; the
recorder's continuation also on hand-made heartbeats."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from tianji_dask.config import ConfigError
from tianji_dask.results.recorder import MetricsRecorder

T0 = 1_700_000_000.0
TRAINING = re.compile(r"return\(100\) -?\d.*updates [1-9]")  # episodes finished and updates made


def _recorder(t0: float) -> MetricsRecorder:
    return MetricsRecorder(run_name="r", target_return=None, config_json='{"topology": {"actors": 1}}', t0=t0)


def _actor(t0, t, steps, episodes=()):
    return {
        "role": "actor",
        "id": 0,
        "t": t0 + t,
        "counters": {"env_steps": steps},
        "episodes": [[r, 10, t0 + t] for r in episodes],
    }


def _learner(t0, t, updates):
    return {"role": "learner", "id": 0, "t": t0 + t, "counters": {"updates": updates, "samples": updates * 32}}


def test_a_continued_recorder_carries_time_counters_and_episodes_on():
    first = _recorder(T0)
    first.add(_actor(T0, 0.0, 0))
    first.add(_learner(T0, 0.0, 0))
    first.row(0.5)
    first.add(_actor(T0, 1.0, 400, episodes=[1.0, 2.0]))
    first.add(_learner(T0, 1.0, 30))
    first.row(1.5)
    metrics, episodes = first.dataset(), first.episodes_dataset()

    t1 = T0 + 1000  # the continuation starts later: its clock begins again at 0
    second = _recorder(t1)
    second.continue_from(metrics, episodes)
    assert second.tally.env_steps == 400 and second.tally.time_offset == 1.5
    second.row(0.1)  # before any heartbeat: the previous counts, not zeros
    second.add(_actor(t1, 0.2, 0))
    second.add(_learner(t1, 0.2, 0))
    second.add(_actor(t1, 1.2, 100, episodes=[3.0]))
    second.add(_learner(t1, 1.2, 5))
    row = second.row(1.3)
    assert row["time"] == pytest.approx(2.8)
    assert row["env_steps"] == 500 and row["updates"] == 35
    assert row["env_fps"] == pytest.approx(100.0)  # a rate, not the carried count
    assert row["return_mean_100"] == pytest.approx(2.0)  # the window holds the earlier episodes

    ds, eps = second.dataset(), second.episodes_dataset()
    np.testing.assert_allclose(ds.time.values, [0.5, 1.5, 1.6, 2.8])
    np.testing.assert_array_equal(ds.env_steps.values, [0, 400, 400, 500])
    np.testing.assert_array_equal(ds.updates.values, [0, 30, 30, 35])
    # per actor: NaN in the row before the new actor reported, as before any first heartbeat
    np.testing.assert_allclose(ds.actor_env_steps.values[:, 0], [0, 400, np.nan, 500])
    assert ds.env_steps.dtype == np.int64 and ds.updates.dtype == np.int64
    np.testing.assert_array_equal(eps["return"].values, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(eps.wall_time.values, [1.0, 1.0, 2.7])  # 1.2 s after the restart + 1.5
    np.testing.assert_array_equal(eps.env_steps.values, [400, 400, 500])
    assert json.loads(ds.attrs["continued_at_s"]) == [1.5]


def test_files_written_before_restored_replay_existed_are_continued_with_zeros_for_it():
    first = _recorder(T0)
    first.add(_actor(T0, 0.0, 0))
    first.record_losses(lost_replay=7)
    first.row(0.5)
    metrics = first.dataset().drop_vars("restored_replay")  # as an older version wrote them
    second = _recorder(T0 + 100)
    second.continue_from(metrics, first.episodes_dataset())
    second.record_losses(restored_replay=40)
    second.row(0.2)
    ds = second.dataset()
    np.testing.assert_array_equal(ds.restored_replay.values, [0, 40])
    np.testing.assert_array_equal(ds.lost_replay.values, [7, 7])
    assert ds.restored_replay.dtype == np.int64 and ds.restored_replay.attrs["units"] == "1"
    assert "transitions put back" in ds.restored_replay.attrs["long_name"]


def _snapshot(path: Path) -> dict[str, str]:
    """Every file below ``path`` with its contents' hash and mtime: what 'nothing changed' means."""
    if not path.exists():
        return {}
    return {
        str(p.relative_to(path)): f"{hashlib.sha256(p.read_bytes()).hexdigest()} {p.stat().st_mtime_ns}"
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, h) -> Path:
    """A short CartPole DQN run that ended by itself (max_env_steps), with its checkpoint."""
    out = tmp_path_factory.mktemp("finished") / "run"
    p = h.cli_here("train", h.CONFIG, *_sets(*h.SHORT, "stop.max_env_steps=1500"), "--out", out, cwd=out.parent)
    assert p.returncode == 0, p.stderr
    return out


def _sets(*overrides: str) -> list[str]:
    return [a for s in overrides for a in ("--set", s)]


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "case, message",
    [
        ("no directory", "no such directory"),
        ("empty directory", "not a run directory (no config.yaml)"),
        ("experiment override", "--set algo.lr=0.1 changes the experiment"),
        ("another config", "is not the config of this run (algo.name: run 'dqn', file 'ppo')"),
        ("no checkpoint", "no checkpoint directory at"),
        ("no metrics", "metrics.nc is missing"),
        ("with --out", "drop --out"),
    ],
)
def test_resume_refuses_bad_input_with_exit_2_and_changes_nothing(h, finished_run, tmp_path, case, message):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    args = ["train", "--resume", str(run_dir)]
    if case == "no directory":
        run_dir = tmp_path / "nothing-here"
        args = ["train", "--resume", str(run_dir)]
    elif case == "empty directory":
        run_dir = tmp_path / "empty"
        run_dir.mkdir()
        args = ["train", "--resume", str(run_dir)]
    elif case == "experiment override":
        args += ["--set", "algo.lr=0.1"]
    elif case == "another config":
        args = ["train", str(h.ROOT / "configs" / "cartpole_ppo.yaml"), "--resume", str(run_dir)]
    elif case == "no checkpoint":
        shutil.rmtree(run_dir / "checkpoint")
    elif case == "no metrics":
        (run_dir / "metrics.nc").unlink()
    elif case == "with --out":
        args += ["--out", str(tmp_path / "elsewhere")]
    before = _snapshot(run_dir)
    p = h.cli_here(*args)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert message in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert _snapshot(run_dir) == before
    assert not (tmp_path / "elsewhere").exists()


class _Cli:
    """``tianji-dask train`` in a session of its own, its stderr lines collected."""

    def __init__(self, h, cwd: Path, *args: str):
        self.proc = h.cli_in_background([sys.executable, "-m", "tianji_dask.cli", *args], cwd)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True).start()

    def wait_for(self, pattern: re.Pattern, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if any(pattern.search(line) for line in list(self.lines)):
                return
            time.sleep(0.1)
        pytest.fail(f"no line matching {pattern.pattern!r} (exit {self.proc.poll()}):\n{''.join(self.lines)}")

    def finish(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise


def _files(run_dir: Path):
    from tianji_dask.results.checkpoint import load_checkpoint

    with (
        xr.open_dataset(run_dir / "metrics.nc", engine="netcdf4") as m,
        xr.open_dataset(run_dir / "episodes.nc", engine="netcdf4") as e,
    ):
        return m.load(), e.load(), load_checkpoint(run_dir / "checkpoint")[1]


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_run_stopped_by_sigterm_goes_on_with_resume_in_its_own_directory(h, tmp_path):
    run_dir = tmp_path / "run"
    sets = _sets("stop.max_seconds=200", *h.SHORT)
    first = _Cli(h, tmp_path, "train", str(h.CONFIG), *sets, "--out", str(run_dir))
    first.wait_for(TRAINING, timeout=90)
    os.killpg(first.proc.pid, signal.SIGTERM)  # a batch system's cancel
    assert first.finish(timeout=60) == 128 + signal.SIGTERM, "".join(first.lines)
    metrics0, episodes0, meta0 = _files(run_dir)
    assert metrics0.attrs["status"] == "stopped" and meta0["updates"] > 0 and episodes0.sizes["episode"] > 0

    target = int(metrics0.env_steps[-1]) + 3000
    # the resumed run is called in this process: its process's behaviour is the first run's
    second = h.cli_here("train", "--resume", run_dir, *_sets(f"stop.max_env_steps={target}"), cwd=tmp_path)
    assert second.returncode == 0 and "continuing" in second.stderr, second.stderr
    metrics, episodes, meta = _files(run_dir)

    assert metrics.attrs["status"] == "max_env_steps", metrics.attrs["error"]
    n0, k0 = metrics0.sizes["time"], episodes0.sizes["episode"]
    # the earlier curve and episodes are kept as they were, the new ones follow
    xr.testing.assert_equal(
        metrics[["env_steps", "updates"]].isel(time=slice(0, n0)), metrics0[["env_steps", "updates"]]
    )
    xr.testing.assert_equal(episodes.isel(episode=slice(0, k0)).drop_vars("episode"), episodes0.drop_vars("episode"))
    assert np.all(np.diff(metrics.time.values) > 0)  # one continuous time axis
    assert np.all(np.diff(metrics.env_steps.values) >= 0) and int(metrics.env_steps[-1]) >= target
    assert np.all(np.diff(metrics.updates.values) >= 0)
    assert episodes.sizes["episode"] > k0
    new = episodes.isel(episode=slice(k0, None))
    assert float(new.wall_time.min()) >= float(metrics0.time[-1])
    assert int(new.env_steps.min()) >= int(episodes0.env_steps.max())
    assert json.loads(metrics.attrs["continued_at_s"]) == [float(metrics0.time[-1])]
    # the learner went on from its checkpoint, not from scratch
    assert meta["updates"] > meta0["updates"] and meta["env_steps"] >= target
    assert f"max_env_steps: {target}" in (run_dir / "config.yaml").read_text()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_notebook_api_resumes_a_run_on_a_cluster_of_the_users(h, finished_run, tmp_path):
    from distributed import Client

    import tianji_dask

    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    metrics0, episodes0, meta0 = _files(run_dir)
    target = int(metrics0.env_steps[-1]) + 1500
    with (
        h.forked_local_cluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        with pytest.raises(ConfigError, match="changes the experiment"):
            tianji_dask.resume(run_dir, client, overrides={"algo.lr": 0.1}, display=False)
        with pytest.raises(ConfigError, match=r"already reached stop.max_env_steps=1500 \("):
            tianji_dask.resume(run_dir, client, display=False)  # nothing new to run for
        run = tianji_dask.resume(run_dir, client, overrides={"stop.max_env_steps": target}, display=False)
        result = run.wait(timeout=150)
        assert result is not None and result.status == "max_env_steps", result
        assert len(cluster.workers) == 2  # the user's cluster stays
    metrics, episodes, meta = _files(run_dir)
    assert int(metrics.env_steps[-1]) >= target and meta["updates"] > meta0["updates"]
    assert episodes.sizes["episode"] > episodes0.sizes["episode"]
    assert np.all(np.diff(metrics.time.values) > 0)


def _run_files(returns: list[float], evaluations: list[float]):
    """metrics.nc and episodes.nc of a hand-made run of 20 rows, one a second: ``returns`` in 20
    equal parts, one part a row, each episode 10 env steps; an evaluation a second."""
    rec = _recorder(T0)
    part = len(returns) // 20
    for i in range(20):
        rec.add(_actor(T0, i + 0.5, 10 * part * (i + 1), episodes=returns[i * part : (i + 1) * part]))
        rec.add(_learner(T0, i + 0.5, 10 * i))
        rec.row(i + 1.0)
    for i, mean in enumerate(evaluations):
        rec.record_evaluation(mean=mean, std=0.0, env_steps=100 * (i + 1), t_rel=float(i + 1))
    return rec.dataset(), rec.episodes_dataset()


@pytest.mark.parametrize(
    "overrides, reached",
    [
        # 100 episodes of 20 then 100 of 0: the mean of 100 met 15 at the 100th episode (1000 env
        # steps) and fell under it after; the run reached it all the same
        (["stop.target_return=15"], ["stop.target_return=15 (return(100) 20.0 at 1,000 env steps)"]),
        (["stop.target_return=20.5"], []),
        (["stop.max_env_steps=2000"], ["stop.max_env_steps=2000 (2,000 env steps)"]),
        (["stop.max_env_steps=2001"], []),
        (["stop.max_seconds=20"], ["stop.max_seconds=20 (20.0 s"]),  # the last row's time
        (["stop.max_seconds=20.5"], []),
        (
            ["stop.target_eval_return=40", "run.eval_every_env_steps=100"],
            ["stop.target_eval_return=40 (an evaluation's mean return 45.0 at 200 env steps)"],
        ),
        (["stop.target_eval_return=60", "run.eval_every_env_steps=100"], []),
        (
            ["stop.target_return=15", "stop.max_env_steps=2000"],
            ["stop.target_return=15 (return(100) 20.0", "stop.max_env_steps=2000 (2,000"],
        ),
    ],
)
def test_the_stop_rules_a_run_already_met_are_found_in_its_files(h, overrides, reached):
    from tianji_dask.config import load_config
    from tianji_dask.results.resumable import stop_rules_reached

    metrics, episodes = _run_files([20.0] * 100 + [0.0] * 100, [10.0, 45.0, 50.0, 5.0])
    nulls = ["stop.target_return=null", "stop.max_env_steps=null", "stop.max_seconds=null"]
    cfg = load_config(h.CONFIG, [*nulls, *overrides])
    found = stop_rules_reached(cfg, metrics, episodes)
    assert len(found) == len(reached), found
    for (what, fix), expected in zip(found, reached, strict=True):
        assert what.startswith(expected), (what, expected)
        assert fix.startswith("--set " + expected.split("=")[0] + "="), fix


@pytest.fixture(scope="module")
def finished_ppo_run(tmp_path_factory, h) -> Path:
    """A short CartPole PPO run that ended by itself (max_env_steps), with its checkpoint."""
    out = tmp_path_factory.mktemp("finished-ppo") / "run"
    config = h.ROOT / "configs" / "cartpole_ppo.yaml"
    p = h.cli_here("train", config, *_sets("stop.target_return=null", "stop.max_env_steps=2000"), "--out", out)
    assert p.returncode == 0, p.stderr
    return out


def _resumed_twice(h, out: Path, config: Path, *overrides: str) -> Path:
    """A run of ``config`` that ended by max_env_steps, then went on twice to a larger budget."""
    p = h.cli_here("train", config, *_sets(*overrides, "stop.max_env_steps=1500"), "--out", out, cwd=out.parent)
    assert p.returncode == 0, p.stderr
    for more in (3000, 3000):
        steps = int(_files(out)[0].env_steps[-1])
        p = h.cli_here("train", "--resume", out, *_sets(f"stop.max_env_steps={steps + more}"), cwd=out.parent)
        assert p.returncode == 0 and "continuing" in p.stderr, p.stderr
    return out


@pytest.fixture(scope="module")
def dqn_resumed_twice(tmp_path_factory, h) -> Path:
    return _resumed_twice(h, tmp_path_factory.mktemp("dqn-twice") / "run", h.CONFIG, *h.SHORT)


@pytest.fixture(scope="module")
def ppo_resumed_twice(tmp_path_factory, h) -> Path:
    config = h.ROOT / "configs" / "cartpole_ppo.yaml"
    return _resumed_twice(h, tmp_path_factory.mktemp("ppo-twice") / "run", config, "stop.target_return=null")


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "run, overrides, message",
    [
        ("dqn", [], "the run already reached stop.max_env_steps=1500 ("),
        (
            "dqn resumed twice",
            ["stop.max_env_steps=null", "stop.target_return=10"],
            "the run already reached stop.target_return=10 (return(100) ",
        ),
        (
            "dqn",
            ["stop.max_env_steps=null", "stop.max_seconds=1"],
            "the run already reached stop.max_seconds=1 (",
        ),
        ("ppo", [], "the run already reached stop.max_env_steps=2000 ("),
        ("dqn resumed twice", [], "the run already reached stop.max_env_steps="),
        ("ppo resumed twice", [], "the run already reached stop.max_env_steps="),
    ],
)
def test_resume_of_a_run_that_met_its_stop_rule_exits_2_and_changes_nothing(h, request, run, overrides, message):
    fixture = {
        "dqn": "finished_run",
        "ppo": "finished_ppo_run",
        "dqn resumed twice": "dqn_resumed_twice",
        "ppo resumed twice": "ppo_resumed_twice",
    }[run]
    run_dir = request.getfixturevalue(fixture)
    before = _snapshot(run_dir)
    p = h.cli_here("train", "--resume", run_dir, *_sets(*overrides))
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert message in p.stderr and "to continue it: --set stop." in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "continuing" not in p.stderr, p.stderr
    assert _snapshot(run_dir) == before


def _samples_per_update(cfg) -> float:
    """Samples trained on per update: DQN's batch; PPO's batch of rollouts over its epochs x minibatches."""
    a = cfg.algo
    if a.name == "dqn":
        return a.batch_size
    return a.rollouts_per_update * a.rollout_steps * cfg.env.num_envs / (a.epochs * a.minibatches)


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fixture", ["dqn_resumed_twice", "ppo_resumed_twice"])
def test_a_run_resumed_twice_keeps_the_whole_runs_counts_in_its_checkpoint(h, request, fixture):
    from tianji_dask.config import load_config

    run_dir = request.getfixturevalue(fixture)
    metrics, _, meta = _files(run_dir)
    cfg = load_config(run_dir / "config.yaml")
    assert len(json.loads(metrics.attrs["continued_at_s"])) == 2
    assert meta["updates"] == int(metrics.updates[-1]) > 0
    assert meta["samples"] == int(metrics.samples[-1]) == meta["updates"] * _samples_per_update(cfg)
    assert meta["env_steps"] == int(metrics.env_steps[-1])
    assert meta["wall_s"] >= float(metrics.time[-1])
    # the run keeps the name it was given when it began (its directory is called otherwise)
    assert meta["run_name"] == metrics.attrs["run_name"] != run_dir.name
    assert meta["run_name"].startswith(f"CartPole-v1__{cfg.algo.name}__")


def _trained_serially(cfg, updates: int, restore=None):
    """The learner role of a serial run of ``cfg`` (restored from ``restore`` first, if given)
    after it made ``updates`` updates of its own."""
    from tianji_dask.runtime.serial import SerialRun

    run = SerialRun(cfg)
    if restore is not None:
        run.learner.restore(restore)
    run.run(lambda heartbeat: None, lambda: run.learner.counters.updates >= updates)
    return run.learner


@pytest.mark.timeout(120)
@pytest.mark.parametrize("config", ["cartpole_dqn.yaml", "cartpole_ppo.yaml"])
def test_a_restored_learner_counts_the_samples_of_the_state_it_came_from(h, config):
    from tianji_dask.config import load_config

    cfg = load_config(h.ROOT / "configs" / config, ["algo.learning_starts=200"] if "dqn" in config else [])
    first = _trained_serially(cfg, 20)
    second = _trained_serially(cfg, 20, restore=first.state())
    made = second.counters.samples  # the heartbeat's count: this role's own, which the recorder adds up
    assert made > 0 and second.heartbeat().counters.samples == made
    meta = second.checkpoint_meta()
    assert meta["samples"] == first.samples + made == meta["updates"] * _samples_per_update(cfg)
    assert second.state()["counters"]["samples"].item() == meta["samples"]
    # a checkpoint written before the state held the count: the samples since the restore
    older = {k: v for k, v in first.state().items() if k != "counters"}
    third = _trained_serially(cfg, 20, restore=older)
    assert third.checkpoint_meta()["samples"] == third.counters.samples > 0
