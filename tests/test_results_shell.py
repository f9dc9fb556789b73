"""``tianji-dask summary`` and ``tianji-dask plot`` (tianji_dask/results/shell.py) on real runs.

Three short serial CartPole runs are made once for the module under one directory, as a sweep
leaves them: seeds 0 and 1 at the config's learning rate and seed 0 at another, so the summary
has two settings groups, one of them over two seeds.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from conftest import cli_here

from tianji_dask.config import load_config
from tianji_dask.results.analysis import open_runs
from tianji_dask.results.shell import print_summary
from tianji_dask.runtime.driver import train

slow = pytest.mark.slow  # serial runs, no cluster
RUNS = {
    "seed=0__algo.lr=1e-3": ["seed=0"],
    "seed=1__algo.lr=1e-3": ["seed=1"],
    "seed=0__algo.lr=3e-4": ["algo.lr=3e-4"],
}


@pytest.fixture(scope="module")
def sweep_dir(h, tmp_path_factory):
    """A directory holding three finished serial runs (a sweep's layout)."""
    root = tmp_path_factory.mktemp("sweep")
    for name, extra in RUNS.items():
        # a target a random CartPole policy nearly makes: some runs reach it after their first
        # 100 episodes, and the summary has times to show
        overrides = [*h.SHORT, "stop.target_return=25", "stop.max_env_steps=4000", "run.metrics_interval=0.1"]
        result = train(load_config(h.CONFIG, [*overrides, *extra]), out=root / name, serial=True).wait(timeout=90)
        assert result is not None and result.error is None, result and result.error
    return root


def expected_summary(paths) -> pd.DataFrame:
    return open_runs(paths).tianji.summary().reset_index()


@slow
@pytest.mark.timeout(240)
def test_summary_of_a_sweep_directory_prints_the_accessors_table_as_aligned_text(sweep_dir):
    r = cli_here("summary", sweep_dir)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    expected = expected_summary([sweep_dir / n for n in RUNS])
    shown = [c for c in expected.columns[1:] if c not in ("min_s", "max_s")]  # in --csv only
    assert lines[0].split() == ["algo.lr", *shown], lines
    assert len(lines) == 1 + len(expected) == 3, lines
    for line, (_, row) in zip(lines[1:], expected.iterrows(), strict=True):
        cells = line.split()
        assert float(cells[0]) == row["algo.lr"] and int(cells[1]) == row["runs"] and int(cells[2]) == row["reached"]
        median = "-" if np.isnan(row["median_s"]) else f"{row['median_s']:.2f}"
        assert cells[3] == median, (line, row)
    # the numeric columns right-aligned, so they end where the header's names end; status last, left-aligned
    numbers_end = lines[0].index("final_return") + len("final_return")
    assert {line[numbers_end - 1] for line in lines[1:]} != {" "} and all(line[numbers_end] == " " for line in lines)
    assert {line.index(row["status"]) for line, (_, row) in zip(lines[1:], expected.iterrows())} == {
        lines[0].index("status")
    }
    assert "│" not in r.stdout and "\x1b[" not in r.stdout  # no table drawing or colours in a pipe


@slow
@pytest.mark.timeout(240)
def test_summary_csv_is_the_accessors_table(sweep_dir, tmp_path):
    r = cli_here("summary", "--csv", *(sweep_dir / n for n in RUNS))
    assert r.returncode == 0, r.stderr
    got = pd.read_csv(io.StringIO(r.stdout))
    pd.testing.assert_frame_equal(got, expected_summary(sweep_dir.glob("*")), check_dtype=False)


@slow
@pytest.mark.timeout(240)
def test_summary_on_a_terminal_is_a_rich_table(sweep_dir):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    print_summary([str(sweep_dir / "seed=*")], file=out)
    text = out.getvalue()
    assert all(name in text for name in ("3 runs", "algo.lr", "median_s", "final_return", "status")), text
    assert "━" in text or "─" in text, text  # drawn by rich


@slow
@pytest.mark.timeout(240)
def test_summary_refuses_paths_without_runs_with_the_fix(sweep_dir, tmp_path):
    r = cli_here("summary", str(tmp_path / "nothing*"))
    assert r.returncode == 2 and "matches no directory" in r.stderr and "runs/CartPole-v1__dqn__*" in r.stderr, r.stderr
    (tmp_path / "empty").mkdir()
    r = cli_here("summary", tmp_path / "empty")
    assert r.returncode == 2 and "not a tianji-dask run directory" in r.stderr, r.stderr
    r = cli_here("summary")
    assert r.returncode == 2 and "RUN" in r.stderr, r.stderr


@slow
@pytest.mark.timeout(240)
def test_plot_writes_one_labelled_curve_per_run_and_prints_its_path(sweep_dir, tmp_path):
    out = tmp_path / "curve.png"
    r = cli_here("plot", sweep_dir, "--y", "return_mean_100", "--x", "env_steps", "-o", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
    # what the command drew: the accessor's lines, one per run, axes named by the variables
    from matplotlib.figure import Figure

    ax = open_runs(sweep_dir.glob("*")).tianji.plot_variable("return_mean_100", x="env_steps", ax=Figure().subplots())
    assert ax.get_xlabel() == "env steps (all actors) [1]"
    assert "mean return of the last 100" in ax.get_ylabel()
    assert len(ax.get_lines()) == 3
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == ["0, 0.0003", "0, 0.001", "1, 0.001"]


@slow
@pytest.mark.timeout(240)
def test_plot_never_replaces_a_file(sweep_dir, tmp_path):
    out = tmp_path / "curve.png"
    out.write_bytes(b"mine")
    r = cli_here("plot", sweep_dir, "-o", out)
    assert r.returncode == 2 and str(out) in r.stderr and "never replaced" in r.stderr, r.stderr
    assert out.read_bytes() == b"mine"


@slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "args, says",
    [
        (["--y", "retrun_mean_100"], ["not a variable of metrics.nc (did you mean return_mean_100?)", "loss, "]),
        (["--y", "actor_env_fps"], ["has a value per actor", "return_mean_100"]),
        (["--x", "episodes_done"], ["--x episodes_done", "give time or one of"]),
    ],
    ids=["misspelt", "per-actor", "bad-x"],
)
def test_plot_refuses_a_variable_not_in_metrics_and_lists_those_there(sweep_dir, tmp_path, args, says):
    out = tmp_path / "curve.png"
    r = cli_here("plot", sweep_dir, *args, "-o", out)
    assert r.returncode == 2, r.stderr
    for text in says:
        assert text in r.stderr, r.stderr
    assert not out.exists()


@slow
@pytest.mark.timeout(240)
def test_plot_refuses_an_output_it_cannot_write(sweep_dir, tmp_path):
    r = cli_here("plot", sweep_dir, "-o", tmp_path / "no" / "curve.png")
    assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr
    r = cli_here("plot", sweep_dir, "-o", tmp_path / "curve.txt")
    assert r.returncode == 2 and "ending in .png" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_plot_variable_takes_only_variables_with_a_value_per_row():
    ds = xr.Dataset(
        {"return_mean_100": ("time", [1.0, 2.0]), "actor_env_fps": (("time", "actor"), [[1.0], [2.0]])},
        coords={"time": [0.5, 1.0]},
    )
    assert ds.tianji.row_variables == ["return_mean_100"]
    with pytest.raises(ValueError, match="plot_variable.y='actor_env_fps'.: not a metrics variable"):
        ds.tianji.plot_variable("actor_env_fps")
