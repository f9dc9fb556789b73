"""A plan made on this machine against the config as written: time to target, side by side.

    python benchmarks/plan_vs_default.py configs/cartpole_dqn.yaml --seeds 0 1 2

Profiles the config on a LocalCluster of this machine's cores, plans for those cores, then runs
the default config and the planned one for each seed, alternating (distributed mode, cluster
start included, as benchmarks/time_to_target.py times them). Writes
``<out>/plan_vs_default.json``, ``.nc`` (dims ``variant`` x ``seed``), the profile and the plan.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np


def _time_to_target_module():
    spec = importlib.util.spec_from_file_location("time_to_target", Path(__file__).with_name("time_to_target.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--profile-seconds", type=float, default=2.0)
    p.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=None,
        help="DQN batch sizes the profile measures and the plan may choose (default: the config's)",
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    import xarray as xr
    from distributed import Client

    from tianji_dask.config import load_config
    from tianji_dask.deploy import profiling
    from tianji_dask.deploy.planner import Profile, Resources, make_plan, save_plan
    from tianji_dask.results.recorder import write_netcdf_atomic
    from tianji_dask.runtime.cluster.cluster import local_cluster

    cfg = load_config(args.config)
    out = args.out or Path("benchmarks/results") / f"plan_vs_default_{cfg.algo.name}"
    out.mkdir(parents=True, exist_ok=True)
    with (
        local_cluster(args.cores) as cluster,
        Client(cluster) as client,
    ):
        prof = profiling.profile(cfg, client, seconds=args.profile_seconds, batch_sizes=args.batch_sizes, log=print)
    profiling.save(prof, out / "profile.nc")
    plan = make_plan(cfg, Profile.from_dataset(prof), Resources(cores=args.cores))
    save_plan(plan, out / "plan.yaml")
    print("\n".join(plan.explanation), flush=True)
    plan_overrides = [f"{k}={v}" for k, v in plan.overrides().items()]
    ttt = _time_to_target_module()
    rows = []
    with tempfile.TemporaryDirectory(prefix="plan-vs-default-") as tmp:
        for i, seed in enumerate(args.seeds):
            order = [("default", []), ("plan", plan_overrides)]
            for variant, over in order if i % 2 == 0 else order[::-1]:
                r = ttt.one_run(args.config, over, seed, "distributed", Path(tmp) / variant)
                r["variant"] = variant
                rows.append(r)
                print(
                    f"{variant:8s} seed {seed}: time to target {r['time_to_target_s']:.1f} s "
                    f"({r['status']}, load {r['load_avg_1m']:.2f})",
                    flush=True,
                )
    summary = {}
    for variant in ("default", "plan"):
        t = [r["time_to_target_s"] for r in rows if r["variant"] == variant]
        summary[variant] = {"times_s": t, "median_s": statistics.median(t) if not any(np.isnan(t)) else float("nan")}
    summary["plan_at_least_as_fast"] = bool(summary["plan"]["median_s"] <= summary["default"]["median_s"])
    summary["plan"]["overrides"] = plan.overrides()
    # a plan may well be the config as written: then the comparison is of two identical setups
    planned = load_config(args.config, plan_overrides)

    def effective(c):
        t = c.topology
        return t.groups, t.actors, t.learners, t.learner_torch_threads, c.algo.model_dump()

    summary["same_allocation"] = effective(cfg) == effective(planned)
    print(json.dumps(summary, indent=1), flush=True)
    variants, seeds = ["default", "plan"], args.seeds
    grid = np.full((2, len(seeds)), np.nan)
    for r in rows:
        grid[variants.index(r["variant"]), seeds.index(r["seed"])] = r["time_to_target_s"]
    ds = xr.Dataset(
        {
            "time_to_target_s": (
                ("variant", "seed"),
                grid,
                {"long_name": "time to the config's target return", "units": "s"},
            )
        },
        coords={
            "variant": ("variant", variants, {"long_name": "config as written, or planned", "units": "1"}),
            "seed": ("seed", seeds, {"long_name": "seed", "units": "1"}),
        },
        attrs={"plan_overrides": json.dumps(plan.overrides()), "cores": args.cores, "config": args.config},
    )
    write_netcdf_atomic(ds, out / "plan_vs_default.nc")
    (out / "plan_vs_default.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
