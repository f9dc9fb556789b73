"""benchmarks/vs_single.py's continuation (``--continue``: one race over several device calls)
and the actor's share of the raw ALE rate, on races written as the script writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import script_module

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "vs_single.py"
vs_single = script_module(SCRIPT)

META = {
    "config": "configs/pong_ppo.yaml",
    "overrides": ["env.step_groups=2"],
    "target": 18.0,
    "max_seconds": 150.0,
    "single_max_seconds": 280.0,
}


def row(system: str, seed: int, **extra) -> dict:
    return {"system": system, "seed": seed, "time_to_target_s": 100.0, "env_steps_to_target": 1e6, **extra}


def race_in(out: Path, rows: list[dict], meta: dict | None = None) -> str:
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(
        {"meta": {**(meta or META), "raw_ale": [{"for": "config", "env_steps_per_s": 2.0}]}, "runs": rows}
    )
    (out / "vs_single.json").write_text(text)
    return text


def test_a_new_race_keeps_nothing(tmp_path):
    assert vs_single.continued(tmp_path / "race", META, [11, 12], go_on=True) == ([], [11, 12], [])


def test_a_race_is_not_written_over_without_continue(tmp_path):
    text = race_in(tmp_path, [row("tianji", 11), row("single", 11)])
    with pytest.raises(SystemExit, match="holds a race already: add --continue"):
        vs_single.continued(tmp_path, META, [12], go_on=False)
    assert (tmp_path / "vs_single.json").read_text() == text


def test_continue_keeps_whole_seeds_and_runs_the_rest(tmp_path):
    runs = [
        row("tianji", 11),
        row("single", 11),
        row("single", 12),
        {"system": "tianji", "seed": 12, "error": "exit 1"},
    ]
    race_in(tmp_path, runs)
    rows, todo, raw = vs_single.continued(tmp_path, META, [11, 12, 13], go_on=True)
    assert [(r["system"], r["seed"]) for r in rows] == [("tianji", 11), ("single", 11)]
    assert todo == [12, 13]  # seed 12's tianji run failed: both of its runs again
    assert raw == [{"for": "config", "env_steps_per_s": 2.0}]


@pytest.mark.parametrize(
    "changed, said",
    [
        ({"overrides": []}, "overrides \\['env.step_groups=2'\\] there, \\[\\] now"),
        ({"target": 19.0}, "target 18.0 there"),
    ],
)
def test_continue_refuses_another_race(tmp_path, changed, said):
    race_in(tmp_path, [row("tianji", 11), row("single", 11)])
    with pytest.raises(SystemExit, match=f"is another one \\({said}"):
        vs_single.continued(tmp_path, {**META, **changed}, [12], go_on=True)


def test_continue_refuses_a_file_that_is_no_race(tmp_path):
    (tmp_path / "vs_single.json").write_text("{not json")
    with pytest.raises(SystemExit, match="is not a race's result"):
        vs_single.continued(tmp_path, META, [12], go_on=True)


def test_the_order_goes_on_alternating_and_every_run_is_saved():
    calls, saved = [], []

    def run(system, seed):
        calls.append((system, seed))
        return row(system, seed)

    kept = [row("tianji", 11), row("single", 11)]
    vs_single.alternate([12, 13], vs_single.SYSTEMS, run, lambda rows: saved.append(len(rows)) or {}, kept)
    assert calls == [("single", 12), ("tianji", 12), ("tianji", 13), ("single", 13)]
    assert saved == [3, 4, 5, 6]


def test_actor_share_is_the_median_in_run_rate_over_the_raw_rate():
    rows = [row("tianji", s, median_env_fps=f) for s, f in ((1, 8.0), (2, 9.0), (3, 30.0))] + [row("single", 1)]
    assert vs_single.actor_share(rows, 10.0) == pytest.approx(0.9)
    assert vs_single.actor_share([row("single", 1)], 10.0) != vs_single.actor_share([row("single", 1)], 10.0)  # NaN


@pytest.mark.parametrize(
    "overrides, envs",
    [
        ([], 64),
        (["topology.actors=2", "algo.rollouts_per_update=2", "env.num_envs=64", "algo.rollout_steps=64"], 128),
    ],
)
def test_the_single_ppo_steps_the_envs_of_one_learner_iteration(overrides, envs):
    """Two actors of 64 envs, a learner iteration taking one rollout of each: the single process
    steps 128 envs, so its update holds as many transitions as tianji-dask's."""
    from argparse import Namespace

    args = Namespace(
        config="configs/pong_ppo.yaml",
        overrides=overrides,
        envs=None,
        threads=16,
        target=18.0,
        max_seconds=150.0,
        single_max_seconds=None,
    )
    cmd, n, algo = vs_single.single_command(args)
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    steps = 64 if overrides else 128
    assert (algo, n, flags["--envs"], flags["--steps"]) == ("ppo", envs, str(envs), str(steps))


def test_a_runs_rates_are_read_from_its_metrics_once_the_learner_has_updated():
    """The rates a race reports of a tianji-dask run, read from a committed run's metrics
    (the H100 race's seed 13 of 2026-11-28)."""
    import xarray as xr

    metrics = SCRIPT.parents[1] / "tests/data/pong_runs/ppo_h100_seed13/metrics.nc"
    with xr.open_dataset(metrics) as ds:
        rates = vs_single.in_run_rates(ds)
    assert rates["median_env_fps"] == pytest.approx(12_859, abs=1)
    assert rates["median_train_fps_in_updates"] == pytest.approx(43_178, abs=1)
    assert rates["median_train_busy"] == pytest.approx(0.35, abs=0.005)
    assert rates["median_policy_lag_mean"] == 1.0
    assert rates["median_stale_dropped"] == 8192
