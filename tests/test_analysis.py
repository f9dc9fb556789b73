"""tianji_dask.results.analysis on real run directories: open one run, stack several on ``run``, time to
target, the summary table, every plot rendered to PNG, and the errors for bad paths.

Three short CartPole runs are made once for the module: serial with seeds 0 and 1, and
distributed with seed 0 and two actors. They differ in ``seed``, ``topology.actors`` and the
``mode`` attr, and have a low target (so most reach it and stop early, at different lengths)
or stop after 20,000 env steps. Three more serial runs, short, end each in its own way (finished,
stopped, failed) for the status coordinates.
"""

from __future__ import annotations

import math
import re

import gymnasium
import matplotlib
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from conftest import CONFIG, ROOT, doc_python_block
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from tianji_dask.config import load_config
from tianji_dask.results.analysis import RENAMED, RunNotFound, open_run, open_runs
from tianji_dask.results.recorder import MetricsRecorder
from tianji_dask.results.rundir import write_config
from tianji_dask.roles.heartbeats import ActorCounters, BufferCounters, Heartbeat, LearnerCounters
from tianji_dask.runtime.driver import train

matplotlib.use("Agg")
import matplotlib.pyplot as plt

integration = pytest.mark.integration
TARGET = 60.0
STEPS = 20_000
RUNS = {  # directory name -> (overrides, serial)
    "serial-seed0": (["seed=0"], True),
    "serial-seed1": (["seed=1"], True),
    "dist-seed0-actors2": (["seed=0", "topology.actors=2"], False),
}


@pytest.fixture(scope="module")
def runs(h, tmp_path_factory):
    """``{name: (run_dir, config)}`` of three finished runs under one parent directory."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, (extra, serial) in RUNS.items():
        # stopped by env steps, not seconds: a slow cluster start must not shorten the run; rows
        # every 0.1 s: a quiet machine reaches the target within a 0.5-s row of the first update
        cfg = load_config(
            h.CONFIG,
            [
                *h.SHORT,
                f"stop.target_return={TARGET}",
                f"stop.max_env_steps={STEPS}",
                "stop.max_seconds=60",
                "run.metrics_interval=0.1",
                *extra,
            ],
        )
        result = train(cfg, out=root / name, serial=serial).wait(timeout=90)
        assert result is not None and result.error is None, result and result.error
        assert result.status in ("target_reached", "max_env_steps"), result.status
        assert open_run(result.run_dir).sizes["time"] >= 2, "too short a run to analyse"
        print(
            f"\n{name}: {result.status}, {result.env_steps} env steps in {result.wall_s:.1f} s, "
            f"time to target {result.time_to_target_s:.1f} s"
        )
        out[name] = (result.run_dir, cfg)
    return out


class BreakingCartPole(CartPoleEnv):
    """CartPole that raises after ``BREAK_AFTER`` steps, as a user's buggy env would."""

    BREAK_AFTER = 300

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps > self.BREAK_AFTER:
            raise RuntimeError(f"BreakingCartPole broke after {self.BREAK_AFTER} steps")
        return super().step(action)


gymnasium.register("BreakingCartPole-v0", entry_point=BreakingCartPole, max_episode_steps=500)


