"""Staleness: the paper's Fig. 6d at small scale. PPO on CartPole, two resource mappings x two
sample distributions, return over wall time.

    python benchmarks/staleness.py                      # 4 runs of 30 s, seed 0
    python benchmarks/staleness.py --seconds 60 --seeds 0 1 2

Sample distributions (configs, not code):
  new        configs/cartpole_ppo.yaml            sample_reuse 1, max_policy_lag 1 (1:1)
  staleness  configs/cartpole_ppo_staleness.yaml  sample_reuse 8, max_policy_lag 8 (1:8)
Resource mappings on a 2-core machine (the learner shares a worker process with its buffer):
  balanced        topology.actors=1: 1 actor + 1 learner, one core each (the planner's balance)
  oversubscribed  topology.actors=3: 3 actors + 1 learner on 2 cores

Every run has ``stop.target_return=null`` and ``stop.max_seconds=--seconds`` so all curves are
equally long. Wall time is measured from the run's start, so it includes the LocalCluster's
start-up (reported per run as ``startup_s``: time of the first metrics row with env steps).
Runs are ordered seed by seed, and within a seed mapping by mapping, so the settings of one
seed see similar machine conditions; the 1-minute load average is recorded before and after
every run (this machine's 2 cores may be shared).

Writes to ``--out`` (default benchmarks/results/staleness):
  staleness.nc    dims mapping x distribution x seed x time (bins of --grid s, default 0.5):
                  return_mean_100, env_steps, updates, stale_dropped (held at each bin's end),
                  policy_lag_mean, sample_age_s (mean of the metric rows inside each bin)
  staleness.json  per run: final return, time to reach 200, mean policy lag, stale-dropped
                  fraction, env steps, load averages; plus meta (versions, git commit)
  staleness.png   return over wall time, one line per setting (plus env steps and policy lag)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import xarray as xr

from tianji_dask.config import load_config
from tianji_dask.results.provenance import portable_path, provenance_attrs
from tianji_dask.runtime.driver import train

DISTRIBUTIONS = {"new": "configs/cartpole_ppo.yaml", "staleness": "configs/cartpole_ppo_staleness.yaml"}
DIST_LABEL = {"new": "New (1:1)", "staleness": "Staleness (1:8)"}
MAPPINGS = {"balanced": ["topology.actors=1"], "oversubscribed": ["topology.actors=3"]}
MAPPING_LABEL = {"balanced": "balanced: 1 actor + 1 learner", "oversubscribed": "oversubscribed: 3 actors + 1 learner"}
RETURN_GOAL = 200.0

HELD = ("return_mean_100", "env_steps", "updates", "stale_dropped")  # levels/totals: value at bin end
BINNED = ("policy_lag_mean", "sample_age_s")  # per-heartbeat window means: mean over the bin's rows
VAR_ATTRS = {
    "return_mean_100": ("mean return of the last min(100, n) episodes, at the end of the bin", "1"),
    "env_steps": ("env steps produced by all actors, at the end of the bin", "1"),
    "updates": ("learner minibatch updates, at the end of the bin", "1"),
    "stale_dropped": ("transitions the buffer dropped unused (too stale or no room), at the end of the bin", "1"),
    "policy_lag_mean": (
        "mean policy lag of the rollouts trained on during the bin (learner version - rollout version)",
        "1",
    ),
    "sample_age_s": ("mean age of the rollouts trained on during the bin", "s"),
}


def time_to_return(eps: xr.Dataset, goal: float) -> float:
    """Seconds from the run start until the mean of the last min(100, n) episodes first reaches
    ``goal`` with at least 100 episodes finished (the project's time-to-target rule); NaN if never."""
    ret = eps["return"].values
    if len(ret) < 100:
        return math.nan
    csum = np.concatenate([[0.0], np.cumsum(ret)])
    n = np.arange(1, len(ret) + 1)
    lo = np.maximum(n - 100, 0)
    means = (csum[n] - csum[lo]) / (n - lo)
    hit = np.flatnonzero((means >= goal) & (n >= 100))
    return float(eps["wall_time"].values[hit[0]]) if hit.size else math.nan


def resample(ds: xr.Dataset, edges: np.ndarray) -> dict[str, np.ndarray]:
    """Metrics rows onto bins ending at ``edges[1:]``."""
    t = ds["time"].values
    ends = edges[1:]
    out = {}
    last = np.searchsorted(t, ends, side="right") - 1  # the last row at or before each bin end
    for var in HELD:
        v = ds[var].values.astype(float)
        out[var] = np.where(last >= 0, v[np.clip(last, 0, None)], np.nan)
    which = np.searchsorted(edges, t, side="left") - 1  # row at t goes to the bin (edges[i], edges[i+1]]
    for var in BINNED:
        v = ds[var].values.astype(float)
        col = np.full(len(ends), np.nan)
        for i in range(len(ends)):
            sel = v[(which == i) & ~np.isnan(v)]
            if sel.size:
                col[i] = sel.mean()
        out[var] = col
    return out


def one_run(
    mapping: str, dist: str, seed: int, seconds: float, overrides: list[str], runs_root: Path
) -> tuple[dict, xr.Dataset]:
    cfg = load_config(
        DISTRIBUTIONS[dist],
        [
            *MAPPINGS[mapping],
            "stop.target_return=null",
            "stop.max_env_steps=null",
            f"stop.max_seconds={seconds}",
            "run.checkpoint=false",
            f"seed={seed}",
            *overrides,
        ],
    )
    load_before = os.getloadavg()[0]
    run = train(cfg, out=runs_root / f"{mapping}-{dist}-seed{seed}")
    res = run.wait()
    ds, eps = run.metrics(), run.episodes()
    env_steps = float(ds["env_steps"].values[-1])
    upd = ds["updates"].values.astype(float)
    lag = ds["policy_lag_mean"].values.astype(float)
    w = np.diff(np.concatenate([[0.0], np.nan_to_num(upd)]))  # updates in each row's window
    ok = ~np.isnan(lag) & (w > 0)
    lag_mean = float(np.sum(lag[ok] * w[ok]) / np.sum(w[ok])) if ok.any() else math.nan
    lag_max = float(np.nanmax(ds["policy_lag_max"].values)) if ok.any() else math.nan
    age = ds["sample_age_s"].values.astype(float)
    ok_age = ~np.isnan(age) & (w > 0)
    age_mean = float(np.sum(age[ok_age] * w[ok_age]) / np.sum(w[ok_age])) if ok_age.any() else math.nan
    stepped = np.flatnonzero(ds["env_steps"].values > 0)
    dropped = float(ds["stale_dropped"].values[-1])
    updates_per_iter = cfg.algo.epochs * cfg.algo.minibatches
    row = {
        "mapping": mapping,
        "distribution": dist,
        "seed": seed,
        "status": res.status,
        "error": res.error,
        "actors": cfg.topology.actors,
        "sample_reuse": cfg.algo.sample_reuse,
        "max_policy_lag": cfg.algo.max_policy_lag,
        "wall_s": res.wall_s,
        "startup_s": float(ds["time"].values[stepped[0]]) if stepped.size else math.nan,
        "final_return_mean_100": res.return_mean_100,
        "time_to_200_s": time_to_return(eps, RETURN_GOAL),
        "episodes": int(eps.sizes["episode"]),
        "env_steps": env_steps,
        "learner_iterations": float(upd[-1]) / updates_per_iter,
        "policy_lag_mean": lag_mean,
        "policy_lag_max": lag_max,
        "sample_age_mean_s": age_mean,
        "stale_dropped": dropped,
        "stale_dropped_fraction": dropped / env_steps if env_steps > 0 else math.nan,
        "load_avg_1m_before": load_before,
        "load_avg_1m_after": os.getloadavg()[0],
        "run_dir": portable_path(res.run_dir),
    }
    return row, ds


def plot(out: xr.Dataset, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = out["time"].values
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), gridspec_kw={"width_ratios": [2, 1, 1]})
    colors = {"balanced": "tab:blue", "oversubscribed": "tab:red"}
    styles = {"new": "-", "staleness": "--"}
    for m in out["mapping"].values:
        for d in out["distribution"].values:
            sel = out.sel(mapping=m, distribution=d)
            label = f"{MAPPING_LABEL[m]}, {DIST_LABEL[d]}"
            for k, var in enumerate(("return_mean_100", "env_steps", "policy_lag_mean")):
                ax = axes[k]
                v = sel[var].values  # (seed, time)
                if v.shape[0] > 1:
                    for s in v:
                        ax.plot(t, s, color=colors[m], ls=styles[d], lw=0.6, alpha=0.35)
                with np.errstate(all="ignore"):
                    mean = np.nanmean(v, axis=0) if v.shape[0] > 1 else v[0]
                ax.plot(t, mean, color=colors[m], ls=styles[d], lw=2, label=label if k == 0 else None)
    axes[0].axhline(RETURN_GOAL, color="grey", lw=0.8, ls=":")
    axes[0].set(
        xlabel="wall time since run start (s, cluster start-up included)",
        ylabel="return, mean of last 100 episodes",
        title="CartPole PPO: return over wall time",
    )
    axes[0].legend(loc="lower right", fontsize=8)
    axes[1].set(xlabel="wall time (s)", ylabel="env steps (all actors)", title="env steps produced")
    axes[2].set(
        xlabel="wall time (s)", ylabel="policy lag of trained rollouts (versions)", title="policy lag (bin mean)"
    )
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.set_xlim(0, float(out["time"].values[-1]))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0, help="stop.max_seconds of every run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--grid", type=float, default=0.5, help="time-bin width in seconds")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="extra config overrides")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/staleness"))
    p.add_argument(
        "--runs", type=Path, default=Path("runs/benchmarks"), help="where the runs' own directories go (not committed)"
    )
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.runs.mkdir(parents=True, exist_ok=True)
    runs_root = Path(tempfile.mkdtemp(prefix="staleness-", dir=args.runs))
    mappings, dists, seeds = list(MAPPINGS), list(DISTRIBUTIONS), args.seeds
    n_bins = int(math.ceil(args.seconds / args.grid - 1e-9))
    edges = np.arange(n_bins + 1) * args.grid
    load_start = os.getloadavg()
    data = {v: np.full((len(mappings), len(dists), len(seeds), n_bins), np.nan) for v in (*HELD, *BINNED)}
    rows = []
    for si, seed in enumerate(seeds):
        for mi, m in enumerate(mappings):
            for di, d in enumerate(dists):
                row, ds = one_run(m, d, seed, args.seconds, args.overrides, runs_root)
                rows.append(row)
                for var, col in resample(ds, edges).items():
                    data[var][mi, di, si] = col
                print(
                    f"{m:>14} {d:>9} seed {seed}: {row['status']:>11}  return {row['final_return_mean_100']:6.1f}  "
                    f"to 200 {row['time_to_200_s']:5.1f} s  steps {row['env_steps']:>8,.0f}  "
                    f"iters {row['learner_iterations']:6.0f}  lag {row['policy_lag_mean']:.2f}  "
                    f"dropped {row['stale_dropped_fraction']:.0%}  load {row['load_avg_1m_before']:.2f}"
                    f"->{row['load_avg_1m_after']:.2f}",
                    flush=True,
                )
    meta = {
        "benchmark": "staleness (TianJi Fig. 6d, small scale)",
        "seconds": args.seconds,
        "grid_s": args.grid,
        "seeds": seeds,
        "overrides": args.overrides,
        "distributions": DISTRIBUTIONS,
        "mappings": {k: v for k, v in MAPPINGS.items()},
        "return_goal": RETURN_GOAL,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": f"{os.cpu_count()} cores",
        "load_avg_at_start": list(load_start),
        "load_avg_at_end": list(os.getloadavg()),
        **provenance_attrs(),
    }
    (args.out / "staleness.json").write_text(json.dumps({"meta": meta, "runs": rows}, indent=2, default=str))
    variables = {
        v: (
            ("mapping", "distribution", "seed", "time"),
            data[v],
            {"long_name": VAR_ATTRS[v][0], "units": VAR_ATTRS[v][1]},
        )
        for v in (*HELD, *BINNED)
    }
    out = xr.Dataset(
        variables,
        coords={
            "mapping": ("mapping", mappings, {"long_name": "resource mapping", "units": "1"}),
            "distribution": ("distribution", dists, {"long_name": "sample distribution", "units": "1"}),
            "seed": ("seed", seeds, {"long_name": "root seed", "units": "1"}),
            "time": ("time", edges[1:], {"long_name": "end of the time bin, since run start", "units": "s"}),
        },
        attrs={k: (v if isinstance(v, str) else json.dumps(v)) for k, v in meta.items()},
    )
    out.to_netcdf(args.out / "staleness.nc", engine="netcdf4")
    plot(
        out,
        args.out / "staleness.png",
        f"{len(seeds)} seed(s), {args.seconds:g} s per run, {os.cpu_count()} cores, load avg at start "
        f"{load_start[0]:.2f}; git {meta['git_commit']}",
    )
    print(f"wrote {args.out / 'staleness.nc'}, {args.out / 'staleness.json'}, {args.out / 'staleness.png'}")
    return 0 if all(r["error"] is None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
