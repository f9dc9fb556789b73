"""benchmarks/soak.py: its verdict on per-host series (growth after warm-up fails, a flat or
shrinking host holds), and bad input refused before any run starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from conftest import script_module

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "soak.py"


def _soak():
    return script_module(SCRIPT)


def _series(rss_end: float, fds_end: float) -> xr.Dataset:
    """Two actors, one buffer, one learner over 10 minutes; actor 1's RSS, fds and threads go
    linearly from their warm-up values to the given ends, everything else is flat."""
    t = np.arange(0.0, 600.0, 1.0)
    ramp = np.clip((t - 120) / 480, 0, 1)
    data = {}
    for role, n in (("actor", 2), ("buffer", 1), ("learner", 1)):
        for series, base, end in (("rss_mb", 300.0, rss_end), ("open_fds", 40.0, fds_end), ("threads", 12.0, 12.0)):
            values = np.full((len(t), n), base)
            if role == "actor":
                values[:, 1] = base + (end - base) * ramp
            values[:5] = np.nan  # before the first heartbeat
            data[f"{role}_{series}"] = (("time", role), values)
    return xr.Dataset(data, coords={"time": t})


@pytest.mark.parametrize(
    "rss_end, fds_end, held, grew",
    [
        (300.0 * 1.04, 40.0, True, None),  # within the 5 % allowed
        (300.0 * 1.10, 40.0, False, "rss_mb"),
        (300.0, 41.0, False, "open_fds"),  # any descriptor more at the end
        (250.0, 30.0, True, None),  # shrinking is fine
    ],
)
def test_verdict_fails_a_host_that_grew_after_warm_up(rss_end, fds_end, held, grew):
    result = _soak().verdict(_series(rss_end, fds_end), warmup_s=60, end_s=600, rss_growth=0.05, window_s=60)
    assert result["held"] is held
    failing = {(h, s) for h, series in result["hosts"].items() for s, v in series.items() if not v["held"]}
    assert failing == (set() if grew is None else {("actor 1", grew)})
    assert len(result["hosts"]) == 4


@pytest.mark.timeout(60)
def test_bad_input_is_refused_before_a_run(tmp_path):
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--minutes", "5", "--warmup-minutes", "5", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "--minutes must exceed --warmup-minutes" in p.stderr, p.stderr
    assert not (tmp_path / "o").exists()
