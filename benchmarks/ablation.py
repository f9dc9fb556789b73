"""Ablation: configurations of one experiment side by side, by default the relaxed (TianJi) and
the synchronous (Gorila-style) assignment dependencies of one config.

    python benchmarks/ablation.py [CONFIG] [--seeds 0 1 2] [--seconds 40]
    python benchmarks/ablation.py --seeds 1 --seconds 300 --set stop.target_return=18 \\
        --variant tianji configs/pong_dqn.yaml relaxed \\
        --variant apex configs/pong_dqn_apex.yaml relaxed \\
        --variant synchronous configs/pong_dqn.yaml synchronous        # the paper's Fig. 4a-b

Runs each variant (a name, a config and a ``topology.mode``), alternating per seed, each until
the target return or ``--seconds``. Reports sample, receive and training throughput (mean rates
from the first update to the end: time-weighted means of metrics.nc's rows), time to target and
the best 100-episode mean return, with each variant's ratio to the last one. Writes
``<out>/ablation.json``, ``<out>/ablation.nc`` (dims ``variant`` x ``seed``) and
``<out>/ablation.png`` (return against wall time, and the median rates); the runs' own
directories stay under ``--runs``.
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

from tianji_dask.config import ConfigError, load_config
from tianji_dask.results.provenance import portable_path, provenance_attrs
from tianji_dask.runtime.driver import train

MODES = ("relaxed", "synchronous")
RATES = {
    "env_fps": ("env steps per second (all actors)", "s-1"),
    "receive_fps": ("transitions received per second (all buffers)", "s-1"),
    "train_fps": ("samples consumed per second (all learners)", "s-1"),
    "updates_per_s": ("learner updates per second", "s-1"),
    "time_to_target_s": ("wall time to the target return (cluster start included; NaN if not reached)", "s"),
    "best_return_mean_100": ("best 100-episode mean return within the budget", "1"),
}
THROUGHPUTS = ("env_fps", "receive_fps", "train_fps")


def rate_rows(ds: xr.Dataset) -> int | str:
    """The first row the mean rates take, the first that shows a learner update (row 1 if row 0
    does: a row's weight is its time since the row before), through the last; else why none."""
    started = np.flatnonzero(ds.updates.values > 0)
    if not len(started):
        return "no learner update recorded"
    first = max(int(started[0]), 1)
    if first >= ds.sizes["time"]:
        return "a single metrics row"
    return first


def mean_rates(ds: xr.Dataset) -> dict:
    """Rates from the first learner update to the end of the run: the time-weighted means of the
    rows' own rates over the :func:`rate_rows` rows, each row weighted by its time since the row
    before (rows where a rate is NaN left out), and ``updates_per_s`` the mean ``train_fps`` over
    the samples per update of those rows.

    A row's rates are each host's counter change over its own heartbeat times since the row
    before (docs/metrics.md), so a row that comes late, or the last one with the hosts' final
    heartbeats, covers all the time since the previous row: the means exist as soon as one row
    shows an update (an unweighted mean over the rows after the first update needed two such
    rows, and a short synchronous run on a loaded machine once had one), and a driver stalled
    for seconds shifts only the weights. Counters over row times would not do: after a stall a
    row can hold counters seconds older than its time."""
    first = rate_rows(ds)
    if isinstance(first, str):
        return dict.fromkeys((*THROUGHPUTS, "updates_per_s"), math.nan)
    t = ds.time.values
    weight = t[first:] - t[first - 1 : -1]
    out = {}
    for name in THROUGHPUTS:
        r = ds[name].values[first:]
        known = np.isfinite(r)
        out[name] = float(np.sum(r[known] * weight[known]) / np.sum(weight[known])) if known.any() else math.nan
    updates = float(ds.updates.values[-1] - ds.updates.values[first - 1])
    samples = float(ds.samples.values[-1] - ds.samples.values[first - 1])
    out["updates_per_s"] = out["train_fps"] * updates / samples if samples > 0 else math.nan
    return out


def best_return(ds: xr.Dataset) -> float:
    r = ds.return_mean_100.values
    return float(np.nanmax(r)) if np.isfinite(r).any() else math.nan


def variants_from(args) -> list[tuple[str, str, str]]:
    """(name, config, mode) per variant; the default: CONFIG relaxed and synchronous."""
    if not args.variant:
        return [(mode, args.config, mode) for mode in MODES]
    names = [v[0] for v in args.variant]
    if len(set(names)) != len(names):
        raise SystemExit(f"ablation.py: variant names repeat ({', '.join(names)}); give each its own name")
    for name, config, mode in args.variant:
        if mode not in MODES:
            raise SystemExit(f"ablation.py: --variant {name} {config} {mode}: the mode is one of {', '.join(MODES)}")
        if not Path(config).is_file():
            raise SystemExit(f"ablation.py: --variant {name}: no config file {config}")
    return [tuple(v) for v in args.variant]


def plot(path: Path, runs: list[tuple[str, int, xr.Dataset]], rows: list[dict], names: list[str], target) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), layout="constrained")
    for name, seed, ds in runs:
        i = names.index(name)
        axes[0].plot(ds.time, ds.return_mean_100, color=f"C{i}", label=f"{name}, seed {seed}")
    if target is not None:
        axes[0].axhline(target, color="k", ls=":", lw=1, label=f"target {target:g}")
    axes[0].set_xlabel("wall time since start [s]")
    axes[0].set_ylabel("mean return of the last 100 episodes")
    axes[0].legend(fontsize="small")
    width = 0.8 / len(names)
    x = np.arange(len(THROUGHPUTS))
    for i, name in enumerate(names):
        med = [statistics.median(r[k] for r in rows if r["variant"] == name) for k in THROUGHPUTS]
        axes[1].bar(x + i * width, med, width, color=f"C{i}", label=name)
    axes[1].set_xticks(x + width * (len(names) - 1) / 2, ["sample (env steps/s)", "receive (/s)", "train (samples/s)"])
    axes[1].set_yscale("log")
    axes[1].set_ylabel("median rate after the first update")
    axes[1].legend(fontsize="small")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", default="configs/cartpole_dqn.yaml")
    p.add_argument(
        "--variant",
        nargs=3,
        action="append",
        metavar=("NAME", "CONFIG", "MODE"),
        help="a configuration to run (repeatable; replaces the default CONFIG relaxed + synchronous)",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/ablation"))
    p.add_argument("--runs", type=Path, default=Path("runs/benchmarks"))
    args = p.parse_args(argv)
    variants = variants_from(args)
    names = [v[0] for v in variants]

    def config_of(name: str, config: str, mode: str, seed: int):
        overrides = [
            *args.overrides,
            f"topology.mode={mode}",
            f"seed={seed}",
            f"stop.max_seconds={args.seconds}",
            "run.checkpoint=false",
        ]
        try:
            return load_config(config, overrides)
        except ConfigError as exc:
            raise SystemExit(f"ablation.py: variant {name}: {exc}") from None

    for seed in args.seeds:  # every config is checked before the first run starts
        for v in variants:
            config_of(*v, seed)
    args.out.mkdir(parents=True, exist_ok=True)
    args.runs.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="ablation-", dir=args.runs))
    rows, runs = [], []
    for seed in args.seeds:
        for name, config, mode in variants:
            cfg = config_of(name, config, mode, seed)
            load0 = os.getloadavg()[0]
            run = train(cfg, out=root / f"{name}-seed{seed}")
            res = run.wait()
            ds = run.metrics()
            runs.append((name, seed, ds))
            row = {
                "variant": name,
                "config": config,
                "mode": mode,
                "seed": seed,
                "status": res.status,
                "error": res.error,
                "time_to_target_s": res.time_to_target_s,
                "best_return_mean_100": best_return(ds),
                "env_steps": res.env_steps,
                "return_mean_100": res.return_mean_100,
                **mean_rates(ds),
                "run_dir": portable_path(res.run_dir),
                "load_avg_1m_before": load0,
                "load_avg_1m_after": os.getloadavg()[0],
            }
            rows.append(row)
            if isinstance(why := rate_rows(ds), str):
                print(f"{name:>11} seed {seed}: no rates: {why}", flush=True)
            print(
                f"{name:>11} seed {seed}: {row['status']:>14}  train {row['train_fps']:8.0f} samples/s  "
                f"updates {row['updates_per_s']:6.0f}/s  sample {row['env_fps']:7.0f} steps/s  "
                f"time to target {row['time_to_target_s']:5.1f} s  best {row['best_return_mean_100']:5.1f}  "
                f"load {load0:.2f}",
                flush=True,
            )
    base = names[-1]
    summary = {}
    for key in RATES:
        med = {n: statistics.median([r[key] for r in rows if r["variant"] == n]) for n in names}
        ratios = {
            n: statistics.median(
                [
                    r[key] / b[key]
                    for r in rows
                    if r["variant"] == n
                    for b in rows
                    if b["variant"] == base and b["seed"] == r["seed"]
                ]
            )
            for n in names[:-1]
        }
        summary[key] = {"median": med, f"median_ratio_over_{base}": ratios}
    for key, s in summary.items():
        meds = "  ".join(f"{n} {v:9.1f}" for n, v in s["median"].items())
        ratios = "  ".join(f"{n}/{base} {v:.2f}" for n, v in s[f"median_ratio_over_{base}"].items())
        print(f"{key:>20}: {meds}  {ratios}")
    meta = {
        "variants": [list(v) for v in variants],
        "overrides": args.overrides,
        "seconds": args.seconds,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": f"{os.cpu_count()} cores",
        **provenance_attrs(),
    }
    (args.out / "ablation.json").write_text(
        json.dumps({"meta": meta, "runs": rows, "summary": summary}, indent=2, default=str)
    )
    grid = {k: np.full((len(names), len(args.seeds)), np.nan) for k in RATES}
    for r in rows:
        for k in RATES:
            grid[k][names.index(r["variant"]), args.seeds.index(r["seed"])] = r[k]
    ds = xr.Dataset(
        {k: (("variant", "seed"), grid[k], {"long_name": ln, "units": u}) for k, (ln, u) in RATES.items()},
        coords={
            "variant": names,
            "seed": args.seeds,
            "config": ("variant", [v[1] for v in variants]),
            "mode": ("variant", [v[2] for v in variants]),
        },
        attrs={k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()},
    )
    ds.to_netcdf(args.out / "ablation.nc", engine="netcdf4")
    plot(args.out / "ablation.png", runs, rows, names, runs[0][2].attrs.get("target_return") if runs else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
