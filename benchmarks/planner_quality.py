"""Planner quality: the plan's measured training throughput against a grid of allocations at
the same core budget (issue 5; the paper's Fig. 6c/d question: does the strategy find the best
mapping?).

    python benchmarks/planner_quality.py configs/cartpole_dqn.yaml --cores 16 --seconds 15

Steps, all in one process on one machine: profile the config on a LocalCluster of ``--cores``
single-threaded workers; plan for ``--cores``; then run the plan and every grid point
(groups G x actors A x learner threads T with G * (A + T) = cores) for ``--seconds`` each on
a fresh LocalCluster, and measure training throughput as the median ``train_fps`` (samples
consumed per second, all learners) over the rows from 1 s after the first update to 1 s before
the end (cluster start and warm-up are not measured; ``--startup-seconds`` allows for them).
Writes ``<out>/planner_quality.nc`` (dim ``allocation``), ``.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def grid(cores: int) -> list[tuple[int, int, int]]:
    """(G, A, T) with G * (A + T) = cores: per group size m, 1 actor and m/2 actors (and m - 1
    for a single group)."""
    out = set()
    for G in (1, 2, 4, 8, 16):
        if cores % G or cores // G < 2:
            continue
        m = cores // G
        for A in {1, m // 2} | ({m - 1} if G == 1 else set()):
            if 1 <= A <= m - 1:
                out.add((G, A, m - A))
    return sorted(out)


def measure(cfg, G: int, A: int, T: int, seconds: float, out_root: Path, startup_s: float) -> dict:
    """Run one allocation for ``startup_s + seconds``; rates are medians over the rows from 1 s
    after the learners' first update to 1 s before the end (start-up excluded)."""
    from tianji_dask.config import apply_overrides, validate_config
    from tianji_dask.runtime.driver import train

    data = apply_overrides(
        cfg.model_dump(mode="json"),
        [
            f"topology.groups={G}",
            f"topology.actors={A}",
            "topology.learners=1",
            f"topology.learner_threads={T}",
            "stop.target_return=null",
            "stop.max_env_steps=null",
            f"stop.max_seconds={startup_s + seconds}",
            "run.checkpoint=false",
        ],
    )
    run_cfg = validate_config(data)
    load = os.getloadavg()[0]
    res = train(run_cfg, out=out_root / f"G{G}-A{A}-T{T}").wait()
    import xarray as xr

    with xr.open_dataset(Path(res.run_dir) / "metrics.nc", engine="netcdf4") as ds:
        t = ds.time.values
        fps, sps = ds.train_fps.values, ds.env_fps.values
        training = np.nonzero(ds.updates.values > 0)[0]
        t_first = float(t[training[0]]) if len(training) else float("nan")
        keep = (t >= t_first + 1.0) & (t < t[-1] - 1.0) & np.isfinite(fps)
        train_fps = float(np.median(fps[keep])) if keep.sum() >= 3 else float("nan")
        env_fps = float(np.nanmedian(sps[keep])) if keep.sum() >= 3 else float("nan")
    return {
        "groups": G,
        "actors": A,
        "learner_threads": T,
        "status": res.status,
        "error": res.error,
        "train_fps": train_fps,
        "env_fps": env_fps,
        "first_update_s": t_first,
        "rows_measured": int(keep.sum()),
        "load_avg_1m": load,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("--cores", type=int, default=os.cpu_count())
    p.add_argument("--seconds", type=float, default=15.0, help="measured seconds per allocation")
    p.add_argument(
        "--startup-seconds",
        type=float,
        default=15.0,
        help="allowance added to each run for cluster start and warm-up (not measured)",
    )
    p.add_argument("--profile-seconds", type=float, default=2.0)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    import xarray as xr
    from distributed import Client

    from tianji_dask.config import load_config
    from tianji_dask.deploy import profiling
    from tianji_dask.deploy.planner import Profile, Resources, make_plan
    from tianji_dask.results.provenance import provenance_attrs
    from tianji_dask.runtime.cluster.cluster import local_cluster

    cfg = load_config(args.config, args.overrides)
    out = args.out or Path("benchmarks/results") / f"planner_{cfg.env.id.split('-')[0].lower()}_{cfg.algo.name}"
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    with (
        local_cluster(args.cores) as cluster,
        Client(cluster) as client,
    ):
        prof_ds = profiling.profile(cfg, client, seconds=args.profile_seconds, log=print)
    profiling.save(prof_ds, out / "profile.nc")
    print(profiling.describe(prof_ds), flush=True)
    plan = make_plan(cfg, Profile.from_dataset(prof_ds), Resources(cores=args.cores))
    print("\n".join(plan.explanation), flush=True)
    chosen = (plan.groups, plan.actors, plan.learner_threads)
    points = grid(args.cores)
    if chosen not in points:
        points.append(chosen)
    rows = []
    with tempfile.TemporaryDirectory(prefix="planner-quality-") as tmp:
        for G, A, T in points:
            r = measure(cfg, G, A, T, args.seconds, Path(tmp), args.startup_seconds)
            r["is_plan"] = chosen == (G, A, T)
            rows.append(r)
            print(
                f"G={G:2d} A={A:2d} T={T:2d}{' (plan)' if r['is_plan'] else '       '}  train {r['train_fps']:10,.0f} "
                f"samples/s  sample {r['env_fps']:10,.0f} env steps/s  first update {r['first_update_s']:.1f} s, "
                f"{r['rows_measured']} rows  {r['status']}  load {r['load_avg_1m']:.1f}",
                flush=True,
            )
    plan_row = next(r for r in rows if r["is_plan"])
    best = max(rows, key=lambda r: -1 if np.isnan(r["train_fps"]) else r["train_fps"])
    ratio = plan_row["train_fps"] / best["train_fps"]
    summary = {
        "plan": {
            "groups": plan.groups,
            "actors": plan.actors,
            "learner_threads": plan.learner_threads,
            "predicted": plan.predicted,
            "bottleneck": plan.bottleneck,
            "explanation": plan.explanation,
        },
        "plan_train_fps": plan_row["train_fps"],
        "best": best,
        "plan_over_best": ratio,
        "bar": 0.9,
        "pass": bool(ratio >= 0.9),
        "cores": args.cores,
        "seconds_per_run": args.seconds,
        "wall_s": time.time() - t_start,
    }
    print(json.dumps({k: summary[k] for k in ("plan_train_fps", "plan_over_best", "pass")}), flush=True)

    labels = [f"G{r['groups']}xA{r['actors']}xT{r['learner_threads']}" for r in rows]
    ds = xr.Dataset(
        {
            "train_fps": (
                "allocation",
                [r["train_fps"] for r in rows],
                {"long_name": "training throughput (median train_fps, steady part)", "units": "samples/s"},
            ),
            "env_fps": (
                "allocation",
                [r["env_fps"] for r in rows],
                {"long_name": "sample throughput (median env_fps)", "units": "env steps/s"},
            ),
            "groups": ("allocation", [r["groups"] for r in rows], {"long_name": "groups G", "units": "1"}),
            "actors": ("allocation", [r["actors"] for r in rows], {"long_name": "actors per group A", "units": "1"}),
            "learner_threads": (
                "allocation",
                [r["learner_threads"] for r in rows],
                {"long_name": "learner torch threads T", "units": "1"},
            ),
            "is_plan": (
                "allocation",
                [int(r["is_plan"]) for r in rows],
                {"long_name": "the planner's choice", "units": "1"},
            ),
            "load_avg_1m": (
                "allocation",
                [r["load_avg_1m"] for r in rows],
                {"long_name": "1-minute load average before the run", "units": "1"},
            ),
        },
        coords={"allocation": ("allocation", labels, {"long_name": "groups x actors x learner threads", "units": "1"})},
        attrs={
            "title": "planner quality: plan vs grid at the same core budget",
            "cores": args.cores,
            "plan_over_best": ratio,
            "config_json": cfg.to_json(),
            "machine": platform.platform(),
            "cpu_count": os.cpu_count(),
            **{k: str(v) for k, v in provenance_attrs().items()},
        },
    )
    from tianji_dask.results.recorder import write_netcdf_atomic

    write_netcdf_atomic(ds, out / "planner_quality.nc")
    (out / "planner_quality.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1, default=str))
    _plot(rows, plan, labels, out / "planner_quality.png", cfg, args.cores)
    print(f"wrote {out}/planner_quality.nc, .json, .png", flush=True)
    return 0


def _plot(rows, plan, labels, path, cfg, cores) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(rows)), 4))
    vals = [r["train_fps"] for r in rows]
    colors = ["tab:red" if r["is_plan"] else "tab:blue" for r in rows]
    ax.bar(range(len(rows)), vals, color=colors)
    ax.axhline(plan.predicted["train_samples_per_s"], color="tab:red", ls="--", lw=1, label="plan: predicted")
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("training throughput (samples/s)")
    ax.set_title(f"{cfg.algo.name.upper()} {cfg.env.id}, {cores} cores: plan (red) vs grid")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
