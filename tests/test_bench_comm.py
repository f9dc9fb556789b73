"""The communication benchmark (benchmarks/comm.py and its comm_bench package): equation 1 and
the command line as unit tests, and its smallest configuration end to end against
docs/benchmarks.md."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "comm.py"
# comm_bench is not installed: it is found beside the script, as when the script runs. Appended,
# so that benchmarks/comm.py does not hide the installed package named comm (Jupyter's).
sys.path.append(str(SCRIPT.parent))

from comm_bench.cases import KIB, Case, CommBenchConfig, plan_cases  # noqa: E402
from comm_bench.cli import build_parser, config_from_args  # noqa: E402
from comm_bench.derived import add_raw_ratios, derive  # noqa: E402
from comm_bench.results import COORDS, VARIABLES, grid  # noqa: E402
from comm_bench.run import run  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"


def documented(section: str) -> dict[str, str]:
    """``{name: units}`` from the ``| `name` | units | meaning |`` table under ``### <section>``."""
    text = DOC.read_text(encoding="utf-8")
    body = re.search(rf"^### {re.escape(section)}\n(.*?)(?=^##)", text, re.S | re.M)
    assert body, f"no '### {section}' section in {DOC}"
    table = {}
    for line in body.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`([a-z0-9_]+)`", cells[0]) if len(cells) >= 3 else None
        if m:
            table[m.group(1)] = cells[1]
    assert table, f"no variable table under '### {section}' in {DOC}"
    return table


def test_docs_define_every_variable_and_coordinate():
    assert documented("comm.nc variables") == {k: u for k, (_, u) in VARIABLES.items()}
    assert documented("comm.nc coordinates") == {k: u for k, (_, u) in COORDS.items()}


def test_equation_1_and_raw_ratios():
    actor = Case("actors", "channel", 512 * KIB, 4, 0.01, 1000)
    row = derive(
        {
            "collection_time": 3.0,
            "t_sp": 0.010,
            "t_sd": 0.002,
            "t_rv": 0.001,
            "t_sp_cpu": 0.0,
            "send_call_time": 0.0001,
        },
        actor,
        cores=2,
    )
    assert row["critical_path"] == "actor"  # (10 + 2) / 4 = 3 ms > 1 ms
    assert row["t_c_eq1"] == pytest.approx(1000 * 0.012 / 4)
    assert row["t_c_eq1_overlap"] == pytest.approx(1000 * 0.0101 / 4)
    assert row["eq1_over_measured"] == pytest.approx(1.0)
    assert row["t_c_cpu_bound"] == pytest.approx(1000 * 0.003 / 2)
    assert row["throughput"] == pytest.approx(1000 * 512 * KIB / 3.0 / 1e6)
    buffer = Case("actors", "raw_tcp", 512 * KIB, 4, 0.001, 1000)
    raw = derive(
        {
            "collection_time": 1.5,
            "t_sp": 0.001,
            "t_sd": 0.0002,
            "t_rv": 0.0005,
            "t_sp_cpu": 0.0,
            "send_call_time": 0.0001,
        },
        buffer,
        cores=2,
    )
    assert raw["critical_path"] == "buffer" and raw["t_c_eq1"] == pytest.approx(0.5)
    rows = [raw, {"collection_time": 3.0, "throughput": raw["throughput"] / 2}]
    add_raw_ratios(rows, [buffer, Case("actors", "channel", 512 * KIB, 4, 0.001, 1000)])
    assert rows[1]["time_ratio_to_raw_tcp"] == pytest.approx(2.0)
    assert rows[1]["fraction_of_raw_tcp"] == pytest.approx(0.5)
    # the same key in two sweeps: each channel case against the anchor of its own sweep
    size = [Case("size", t, 512 * KIB, 1, 0.0, 10) for t in ("raw_tcp", "channel")]
    act = [Case("actors", t, 512 * KIB, 1, 0.0, 10) for t in ("raw_tcp", "channel")]
    alt = Case("transports", "dask_actor", 512 * KIB, 1, 0.0, 5)
    rows = [{"throughput": tp} for tp in (4000.0, 1000.0, 5000.0, 1000.0, 800.0)]
    add_raw_ratios(rows, [*size, *act, alt])
    assert [r["fraction_of_raw_tcp"] for r in rows] == pytest.approx([1.0, 0.25, 1.0, 0.2, 0.2])