@pytest.fixture(scope="module")
def ended_runs(h, tmp_path_factory):
    """``{status: run_dir}`` of three short serial runs: one that ran its env steps, one stopped
    by ``Run.stop()`` and one whose env raised."""
    root = tmp_path_factory.mktemp("ended")
    short = [*h.SHORT, "stop.max_seconds=60"]
    finished = train(load_config(h.CONFIG, [*short, "stop.max_env_steps=1500"]), out=root / "finished", serial=True)
    stopped = train(load_config(h.CONFIG, short), out=root / "stopped", serial=True)
    assert h.wait_until(lambda: stopped.recorder.tally.env_steps > 0, timeout=30), "no env steps recorded"
    stopped.stop()
    failed = train(load_config(h.CONFIG, [*short, "env.id=BreakingCartPole-v0"]), out=root / "failed", serial=True)
    results = [r.wait(timeout=60) for r in (finished, stopped, failed)]
    assert [r and r.status for r in results] == ["max_env_steps", "stopped", "failed"], results
    return {r.status: r.run_dir for r in results}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def png(path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(b"\x89PNG\r\n\x1a\n")


# ------------------------------------------------------------------------------ open_run
@integration
@pytest.mark.timeout(240)
def test_open_run_merges_metrics_episodes_and_config(runs):
    run_dir, cfg = runs["dist-seed0-actors2"]
    ds = open_run(run_dir)
    assert ds["time"].dims == ("time",) and "time" in ds.indexes
    assert ds.sizes["time"] >= 2 and ds.sizes["actor"] == 2 and ds.sizes["episode"] > 0
    assert ds["return_mean_100"].dims == ("time",) and ds["actor_env_fps"].dims == ("time", "actor")
    for var in ("return", "length", "actor", "wall_time", "env_steps"):
        assert ds[f"episode_{var}"].dims == ("episode",), var
    assert int(ds["episodes"][-1]) == ds.sizes["episode"]
    for var in [*ds.data_vars, *ds.coords]:  # labels for plots survive
        assert ds[var].attrs.get("long_name") and "units" in ds[var].attrs, var
    config = ds.tianji.config
    assert config["seed"] == 0 and config["topology.actors"] == 2 and config["env.id"] == "CartPole-v1"
    assert config["stop.target_return"] == TARGET and config["algo.hidden_sizes"] == [64, 64]
    assert ds.attrs["run_dir"] == str(run_dir) and ds.attrs["mode"] == "distributed"
    assert ds.attrs["run_name"].startswith("CartPole-v1__dqn__0__")


@integration
def test_a_run_written_before_the_renames_opens_under_the_current_names(h, runs):
    old = h.ROOT / "tests" / "data" / "pong_runs" / "pong_ppo_16core_gpu"  # a Pong run of an earlier tianji_dask
    with xr.open_dataset(old / "metrics.nc", engine="netcdf4") as raw:
        raw.load()
    assert set(RENAMED) <= set(raw.data_vars) and not set(RENAMED.values()) & set(raw.data_vars)
    ds = open_run(old)
    assert "buffer_size" in raw.data_vars and "replay_size" in ds.data_vars  # the fill, not the capacity
    assert not set(RENAMED) & set(ds.data_vars)
    for before, now in RENAMED.items():
        np.testing.assert_array_equal(ds[now].values, raw[before].values)
        assert ds[now].attrs["long_name"] == raw[before].attrs["long_name"]
    assert ds.attrs["status"] == "unknown"  # written before the outcome was recorded
    new_run = runs["dist-seed0-actors2"][0]
    both = open_runs([old, new_run])  # old and new runs side by side: one variable per quantity
    assert set(RENAMED.values()) <= set(both.data_vars) and not set(RENAMED) & set(both.data_vars)
    assert int(both["replay_size"].sel(run=new_run.name).count()) > 0


# ------------------------------------------------------------------------------ open_runs
@integration
@pytest.mark.timeout(240)
def test_open_runs_stacks_runs_with_differing_config_as_coords(runs):
    root = next(iter(runs.values()))[0].parent
    ds = open_runs(str(root / "*"))
    names = sorted(runs)
    assert ds.sizes["run"] == 3 and list(ds["run"].values) == names
    singles = {n: open_run(runs[n][0]) for n in names}
    assert ds.sizes["row"] == max(s.sizes["time"] for s in singles.values())
    assert ds.sizes["episode"] == max(s.sizes["episode"] for s in singles.values())
    assert ds.sizes["actor"] == 2  # outer join of the host ids: the serial runs have actor 0 only

    # what differs is a typed coordinate on run; what is equal stays in attrs
    assert list(ds["seed"].values) == [runs[n][1].seed for n in names] and ds["seed"].dtype == np.int64
    assert list(ds["topology.actors"].values) == [runs[n][1].topology.actors for n in names]
    assert list(ds["mode"].values) == ["distributed", "serial", "serial"]
    for c in ("seed", "topology.actors"):
        assert ds[c].dims == ("run",) and ds[c].attrs["long_name"] and ds[c].attrs["source"] == "config"
    for same in ("env.id", "algo.lr", "stop.target_return", "algo.hidden_sizes", "git_commit"):
        assert same not in ds.coords, same
    assert ds.tianji.config["env.id"] == "CartPole-v1" and "seed" not in ds.tianji.config
    assert set(ds.tianji.settings) == {"seed", "topology.actors", "mode"}
    assert ds.tianji.labels()[0] == "seed=0, topology.actors=2, mode=distributed"

    # each run's values are its own, NaN-padded after its last row / episode
    assert ds["time"].dims == ("run", "row")
    for name, single in singles.items():
        one = ds.sel(run=name)
        n, m = single.sizes["time"], single.sizes["episode"]
        np.testing.assert_array_equal(one["time"].values[:n], single["time"].values)
        np.testing.assert_array_equal(one["env_steps"].values[:n], single["env_steps"].values)
        assert np.isnan(one["time"].values[n:]).all()
        np.testing.assert_array_equal(one["episode_return"].values[:m], single["episode_return"].values)
        assert np.isnan(one["episode_return"].values[m:]).all()
        assert one["run_dir"].item() == single.attrs["run_dir"]
    assert np.isnan(ds.sel(run="serial-seed0")["actor_env_fps"].sel(actor=1)).all()

    # a list of paths gives the same Dataset as the glob, and it saves as netCDF
    assert ds.identical(open_runs([runs[n][0] for n in names]))


@integration
@pytest.mark.timeout(240)
def test_combined_dataset_saves_and_reopens(runs, tmp_path):
    import xarray as xr

    ds = open_runs([d for d, _ in runs.values()])
    ds.to_netcdf(tmp_path / "runs.nc", engine="netcdf4")
    back = xr.load_dataset(tmp_path / "runs.nc", engine="netcdf4")
    np.testing.assert_array_equal(back.tianji.time_to_target().values, ds.tianji.time_to_target().values)
    assert back.tianji.settings == ds.tianji.settings


# ------------------------------------------------------------------------------ status
@integration
@pytest.mark.timeout(120)
def test_open_runs_shows_how_each_run_ended(ended_runs):
    ds = open_runs(str(next(iter(ended_runs.values())).parent / "*"))
    assert list(ds["run"].values) == ["failed", "finished", "stopped"]
    assert list(ds["status"].values) == ["failed", "max_env_steps", "stopped"]
    assert ds["status"].dims == ds["error"].dims == ("run",)
    failed = ds.sel(run=ds.status == "failed")
    assert failed.sizes["run"] == 1
    error = str(failed["error"].item())
    assert "RuntimeError" in error and "BreakingCartPole broke after 300 steps" in error, error
    assert list(ds.sel(run=ds.status != "failed")["error"].values) == ["", ""]
    assert "status" not in ds.tianji.settings  # an outcome, not a setting that tells runs apart
    assert "status" not in ds.attrs and "error" not in ds.attrs
    one = open_run(ended_runs["failed"])
    assert one.attrs["status"] == "failed" and one.attrs["error"] == error


@integration
@pytest.mark.timeout(120)
def test_status_is_a_run_coordinate_also_where_all_runs_agree(ended_runs):
    ds = open_runs([ended_runs["stopped"]])
    assert list(ds["status"].values) == ["stopped"] and list(ds["error"].values) == [""]


@integration
@pytest.mark.timeout(120)
def test_runs_written_before_the_status_was_recorded_open_as_unknown(ended_runs, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    for name in ("config.yaml", "metrics.nc", "episodes.nc"):
        (old / name).write_bytes((ended_runs["max_env_steps"] / name).read_bytes())
    for name in ("metrics.nc", "episodes.nc"):
        ds = xr.load_dataset(old / name, engine="netcdf4")
        for attr in ("status", "error", "env_id", "seed"):
            del ds.attrs[attr]
        ds.to_netcdf(old / name, engine="netcdf4")
    assert open_run(old).attrs["status"] == "unknown" and open_run(old).attrs["error"] == ""
    ds = open_runs([old, ended_runs["failed"]])
    assert list(ds["status"].values) == ["unknown", "failed"]
    assert ds["error"].values[0] == "" and "BreakingCartPole" in ds["error"].values[1]
    assert "seed" not in ds.coords and "env_id" not in ds.coords  # the config coords stand for them


# ------------------------------------------------------------------------------ numbers
@integration
@pytest.mark.timeout(240)
def test_time_to_target_per_run_matches_the_recorder(runs):
    ds = open_runs([d for d, _ in runs.values()])
    ttt = ds.tianji.time_to_target()
    assert ttt.dims == ("run",) and ttt.attrs["units"] == "s" and ttt.attrs["long_name"]
    recorded = [open_run(d).attrs["time_to_target_s"] for d, _ in runs.values()]
    np.testing.assert_allclose(ttt.values, recorded, equal_nan=True)

    # any target: at 0 it is reached by the 100th episode (if there are 100), never at 1e9
    at_zero = ds.tianji.time_to_target(target=0.0)
    for name in ds["run"].values:
        one = ds.sel(run=name)
        n = int(one["episode_return"].notnull().sum())
        expected = float(one["episode_wall_time"][99]) if n >= 100 else math.nan
        np.testing.assert_allclose(float(at_zero.sel(run=name)), expected, equal_nan=True)
    assert ds.tianji.time_to_target(target=1e9).isnull().all()

    single = open_run(runs["serial-seed0"][0])
    one = single.tianji.time_to_target()
    assert one.ndim == 0
    np.testing.assert_allclose(float(one), single.attrs["time_to_target_s"], equal_nan=True)


@integration
@pytest.mark.timeout(240)
def test_summary_groups_runs_by_their_non_seed_settings(runs):
    ds = open_runs([d for d, _ in runs.values()])
    table = ds.tianji.summary()
    assert isinstance(table, pd.DataFrame)
    assert list(table.index.names) == ["topology.actors", "mode"]
    assert list(table.columns) == [
        "runs",
        "reached",
        "median_s",
        "q25_s",
        "q75_s",
        "min_s",
        "max_s",
        "final_return",
        "status",
    ]
    serial = table.loc[(1, "serial")]
    assert serial["runs"] == 2 and table["runs"].sum() == 3
    ttt = ds.tianji.time_to_target().sel(run=["serial-seed0", "serial-seed1"]).values
    assert serial["reached"] == np.isfinite(ttt).sum()
    np.testing.assert_allclose(
        serial["median_s"], np.nanmedian(ttt) if np.isfinite(ttt).any() else math.nan, equal_nan=True
    )
    # one run: a one-row table
    one = open_run(runs["serial-seed1"][0]).tianji.summary(target=0.0)
    assert len(one) == 1 and one["runs"].iloc[0] == 1


# ------------------------------------------------------------------------------ plots
@integration
@pytest.mark.timeout(240)
@pytest.mark.parametrize("multi", [False, True], ids=["one-run", "three-runs"])
@pytest.mark.parametrize(
    "plot, kwargs",
    [
        ("plot_return", {}),
        ("plot_return", {"x": "env_steps"}),
        ("plot_throughput", {}),
        ("plot_staleness", {}),
    ],
    ids=["return-time", "return-env-steps", "throughput", "staleness"],
)
def test_every_plot_renders_to_png(runs, tmp_path, multi, plot, kwargs):
    ds = open_runs([d for d, _ in runs.values()]) if multi else open_run(runs["dist-seed0-actors2"][0])
    ax = getattr(ds.tianji, plot)(**kwargs)
    fig = ax.figure
    fig.savefig(tmp_path / f"{plot}.png")
    assert png(tmp_path / f"{plot}.png")
    x = kwargs.get("x", "time")
    assert ax.get_xlabel() == {"time": "wall time since start [s]", "env_steps": "env steps (all actors) [1]"}[x]
    if plot == "plot_return":
        assert "mean return of the last 100" in ax.get_ylabel() and ax.get_ylabel().endswith("[1]")
    if plot == "plot_throughput":
        assert ax.get_ylabel() == "throughput [s-1]"
    lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    n_vars = 3 if plot == "plot_throughput" else 1
    if multi:
        assert len(ax.get_lines()) >= 3 * n_vars  # one line per run (and variable)
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any("0, 2, distributed" in t for t in legend), legend
    else:
        assert len(lines) >= n_vars


@integration
@pytest.mark.timeout(240)
def test_plot_into_a_given_axes(runs, tmp_path):
    ds = open_runs([d for d, _ in runs.values()])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    assert ds.tianji.plot_return(ax=axes[0]) is axes[0]
    assert ds.tianji.plot_throughput(ax=axes[1]) is axes[1]
    assert ds.tianji.plot_staleness(ax=axes[2]) is axes[2]
    fig.savefig(tmp_path / "all.png")
    assert png(tmp_path / "all.png")
    with pytest.raises(ValueError, match="x must be 'time' or 'env_steps'"):
        ds.tianji.plot_return(x="episode")


# ------------------------------------------------------------------------------ errors
def test_a_directory_without_results_is_refused_with_the_fix(tmp_path):
    (tmp_path / "notes.txt").write_text("not a run\n")
    with pytest.raises(RunNotFound, match="not a tianji-dask run directory: it has no metrics.nc") as e:
        open_run(tmp_path)
    assert str(tmp_path) in str(e.value) and "tianji-dask train" in str(e.value)
    with pytest.raises(RunNotFound, match="is a file, not a run directory"):
        open_run(tmp_path / "notes.txt")
    with pytest.raises(RunNotFound, match="no such run directory"):
        open_runs([tmp_path / "missing"])


def test_a_parent_of_runs_points_to_open_runs(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.nc").write_bytes(b"")
    with pytest.raises(RunNotFound, match=r"holds 1 run directories: open them all with open_runs\("):
        open_run(tmp_path)


def test_a_glob_that_matches_nothing_is_refused(tmp_path):
    pattern = str(tmp_path / "CartPole*")
    with pytest.raises(RunNotFound, match="matches nothing") as e:
        open_runs(pattern)
    assert pattern in str(e.value)
    with pytest.raises(RunNotFound, match="got no paths"):
        open_runs([])


@integration
@pytest.mark.timeout(240)
def test_the_analysis_doc_runs_as_pasted_on_runs_that_differ_in_seed_only(runs, tmp_path, monkeypatch):
    """docs/analysis.md's first example, run where a newcomer would after two ``./dev train
    --set seed=N``: it works on what such runs differ in, and writes nothing."""
    (tmp_path / "runs").mkdir()
    for seed in (0, 1):
        (tmp_path / "runs" / f"CartPole-v1__dqn__{seed}__20260102-03040{seed}").symlink_to(
            runs[f"serial-seed{seed}"][0], target_is_directory=True
        )
    monkeypatch.chdir(tmp_path)
    exec(doc_python_block(ROOT / "docs" / "analysis.md", "# Analysing runs"), {})
    plt.close("all")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def opening_a_run_with_xarray(doc: str, runs, tmp_path, monkeypatch, capsys) -> None:
    """``doc``'s block that opens a run's files with xarray, on a real run: each plot has axes of
    its own (a line and a scatter on one axes would mix two x quantities' scales)."""
    after = {"README.md": "Open the files with xarray:", "docs/metrics.md": "## Opening results"}[doc]
    code = doc_python_block(ROOT / doc, after)
    code, n = re.subn(r'^run = ".*"$', f"run = {str(runs['serial-seed0'][0])!r}", code, flags=re.M)
    assert n == 1, "the block no longer names its run in one `run = ...` line"
    monkeypatch.chdir(tmp_path)
    plt.close("all")
    exec(code, {})
    axes = [ax for n in plt.get_fignums() for ax in plt.figure(n).axes]
    drawn = [(len(ax.lines), len(ax.collections)) for ax in axes]
    plt.close("all")
    assert sorted(drawn) == [(0, 1), (1, 0)], drawn  # a line on one axes, a scatter on another
    assert capsys.readouterr().out.split()[-1] == str(runs["serial-seed0"][1].algo.lr)
    assert list(tmp_path.iterdir()) == []


@integration
@pytest.mark.timeout(240)
def test_the_readme_results_block_runs_on_a_run_and_draws_each_plot_apart(runs, tmp_path, monkeypatch, capsys):
    opening_a_run_with_xarray("README.md", runs, tmp_path, monkeypatch, capsys)


@integration
@pytest.mark.timeout(240)
def test_the_metrics_doc_block_runs_on_a_run_and_draws_each_plot_apart(runs, tmp_path, monkeypatch, capsys):
    opening_a_run_with_xarray("docs/metrics.md", runs, tmp_path, monkeypatch, capsys)


def _counters(updates_from: float, ratio: float) -> xr.Dataset:
    """A run's counters and rates by hand: rows every 0.5 s for 30 s, 100 transitions received a
    second, updates from ``updates_from`` s on consuming ``ratio`` samples per transition."""
    t = np.arange(0.0, 30.01, 0.5)
    received = 100.0 * t
    samples = np.where(t >= updates_from, ratio * (received - 100.0 * updates_from), 0.0)
    train_fps = np.where(t >= updates_from, ratio * 100.0, 0.0)
    return xr.Dataset(
        {
            "samples": ("time", samples),
            "received": ("time", received),
            "updates": ("time", samples / 32.0),
            "train_fps": ("time", train_fps),
            "receive_fps": ("time", np.full_like(t, 100.0)),
        },
        coords={"time": t},
    )


def test_replay_ratio_per_window_from_the_first_update(runs):
    """``ds.tianji.replay_ratio(window_s)``: samples consumed per transition received in each
    window after the first update (the warm-up left out, where the recorded cumulative
    ``replay_ratio`` counts it); several runs side by side; a run without the rates is refused
    with what it lacks."""
    ds = _counters(updates_from=5.5, ratio=8.0)
    r = ds.tianji.replay_ratio(window_s=5.0)
    assert r.dims == ("window",) and r.attrs["units"] == "1"
    np.testing.assert_allclose(r["window"].values, [0, 5, 10, 15])  # from the row that shows an update (6 s)
    np.testing.assert_allclose(r.values, 8.0)
    two = xr.concat([ds, _counters(updates_from=10.0, ratio=4.0)], dim=pd.Index(["a", "b"], name="run"))
    both = two.tianji.replay_ratio(window_s=5.0)
    assert both.dims == ("run", "window")
    np.testing.assert_allclose(both.sel(run="a").values, 8.0)
    np.testing.assert_allclose(both.sel(run="b").values, [4.0, 4.0, 4.0, np.nan])  # 10.5-30 s: three
    with pytest.raises(ValueError, match="needs metrics.nc's receive_fps"):
        ds.drop_vars("receive_fps").tianji.replay_ratio()
    with pytest.raises(ValueError, match="window_s=0"):
        ds.tianji.replay_ratio(window_s=0)

    run = open_run(runs["dist-seed0-actors2"][0])  # a real run: the windows tile it from its first update
    t = run["time"].values
    first = t[np.flatnonzero(run["updates"].values > 0)[0]]
    window_s = (t[-1] - first) / 2.01  # two windows, however long the run trained
    windows = run.tianji.replay_ratio(window_s=window_s)
    assert len(windows) == 2
    assert np.isfinite(windows.values).any() and (windows.fillna(0).values >= 0).all()


def test_replay_ratio_windows_hold_when_a_hosts_heartbeats_drift_past_the_rows():
    """Hosts beat every interval after their last beat, so a beat drifts against the driver's
    rows, and now and then a row repeats a host's counters. Windows differenced from the counters
    then show a spike (measured on an H200 run: 35.5 where the controller held 32); windows from
    the rates stay at the ratio the learner and buffer kept."""
    m = MetricsRecorder(run_name="r", target_return=None, config_json="{}", t0=0.0)
    received_per_s, ratio = 4000.0, 32.0
    beats = [("buffer", k * 1.021) for k in range(118)] + [("learner", 0.5 + k * 0.997) for k in range(120)]
    beats.sort(key=lambda b: b[1])
    row_at = 1.0
    for role, t in beats:
        while row_at <= t:
            m.row(row_at)
            row_at += 1.0
        counters: BufferCounters | LearnerCounters
        if role == "buffer":
            counters = BufferCounters(received=int(received_per_s * t))
        else:
            samples = int(ratio * received_per_s * t)
            counters = LearnerCounters(updates=samples // 32, samples=samples)
        m.add(Heartbeat(role, 0, counters, t=t).message())
    ds = m.dataset()
    windows = ds.tianji.replay_ratio(window_s=10.0)
    assert len(windows) >= 10
    np.testing.assert_allclose(windows.values, ratio, rtol=0.02)
    # the counters do show the slips this guards against
    times = ds["time"].values
    first = times[np.flatnonzero(ds["updates"].values > 0)[0]]
    edges = np.searchsorted(times, first + 10.0 * np.arange(len(windows) + 1))
    differenced = np.diff(ds["samples"].values[edges]) / np.diff(ds["received"].values[edges])
    assert np.abs(differenced / ratio - 1).max() > 0.05


# ------------------------------------------------------------------------------ recorded runs
def recorded_run(path, sets, returns, status="max_env_steps"):
    """A run directory as a run writes it (config.yaml, metrics.nc, episodes.nc), from a
    recorder fed one actor's heartbeats: one episode of each return in ``returns``, 0.1 s apart,
    a metrics row after each; no cluster."""
    cfg = load_config(CONFIG, list(sets))
    t0 = 1_700_000_000.0
    m = MetricsRecorder(
        run_name=path.name,
        target_return=cfg.stop.target_return,
        config_json=cfg.to_json(),
        t0=t0,
        attrs={"mode": "distributed", "env_id": cfg.env.id, "seed": cfg.seed},
    )
    for k, ret in enumerate(returns, start=1):
        t = t0 + 0.1 * k
        m.add(Heartbeat("actor", 0, ActorCounters(env_steps=10 * k), episodes=[(float(ret), 10, t)], t=t).message())
        m.row(0.1 * k)
    m.set_outcome(status)
    path.mkdir(parents=True)
    write_config(path, cfg.model_dump_yaml())
    m.write(path)
    return path


def test_seeds_that_differ_in_run_keys_are_one_group(tmp_path):
    """run.* (TensorBoard, checkpoints, restarts) says how a run is kept, not what it tries:
    seeds that differ in it are replicates of one setting. The stop rules (a sweep over budgets)
    and the experiment's own keys still split groups."""
    climbing = [10.0 * k for k in range(1, 131)]  # the 100-episode mean reaches 60 at episode 100
    recorded_run(tmp_path / "a", ["seed=0", "stop.target_return=60"], climbing, "target_reached")
    recorded_run(
        tmp_path / "b",
        ["seed=1", "stop.target_return=60", "run.tensorboard=true", "run.metrics_interval=0.25"],
        [5.0] * 120,
        "stopped",
    )
    ds = open_runs(tmp_path / "*")
    assert {"seed", "run.tensorboard", "run.metrics_interval"} <= set(ds.coords)  # still there to select by
    assert ds.tianji.settings == ["seed"]
    table = ds.tianji.summary()
    assert len(table) == 1 and table["runs"].iloc[0] == 2 and table["reached"].iloc[0] == 1
    assert table["status"].iloc[0] == "1 stopped, 1 target_reached"
    np.testing.assert_allclose(table["final_return"].iloc[0], np.median([np.mean(climbing[-100:]), 5.0]))

    recorded_run(tmp_path / "c", ["seed=0", "stop.target_return=60", "algo.lr=0.01"], climbing, "target_reached")
    recorded_run(tmp_path / "d", ["seed=0", "stop.target_return=50"], climbing, "target_reached")
    recorded_run(tmp_path / "e", ["seed=0", "stop.target_return=60", "stop.max_seconds=99"], climbing, "target_reached")
    groups = open_runs(tmp_path / "*").tianji.summary()
    assert sorted(groups.index.names) == ["algo.lr", "stop.max_seconds", "stop.target_return"]
    assert groups["runs"].sum() == 5 and len(groups) == 4


def test_a_glob_leaves_out_what_is_not_a_run(tmp_path):
    """A sweep's directory holds its sweep.yaml beside the runs, and runs/ holds sweeps/ and
    plans/: a glob takes the run directories among its matches."""
    recorded_run(tmp_path / "seed=0", ["seed=0"], [1.0, 2.0])
    (tmp_path / "sweep.yaml").write_text("grid: {}\n")
    (tmp_path / "sweeps").mkdir()
    ds = open_runs(tmp_path / "*")
    assert ds["run"].values.tolist() == ["seed=0"]
    with pytest.raises(RunNotFound, match="matches 2 paths but no run directory"):
        open_runs(tmp_path / "sw*")


def test_replay_ratio_says_why_a_run_has_no_window():
    """A run shorter than one window from its first update (or with no update) gets no replay
    ratio; the warning names the run, how long it trained and the window."""
    ds = _counters(updates_from=5.5, ratio=8.0)  # rows to 30 s, updates from 6 s
    with pytest.warns(
        RuntimeWarning,
        match=r"replay_ratio\(window_s=30\): no value for .*trained 24.0 s from its first update, less than one 30-s",
    ):
        r = ds.tianji.replay_ratio(window_s=30.0)
    assert not np.isfinite(r.values).any()
    never = ds.assign(updates=ds["updates"] * 0)
    with pytest.warns(RuntimeWarning, match="its learner made no update"):
        never.tianji.replay_ratio(window_s=5.0)
    two = xr.concat([ds, never], dim=pd.Index(["long", "idle"], name="run"))
    with pytest.warns(RuntimeWarning, match=r"no value for idle \(its learner made no update\); give a smaller"):
        both = two.tianji.replay_ratio(window_s=5.0)
    assert np.isfinite(both.sel(run="long").values).all()
