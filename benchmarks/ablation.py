"""Ablation: relaxed (TianJi) vs synchronous (Gorila-style) assignment dependencies, side by side.

    python benchmarks/ablation.py [CONFIG] [--seeds 0 1 2] [--seconds 40]

Runs the same config with ``topology.mode=relaxed`` and ``topology.mode=synchronous``,
alternating per seed, each until the target return or ``--seconds``. Reports sample, receive
and training throughput (mean rates after the first update, from metrics.nc) and time to
target, with the relaxed/synchronous ratios. Writes ``<out>/ablation.json`` and
``<out>/ablation.nc`` (dims ``mode`` x ``seed``).
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
from tianji_dask.driver import train
from tianji_dask.results import provenance_attrs

MODES = ("relaxed", "synchronous")
RATES = {
    "env_fps": ("env steps per second (all actors)", "s-1"),
    "receive_fps": ("transitions received per second (all buffers)", "s-1"),
    "train_fps": ("samples consumed per second (all learners)", "s-1"),
    "updates_per_s": ("learner updates per second", "s-1"),
    "time_to_target_s": ("wall time to the target return (cluster start included; NaN if not reached)", "s"),
}


def mean_rates(ds: xr.Dataset) -> dict:
    """Mean rates between the first learner update and the end of the run."""
    t, u = ds.time.values, ds.updates.values
    started = np.flatnonzero(u > 0)
    if len(started) < 2:
        return {k: math.nan for k in ("env_fps", "receive_fps", "train_fps", "updates_per_s")}
    i0, i1 = started[0], len(t) - 1
    dt = t[i1] - t[i0]
    received = ds.receive_fps.values
    return {
        "env_fps": float((ds.env_steps.values[i1] - ds.env_steps.values[i0]) / dt),
        "receive_fps": float(np.nanmean(received[i0 : i1 + 1])),
        "train_fps": float(np.nanmean(ds.train_fps.values[i0 : i1 + 1])),
        "updates_per_s": float((u[i1] - u[i0]) / dt),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", default="configs/cartpole_dqn.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/ablation"))
    p.add_argument("--runs", type=Path, default=Path("runs/benchmarks"))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.runs.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="ablation-", dir=args.runs))
    rows = []
    for seed in args.seeds:
        for mode in MODES:
            cfg = load_config(
                args.config,
                [
                    *args.overrides,
                    f"topology.mode={mode}",
                    f"seed={seed}",
                    f"stop.max_seconds={args.seconds}",
                    "run.checkpoint=false",
                ],
            )
            load0 = os.getloadavg()[0]
            run = train(cfg, out=root / f"{mode}-seed{seed}")
            res = run.wait()
            row = {
                "mode": mode,
                "seed": seed,
                "status": res.status,
                "error": res.error,
                "time_to_target_s": res.time_to_target_s,
                "env_steps": res.env_steps,
                "return_mean_100": res.return_mean_100,
                **mean_rates(run.metrics()),
                "load_avg_1m_before": load0,
                "load_avg_1m_after": os.getloadavg()[0],
            }
            rows.append(row)
            print(
                f"{mode:>11} seed {seed}: {row['status']:>14}  train {row['train_fps']:8.0f} samples/s  "
                f"updates {row['updates_per_s']:6.0f}/s  sample {row['env_fps']:7.0f} steps/s  "
                f"time to target {row['time_to_target_s']:5.1f} s  load {load0:.2f}",
                flush=True,
            )
    summary = {}
    for key in RATES:
        med = {m: statistics.median([r[key] for r in rows if r["mode"] == m]) for m in MODES}
        ratios = [
            r[key] / s[key]
            for r in rows
            if r["mode"] == "relaxed"
            for s in rows
            if s["mode"] == "synchronous" and s["seed"] == r["seed"]
        ]
        summary[key] = {
            "median_relaxed": med["relaxed"],
            "median_synchronous": med["synchronous"],
            "median_ratio_relaxed_over_synchronous": statistics.median(ratios),
        }
    for key, s in summary.items():
        print(
            f"{key:>17}: relaxed {s['median_relaxed']:9.1f}  synchronous {s['median_synchronous']:9.1f}  "
            f"ratio {s['median_ratio_relaxed_over_synchronous']:.2f}"
        )
    meta = {
        "config": args.config,
        "overrides": args.overrides,
        "seconds": args.seconds,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": f"{os.cpu_count()} cores",
        **provenance_attrs(),
    }
    (args.out / "ablation.json").write_text(
        json.dumps({"meta": meta, "runs": rows, "summary": summary}, indent=2, default=str)
    )
    grid = {k: np.full((len(MODES), len(args.seeds)), np.nan) for k in RATES}
    for r in rows:
        for k in RATES:
            grid[k][MODES.index(r["mode"]), args.seeds.index(r["seed"])] = r[k]
    ds = xr.Dataset(
        {k: (("mode", "seed"), grid[k], {"long_name": ln, "units": u}) for k, (ln, u) in RATES.items()},
        coords={"mode": list(MODES), "seed": args.seeds},
        attrs={k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()},
    )
    ds.to_netcdf(args.out / "ablation.nc", engine="h5netcdf")
    return 0


if __name__ == "__main__":
    sys.exit(main())
