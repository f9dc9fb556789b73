"""HalfCheetah-v5 after 1M env steps: the mean return of the last 100 episodes and the wall time,
the measure the MuJoCo results of cleanrl, stable-baselines3 and Sample Factory report.

    python benchmarks/halfcheetah_1m.py configs/halfcheetah_ppo.yaml --seeds 0 1 2 \\
        --out benchmarks/results/halfcheetah_1m_2core
    python benchmarks/halfcheetah_1m.py configs/halfcheetah_ppo_16core.yaml --seeds 0 1 2 \\
        --out benchmarks/results/halfcheetah_1m_16core
    python benchmarks/halfcheetah_1m.py configs/halfcheetah_ppo.yaml --seeds 0 --env-steps 20000 \\
        --out benchmarks/results/tmp/halfcheetah_smoke                # a smoke run: proves the wiring

Needs the mujoco extra (pip install 'tianji-dask[mujoco]'). Each seed is one distributed run on
its own LocalCluster, stopped at ``--env-steps`` (all actors together; ``stop.max_env_steps``),
timed from just before the cluster is built. Besides the return it records the steps the learner
trained on (``samples``) and the rollouts dropped as stale (``stale_dropped``), since the actors'
env steps count them too. Writes ``halfcheetah_1m.json`` and ``halfcheetah_1m.nc`` (dim ``seed``)
into ``--out`` after every run and prints the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import xarray as xr

from tianji_dask.config import load_config
from tianji_dask.results.recorder import provenance_attrs
from tianji_dask.runtime.driver import train

VARIABLES = {
    "return_mean_100": ("mean return of the last 100 episodes at the end", "1"),
    "wall_s": ("wall time of the run (start-up included)", "s"),
    "env_steps": ("env steps of all actors", "1"),
    "samples": ("transitions the learner trained on", "1"),
    "stale_dropped": ("transitions dropped as stale, never trained on", "1"),
    "env_steps_per_s": ("env steps per second over the run", "1/s"),
}


def one_run(config: str, overrides: list[str], seed: int, env_steps: int, runs: Path) -> dict:
    stop = ["stop.target_return=null", f"stop.max_env_steps={env_steps}", "stop.max_seconds=86400"]
    cfg = load_config(config, [*stop, *overrides, f"seed={seed}"])
    res = train(cfg, out=runs / f"seed{seed}").wait()
    with xr.open_dataset(res.run_dir / "metrics.nc", engine="netcdf4") as ds:
        stale = float(ds["stale_dropped"].values[-1])
    # the final checkpoint's metadata counts the learner's samples (the run's checkpoint is on)
    final = res.run_dir / "checkpoint" / "checkpoint.json"
    samples = float(json.loads(final.read_text())["samples"]) if final.exists() else float("nan")
    return {
        "seed": seed,
        "status": res.status,
        "error": res.error,
        "return_mean_100": res.return_mean_100,
        "wall_s": res.wall_s,
        "env_steps": res.env_steps,
        "env_steps_per_s": res.env_steps / res.wall_s,
        "samples": samples,
        "stale_dropped": stale,
        "run_dir": str(res.run_dir),
        "load_avg_1m": os.getloadavg()[0],
    }


def write(out: Path, rows: list[dict], meta: dict) -> dict:
    ok = [r for r in rows if not r["error"]]
    summary = {
        "runs": len(rows),
        "failed": len(rows) - len(ok),
        **{f"median_{k}": statistics.median(r[k] for r in ok) if ok else float("nan") for k in VARIABLES},
    }
    (out / "halfcheetah_1m.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "runs": rows}, indent=2, default=str)
    )
    seeds = [r["seed"] for r in rows]
    ds = xr.Dataset(
        {
            k: ("seed", np.array([r[k] for r in rows], float), {"long_name": n, "units": u})
            for k, (n, u) in VARIABLES.items()
        },
        coords={"seed": seeds},
        attrs={k: json.dumps(v) if not isinstance(v, (int, float, str)) else v for k, v in meta.items()},
    )
    ds.to_netcdf(out / "halfcheetah_1m.nc", engine="netcdf4")
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", default="configs/halfcheetah_ppo.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--env-steps", type=int, default=1_000_000)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/halfcheetah_1m"))
    p.add_argument(
        "--runs", type=Path, default=Path("runs/benchmarks"), help="where the runs' own directories go (not committed)"
    )
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = args.runs / f"halfcheetah-{time.strftime('%Y%m%d-%H%M%S')}"
    meta = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": f"{os.cpu_count()} cores",
        "config": args.config,
        "overrides": args.overrides,
        "env_steps": args.env_steps,
        **provenance_attrs(),
    }
    rows: list[dict] = []
    summary: dict = {}
    for seed in args.seeds:
        r = one_run(args.config, args.overrides, seed, args.env_steps, runs)
        rows.append(r)
        print(
            f"seed {seed}: {r['status']:>13}  return(100) {r['return_mean_100']:8.1f}  wall {r['wall_s']:7.1f} s  "
            f"env steps {r['env_steps']:>9,}  trained {r['samples']:>11,.0f}  stale {r['stale_dropped']:>9,.0f}  "
            f"load {r['load_avg_1m']:.2f} {r['error'] or ''}",
            flush=True,
        )
        summary = write(args.out, rows, meta)
    print(
        f"median over {summary['runs'] - summary['failed']} runs: return(100) {summary['median_return_mean_100']:.1f} "
        f"after {summary['median_env_steps']:,.0f} env steps in {summary['median_wall_s']:.1f} s"
    )
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
