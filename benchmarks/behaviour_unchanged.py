"""Behaviour unchanged across a refactoring: time to target of two commits, side by side.

    python benchmarks/behaviour_unchanged.py --before 7b75dee
    python benchmarks/behaviour_unchanged.py --before 7b75dee --after HEAD --seeds 0 1 2 \\
        --configs configs/cartpole_dqn.yaml configs/cartpole_ppo.yaml

Each commit is checked out into its own git worktree (a temporary directory) and runs its own
``benchmarks/time_to_target.py`` on its own copy of each config, distributed mode, one seed at
a time, with ``PYTHONPATH`` pointing at that worktree (the current virtual environment
supplies the dependencies). The commits alternate, and which one goes first alternates from
seed to seed, so both see the same machine conditions. Writes
``<out>/behaviour_unchanged.json`` and ``.nc`` (dims ``commit`` x ``config`` x ``seed``) and
prints, per config and commit, the median and the range; exit 1 if a run missed its target.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import xarray as xr

ROOT = Path(__file__).resolve().parent.parent


def resolve(ref: str) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", f"{ref}^{{commit}}"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"behaviour_unchanged: {ref!r} is not a commit of {ROOT} ({out.stderr.strip()})")
    return out.stdout.strip()


def add_worktree(commit: str, parent: Path) -> Path:
    path = parent / commit
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), commit], cwd=ROOT, check=True)
    return path


def one_run(checkout: Path, config: str, seed: int, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    cmd = [sys.executable, "benchmarks/time_to_target.py", config, "--seeds", str(seed), "--modes", "distributed"]
    cmd += ["--out", str(out), "--runs", str(out / "runs")]
    done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    result = out / "time_to_target.json"
    if not result.exists():
        raise SystemExit(f"behaviour_unchanged: {' '.join(cmd)} in {checkout} wrote no result:\n{done.stderr[-3000:]}")
    (row,) = json.loads(result.read_text())["runs"]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="the commit before the change")
    p.add_argument("--after", default="HEAD", help="the commit after it (default HEAD)")
    p.add_argument("--configs", nargs="+", default=["configs/cartpole_dqn.yaml", "configs/cartpole_ppo.yaml"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/behaviour_unchanged"))
    args = p.parse_args(argv)
    commits = [resolve(args.before), resolve(args.after)]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="behaviour-") as tmp:
        checkouts = {c: add_worktree(c, Path(tmp)) for c in commits}
        try:
            for config in args.configs:
                for i, seed in enumerate(args.seeds):
                    for commit in commits if i % 2 == 0 else commits[::-1]:
                        out = Path(tmp) / "out" / commit / Path(config).stem / str(seed)
                        r = one_run(checkouts[commit], config, seed, out)
                        r.update(commit=commit, config=config)
                        rows.append(r)
                        print(
                            f"{commit} {config} seed {seed}: {r['status']:>15}  time to target "
                            f"{r['time_to_target_s']:6.1f} s  steps {r['env_steps_to_target']:>9,.0f}  "
                            f"load {r['load_avg_1m']:.2f}",
                            flush=True,
                        )
        finally:
            for path in checkouts.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)
    summary = []
    for config in args.configs:
        for commit in commits:
            t = [r["time_to_target_s"] for r in rows if r["config"] == config and r["commit"] == commit]
            reached = [x for x in t if not math.isnan(x)]
            summary.append(
                {
                    "config": config,
                    "commit": commit,
                    "reached": f"{len(reached)}/{len(t)}",
                    "median_s": statistics.median(reached) if reached else math.nan,
                    "min_s": min(reached) if reached else math.nan,
                    "max_s": max(reached) if reached else math.nan,
                }
            )
            s = summary[-1]
            print(
                f"{config} {commit}: median {s['median_s']:.1f} s (range {s['min_s']:.1f}-{s['max_s']:.1f}), "
                f"reached {s['reached']}"
            )
    meta = {
        "before": commits[0],
        "after": commits[1],
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": f"{os.cpu_count()} cores",
    }
    (args.out / "behaviour_unchanged.json").write_text(
        json.dumps({"meta": meta, "runs": rows, "summary": summary}, indent=2, default=str)
    )

    def grid(key: str) -> np.ndarray:
        a = np.full((len(commits), len(args.configs), len(args.seeds)), np.nan)
        for r in rows:
            a[commits.index(r["commit"]), args.configs.index(r["config"]), args.seeds.index(r["seed"])] = r[key]
        return a

    dims = ("commit", "config", "seed")
    described = {
        "time_to_target_s": ("wall time to target", "s"),
        "env_steps_to_target": ("env steps at target", "1"),
        "load_avg_1m": ("1-minute load average after the run", "1"),
    }
    ds = xr.Dataset(
        {k: (dims, grid(k), {"long_name": name, "units": units}) for k, (name, units) in described.items()},
        coords={"commit": commits, "config": args.configs, "seed": args.seeds},
        attrs=meta,
    )
    ds.to_netcdf(args.out / "behaviour_unchanged.nc", engine="netcdf4")
    return 0 if all(not math.isnan(r["time_to_target_s"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
