"""benchmarks/ablation.py: named variants (config + mode) run one after the other on a real
LocalCluster and land in one NetCDF (variant x seed), JSON and PNG; a bad variant is refused
before anything starts."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from conftest import script_module

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "ablation.py"
CONFIG = "configs/cartpole_dqn.yaml"


def ablation(tmp_path: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), *args, "--out", str(tmp_path / "out"), "--runs", str(tmp_path / "runs")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        (("a", CONFIG, "gossip"), "the mode is one of relaxed, synchronous"),
        (("a", "configs/no_such.yaml", "relaxed"), "no config file configs/no_such.yaml"),
    ],
)
def test_a_bad_variant_is_refused_before_any_run(tmp_path, variant, expected):
    r = ablation(tmp_path, "--variant", *variant, "--seeds", "0", timeout=60)
    assert r.returncode != 0
    assert expected in r.stderr
    assert not (tmp_path / "runs").exists()


def test_repeated_names_and_a_bad_override_are_refused_before_any_run(tmp_path):
    r = ablation(tmp_path, "--variant", "a", CONFIG, "relaxed", "--variant", "a", CONFIG, "synchronous", timeout=60)
    assert r.returncode != 0 and "variant names repeat" in r.stderr
    r = ablation(tmp_path, "--variant", "a", CONFIG, "relaxed", "--set", "algo.no_such_field=1", timeout=60)
    assert r.returncode != 0 and "variant a:" in r.stderr and "no_such_field" in r.stderr
    assert not (tmp_path / "runs").exists()


def ablation_module():
    return script_module(SCRIPT)


def rows(time, **columns) -> xr.Dataset:
    return xr.Dataset({k: ("time", np.array(v)) for k, v in columns.items()}, coords={"time": time})


def test_one_row_after_the_first_update_gives_the_rates_it_holds():
    """A synchronous run whose driver saw its whole training between two rows (a loaded machine):
    the updates show in the last row only, whose rates cover the heartbeats since the row before."""
    mod = ablation_module()
    nan = math.nan
    ds = rows(
        [0.0, 0.5, 1.0, 5.0],
        updates=[0, 0, 0, 46],
        samples=[0, 0, 0, 2_944],
        env_fps=[nan, 0.0, 16.0, 3_000.0],
        receive_fps=[nan, nan, 0.0, 2_900.0],
        train_fps=[nan, nan, 0.0, 736.0],
    )
    assert mod.rate_rows(ds) == 3
    assert mod.mean_rates(ds) == {"env_fps": 3000.0, "receive_fps": 2900.0, "train_fps": 736.0, "updates_per_s": 11.5}


def test_rates_are_means_over_the_rows_weighted_by_their_time_since_the_row_before():
    mod = ablation_module()
    nan = math.nan
    ds = rows(
        [0.0, 0.5, 1.0, 3.0],
        updates=[0, 4, 8, 10],
        samples=[0, 256, 512, 640],
        env_fps=[nan, 100.0, 200.0, 400.0],
        receive_fps=[nan, nan, 200.0, 500.0],  # a NaN row is left out, weight and all
        train_fps=[nan, 600.0, 300.0, 900.0],
    )
    assert mod.rate_rows(ds) == 1
    rates = mod.mean_rates(ds)
    assert rates["env_fps"] == pytest.approx((100 * 0.5 + 200 * 0.5 + 400 * 2) / 3)
    assert rates["receive_fps"] == pytest.approx((200 * 0.5 + 500 * 2) / 2.5)
    assert rates["train_fps"] == pytest.approx((600 * 0.5 + 300 * 0.5 + 900 * 2) / 3)
    assert rates["updates_per_s"] == pytest.approx(rates["train_fps"] / 64)


def test_rates_of_a_run_without_updates_or_with_one_row_are_nan_and_say_why():
    mod = ablation_module()
    nan = math.nan
    idle = rows(
        [0.0, 0.5], updates=[0, 0], samples=[0, 0], env_fps=[nan, 9.0], receive_fps=[nan, 8.0], train_fps=[nan, 0.0]
    )
    one = rows([0.5], updates=[10], samples=[640], env_fps=[nan], receive_fps=[nan], train_fps=[nan])
    assert mod.rate_rows(idle) == "no learner update recorded"
    assert mod.rate_rows(one) == "a single metrics row"
    for ds in (idle, one):
        assert all(math.isnan(v) for v in mod.mean_rates(ds).values())


@pytest.mark.integration
def test_three_variants_land_in_one_dataset_with_their_rates_and_returns(h, tmp_path):
    r = h.called_here(  # its main, in this process: the refusals above run it as a script
        h.script_main(SCRIPT),
        "--seeds",
        "0",
        "--seconds",
        "120",  # a bound only: each run ends at its env steps, however slowly the cluster starts
        "--variant",
        "relaxed",
        CONFIG,
        "relaxed",
        "--variant",
        "relaxed_twin",
        CONFIG,
        "relaxed",
        "--variant",
        "synchronous",
        CONFIG,
        "synchronous",
        "--set",
        "algo.learning_starts=200",
        "--set",
        "stop.max_env_steps=12000",
        "--out",
        tmp_path / "out",
        "--runs",
        tmp_path / "runs",
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "out"
    ds = xr.open_dataset(out / "ablation.nc", engine="netcdf4")
    assert list(ds.variant.values) == ["relaxed", "relaxed_twin", "synchronous"]
    assert list(ds["mode"].values) == ["relaxed", "relaxed", "synchronous"]
    for rate in ("train_fps", "env_fps", "receive_fps", "updates_per_s"):
        assert (ds[rate] > 0).all(), ds[rate].values
    assert np.isfinite(ds.best_return_mean_100).all()
    data = json.loads((out / "ablation.json").read_text())
    assert [r["variant"] for r in data["runs"]] == ["relaxed", "relaxed_twin", "synchronous"]
    ratio = data["summary"]["train_fps"]["median_ratio_over_synchronous"]["relaxed"]
    assert ratio == pytest.approx(
        float(ds.train_fps.sel(variant="relaxed", seed=0) / ds.train_fps.sel(variant="synchronous", seed=0))
    )
    # the relaxed learner does not wait for actors; the synchronous one does
    assert ratio > 1
    assert (out / "ablation.png").stat().st_size > 10_000
    for name in ds.variant.values:
        assert any((tmp_path / "runs").glob(f"ablation-*/{name}-seed0/metrics.nc"))
