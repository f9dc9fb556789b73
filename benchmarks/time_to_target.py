"""Time to target: wall seconds and env steps until the 100-episode mean return reaches
the config's target, for the distributed default and the serial reference, side by side.

    python benchmarks/time_to_target.py configs/cartpole_dqn.yaml --seeds 0 1 2
    python benchmarks/time_to_target.py configs/cartpole_dqn.yaml --modes distributed --set algo.lr=1e-3

Each run is timed from just before cluster (or model) construction, after imports: the
LocalCluster start and the hosts' start-up are included. Modes alternate per seed so
both see the same machine conditions. Prints each run's own event lines as they come (the
hosts' start-up, restarts), timed from its start, and the medians at the end; writes
``<out>/time_to_target.json`` and ``<out>/time_to_target.nc`` (dims ``mode`` x ``seed``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import xarray as xr

from tianji_dask.config import load_config
from tianji_dask.results.provenance import portable_path, provenance_attrs
from tianji_dask.runtime.driver import train


def one_run(config: str, overrides: list[str], seed: int, mode: str, out_root: Path) -> dict:
    cfg = load_config(config, [*overrides, f"seed={seed}"])
    out = out_root / f"{mode}-seed{seed}"
    t0 = time.perf_counter()

    def event(text: str) -> None:  # the run's own lines ("hosts ready ...", restarts), timed from its start
        print(f"{mode:>11} seed {seed}: {time.perf_counter() - t0:6.1f} s  {text}", flush=True)

    run = train(cfg, serial=(mode == "serial"), out=out, on_event=event)
    res = run.wait()
    ttt = res.time_to_target_s
    steps_at_target = math.nan
    if not math.isnan(ttt):
        ds = run.metrics()
        hit = ds.time.values >= ttt - 1e-9
        steps_at_target = float(ds.env_steps.values[hit][0]) if hit.any() else float(res.env_steps)
    return {
        "mode": mode,
        "seed": seed,
        "status": res.status,
        "time_to_target_s": ttt,
        "env_steps_to_target": steps_at_target,
        "wall_s": res.wall_s,
        "env_steps": res.env_steps,
        "return_mean_100": res.return_mean_100,
        "run_dir": portable_path(res.run_dir),
        "error": res.error,
        "load_avg_1m": os.getloadavg()[0],
    }


def summarise(rows: list[dict], mode: str) -> dict:
    mine = [r for r in rows if r["mode"] == mode]
    t = [r["time_to_target_s"] for r in mine]
    s = [r["env_steps_to_target"] for r in mine]
    reached = [x for x in t if not math.isnan(x)]
    return {
        "mode": mode,
        "runs": len(mine),
        "reached": len(reached),
        "median_time_to_target_s": statistics.median(t) if len(reached) == len(t) else math.nan,
        "min_s": min(reached) if reached else math.nan,
        "max_s": max(reached) if reached else math.nan,
        "median_env_steps_to_target": statistics.median(s) if len(reached) == len(t) else math.nan,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--modes", nargs="+", default=["distributed", "serial"], choices=["distributed", "serial"])
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="where time_to_target.json/.nc go")
    p.add_argument(
        "--runs", type=Path, default=Path("runs/benchmarks"), help="where the runs' own directories go (not committed)"
    )
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.runs.mkdir(parents=True, exist_ok=True)
    runs_root = Path(tempfile.mkdtemp(prefix="ttt-", dir=args.runs))
    rows = []
    for seed in args.seeds:
        for mode in args.modes:
            r = one_run(args.config, args.overrides, seed, mode, runs_root)
            rows.append(r)
            print(
                f"{mode:>11} seed {seed}: {r['status']:>15}  time to target {r['time_to_target_s']:6.1f} s  "
                f"steps {r['env_steps_to_target']:>9,.0f}  load {r['load_avg_1m']:.2f}",
                flush=True,
            )
    summary = [summarise(rows, m) for m in args.modes]
    for s in summary:
        print(
            f"{s['mode']:>11}: median {s['median_time_to_target_s']:.1f} s (range {s['min_s']:.1f}-{s['max_s']:.1f}), "
            f"median env steps {s['median_env_steps_to_target']:,.0f}, reached {s['reached']}/{s['runs']}"
        )
    meta = {
        "config": args.config,
        "overrides": args.overrides,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": f"{os.cpu_count()} cores",
        **provenance_attrs(),
    }
    (args.out / "time_to_target.json").write_text(
        json.dumps({"meta": meta, "runs": rows, "summary": summary}, indent=2, default=str)
    )
    modes, seeds = args.modes, args.seeds

    def grid(key):
        a = np.full((len(modes), len(seeds)), np.nan)
        for r in rows:
            a[modes.index(r["mode"]), seeds.index(r["seed"])] = r[key]
        return a

    ds = xr.Dataset(
        {
            "time_to_target_s": (
                ("mode", "seed"),
                grid("time_to_target_s"),
                {"long_name": "wall time to target (cluster start included)", "units": "s"},
            ),
            "env_steps_to_target": (
                ("mode", "seed"),
                grid("env_steps_to_target"),
                {"long_name": "env steps at target", "units": "1"},
            ),
            "load_avg_1m": (
                ("mode", "seed"),
                grid("load_avg_1m"),
                {"long_name": "1-minute load average after the run", "units": "1"},
            ),
        },
        coords={"mode": modes, "seed": seeds},
        attrs={k: (json.dumps(v) if not isinstance(v, str) else v) for k, v in meta.items()},
    )
    ds.to_netcdf(args.out / "time_to_target.nc", engine="netcdf4")
    return 0 if all(s["reached"] == s["runs"] for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