def test_command_line():
    args = build_parser().parse_args(
        [
            "--small",
            "--max-actors",
            "16",
            "--out",
            "x",
            "--worker-env",
            "MALLOC_TRIM_THRESHOLD_=",
            "--sweeps",
            "actors,tiny",
        ]
    )
    cfg = config_from_args(args)
    assert cfg.actor_counts == (1, 2, 4, 8, 16) and cfg.messages == 500 and args.out == Path("x")
    assert cfg.worker_env == {"MALLOC_TRIM_THRESHOLD_": None} and cfg.sweeps == ("actors", "tiny")
    assert [c.sweep for c in plan_cases(cfg)].count("tiny") == 2
    full = config_from_args(build_parser().parse_args(["--max-actors", "6"]))
    assert full.actor_counts == (1, 2, 4, 6) and full.messages == 10_000
    assert len(plan_cases(full)) == 2 * 6 + 2 * 3 * 4 + 2 + 2
    some = config_from_args(build_parser().parse_args(["--sample-times", "0,0.001"]))
    assert some.sample_times == (0.0, 0.001)
    with pytest.raises(ValueError, match="--sample-times"):
        config_from_args(build_parser().parse_args(["--sample-times", "fast"]))
    with pytest.raises(ValueError, match="--worker-env takes NAME=VALUE"):
        config_from_args(build_parser().parse_args(["--worker-env", "X"]))
    chosen = config_from_args(build_parser().parse_args(["--actors", "16,32", "--max-actors", "8"]))
    assert chosen.actor_counts == (16, 32)
    for bad in ("16,many", ","):
        with pytest.raises(ValueError, match="--actors"):
            config_from_args(build_parser().parse_args(["--actors", bad]))
    with pytest.raises(ValueError, match="actor counts must be >= 1"):
        config_from_args(build_parser().parse_args(["--actors", "0,4"]))
    assert config_from_args(build_parser().parse_args(["--tiny-messages", "200000"])).tiny_messages == 200_000
    with pytest.raises(ValueError, match="tiny_messages must be at least 1"):
        config_from_args(build_parser().parse_args(["--tiny-messages", "0"]))


@pytest.mark.slow
def test_the_script_runs_from_a_checkout_and_refuses_bad_input(tmp_path):
    """Run as its docs say, from any directory, the script finds comm_bench without help."""
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--sweeps", "size,bogus"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr
    assert "benchmarks/comm.py: error: unknown sweeps ['bogus']" in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_smallest_run_writes_documented_results(tmp_path):
    import xarray as xr

    cfg = CommBenchConfig(
        messages=40, sizes=(64 * KIB,), actor_counts=(2,), sample_times=(0.001,), sweeps=("size", "actors")
    )
    run(cfg, tmp_path, log=lambda s: None)
    for name in ("comm.nc", "comm.json", "comm.png"):
        assert (tmp_path / name).stat().st_size > 0
    with xr.open_dataset(tmp_path / "comm.nc", engine="netcdf4") as ds:
        ds.load()
    assert list(ds["transport"].values) == ["raw_tcp", "channel", "raw_tcp", "channel"]
    assert json.loads(ds.attrs["errors"]) == []
    units = documented("comm.nc variables")
    assert set(ds.data_vars) == set(units)
    for name in (*ds.data_vars, *ds.coords):
        assert ds[name].attrs.get("long_name"), f"{name} has no long_name"
        assert "units" in ds[name].attrs, f"{name} has no units"
    for name, u in units.items():
        assert ds[name].attrs["units"] == u
    for key in ("git_commit", "machine_cpu_model", "machine_cpu_cores", "load_avg_at_start", "distributed_version"):
        assert key in ds.attrs
    assert (ds["throughput"] > 0).all() and (ds["message_rate"] > 0).all()
    assert np.allclose(ds["message_rate"] * ds["collection_time"], ds["messages"])
    assert (ds["messages_sent"] >= ds["messages"]).all()
    assert (ds["receiver_rss_peak"] >= ds["receiver_rss_start"]).all() and (ds["receiver_rss_start"] > 0).all()
    assert set(ds["critical_path"].values) <= {"actor", "buffer"}
    # every receiver waits on its sockets, so it switches; faults are counted (0 where none)
    assert (ds["receiver_switches_per_message"] > 0).all() and (ds["receiver_faults_per_message"] >= 0).all()
    assert (ds["t_c_eq1"] > 0).all() and (ds["t_rv"] > 0).all() and (ds["t_sd"] > 0).all()
    raw = ds["transport"] == "raw_tcp"
    assert np.allclose(ds["fraction_of_raw_tcp"].where(raw, drop=True), 1.0)
    channel = ds.where(~raw, drop=True)
    assert (channel["fraction_of_raw_tcp"] > 0).all() and (channel["items_per_wire_message"] >= 1).all()
    t_sp = ds["t_sp"].where(ds["sweep"] == "actors", drop=True).values
    assert (t_sp >= 0.001).all() and (t_sp < 0.1).all()  # slept at least the sample time
    summary = json.loads((tmp_path / "comm.json").read_text())["summary"]
    assert summary["bars"]["2_actors_512KiB_sample_0.001s"]["time_ratio"] > 0
    g = grid(ds, "actors", ("transport", "sample_time", "actors"))["collection_time"]
    assert g.sizes == {"transport": 2, "sample_time": 1, "actors": 1} and not math.isnan(float(g.max()))
