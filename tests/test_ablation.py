"""benchmarks/ablation.py: named variants (config + mode) run one after the other on a real
LocalCluster and land in one NetCDF (variant x seed), JSON and PNG; a bad variant is refused
before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

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


@pytest.mark.integration
def test_three_variants_land_in_one_dataset_with_their_rates_and_returns(tmp_path):
    r = ablation(
        tmp_path,
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
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "out"
    ds = xr.open_dataset(out / "ablation.nc", engine="h5netcdf")
    assert list(ds.variant.values) == ["relaxed", "relaxed_twin", "synchronous"]
    assert list(ds["mode"].values) == ["relaxed", "relaxed", "synchronous"]
    assert (ds.train_fps > 0).all() and (ds.env_fps > 0).all()
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
