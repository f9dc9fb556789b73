"""benchmarks/pong_race.sh: bad input is refused before anything starts; a small race (the
_small Pong configs, one core each) runs in the background, reports its state, and both runs
end with their results written and no process left."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "pong_race.sh"


def race(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHON": sys.executable, **env},
    )


def test_unknown_command_is_refused(tmp_path):
    r = race("go", str(tmp_path / "x"))
    assert r.returncode == 2 and "unknown command go" in r.stderr, r


def test_an_existing_directory_is_refused_and_left_alone(tmp_path):
    (tmp_path / "keep.txt").write_text("results")
    r = race("start", str(tmp_path), "10")
    assert r.returncode == 2 and "exists" in r.stderr, r
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_cores_that_do_not_exist_are_refused(tmp_path):
    r = race("start", str(tmp_path / "race"), "10", "0", "4096-4097")
    assert r.returncode == 2 and "cannot pin to cores 4096-4097" in r.stderr, r
    assert not (tmp_path / "race").exists()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_small_race_runs_in_the_background_and_stops_with_both_results(tmp_path):
    out = tmp_path / "race"
    r = race("start", str(out), "120", "0", "1", RACE_CONFIG="_small")
    assert r.returncode == 0, r
    pids = {algo: int((out / f"{algo}.pid").read_text()) for algo in ("ppo", "dqn")}
    try:
        stepping = re.compile(r"steps\s+[1-9][\d,]*\s")  # a progress line with env steps taken
        deadline = time.monotonic() + 150
        # both stepping: on one core each, which run steps first depends on the machine's load
        while time.monotonic() < deadline and not all(
            stepping.search((out / f"{algo}.log").read_text()) for algo in ("ppo", "dqn")
        ):
            time.sleep(0.5)
        status = race("status", str(out)).stdout
        assert "dqn [running]" in status and stepping.search(status), status
        r = race("stop", str(out), timeout=180)  # SIGTERM: each run writes its results
        assert r.returncode == 0 and r.stdout.count("[ended]") == 2, r.stdout + r.stderr
        assert "SIGTERM: stopping all hosts" in (out / "dqn.log").read_text()
        for algo in ("ppo", "dqn"):
            log = (out / f"{algo}.log").read_text()
            assert "results:" in log and "Traceback" not in log, log
            with xr.open_dataset(out / algo / "metrics.nc", engine="netcdf4") as ds:
                assert ds.sizes["time"] > 0
                assert float(ds.env_steps.max()) > 0
    finally:
        for pid in pids.values():
            try:
                for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
                    p.kill()
            except psutil.NoSuchProcess:
                pass
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers, [p.info["cmdline"] for p in leftovers]
