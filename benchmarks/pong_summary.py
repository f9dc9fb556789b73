"""Pong runs to a return target, summed up: time to target per seed and its median (a run that
missed the target counts as the budget, a lower bound), the best 100-episode mean within the
time budget, and the return curves.

    python benchmarks/pong_summary.py --ppo RUN_DIR... --dqn RUN_DIR... --budget SECONDS --out OUT

Reads run directories (``metrics.nc`` + ``episodes.nc``, as ``tianji-dask train`` and
``pong_race.sh`` write them). Writes ``<out>/pong_summary.json`` and ``<out>/pong_summary.png``
(return against wall time and against env steps, every run, the target and the budget marked),
and, with ``--run-pngs``, a ``return.png`` in each run directory (return against time and env
steps, and throughput). Time to target is recomputed from the episodes by the recorder's rule
(``ds.tianji.time_to_target``), so it holds for runs stopped before their own target too.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from tianji_dask.results.analysis import RunNotFound, open_run


def _num(x) -> float | None:
    x = float(x)
    return None if math.isnan(x) else round(x, 3)


def run_summary(ds, target: float, budget_s: float) -> dict:
    """One run's figures: time and env steps at ``target``, best mean within ``budget_s``."""
    cfg = ds.tianji.config
    within = ds.sel(time=slice(None, budget_s))
    r = within["return_mean_100"].values
    best = int(np.nanargmax(r)) if np.isfinite(r).any() else None
    ttt = float(ds.tianji.time_to_target(target))
    steps_at_target = math.nan
    if not math.isnan(ttt):
        steps_at_target = float(ds["env_steps"].sel(time=ttt, method="nearest"))
    ends = ds["episode_wall_time"].values <= budget_s
    medians = {v: _num(within[v].where(within[v] > 0).median()) for v in ("env_fps", "receive_fps", "train_fps")}
    windowed = all(v in ds for v in ("train_fps", "receive_fps", "updates"))  # runs from 2026-11-29 on
    ratio = ds.tianji.replay_ratio(10.0) if windowed else None
    if ratio is not None and ratio.notnull().any():
        medians["replay_ratio_10s_min"], medians["replay_ratio_10s_max"] = _num(ratio.min()), _num(ratio.max())
    return {
        "run": ds.attrs.get("run_name", Path(ds.attrs["run_dir"]).name),
        "dir": Path(ds.attrs["run_dir"]).name,
        "algo": cfg.get("algo.name"),
        "seed": cfg.get("seed"),
        "actors": cfg.get("topology.actors"),
        "envs_per_actor": cfg.get("env.num_envs"),
        "learner_device": cfg.get("learner.device"),
        "duration_s": _num(ds["time"].max()),
        "env_steps": int(ds["env_steps"].max()),
        "time_to_target_s": _num(ttt) if ttt <= budget_s else None,
        "env_steps_at_target": _num(steps_at_target) if ttt <= budget_s else None,
        "best_return_mean_100": None if best is None else _num(r[best]),
        "best_at_s": None if best is None else _num(within["time"][best]),
        "best_at_env_steps": None if best is None else int(within["env_steps"][best]),
        "best_episode_return": _num(ds["episode_return"].where(ends).max()),
        "episodes": int(ends.sum()),
        "median_throughput": medians,
    }


def plot_runs(runs: list, target: float, budget_s: float, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), layout="constrained")
    for i, (ds, s) in enumerate(runs):
        label = f"{s['algo'].upper()} seed {s['seed']}"
        for ax, x in zip(axes, ("time", "env_steps")):
            xs = ds["time"] if x == "time" else ds["env_steps"]
            ax.plot(xs, ds["return_mean_100"], color=f"C{i}", label=label)
    for ax, xlabel in zip(axes, ("wall time since start [s]", "env steps (all actors)")):
        ax.axhline(target, color="k", ls=":", lw=1, label=f"target {target:g}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean return of the last 100 episodes")
    axes[0].axvline(budget_s, color="grey", ls="--", lw=1, label=f"budget {budget_s:g} s")
    axes[0].legend(fontsize="small")
    fig.suptitle("Pong: 100-episode mean full-game return")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_one(ds, s: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2), layout="constrained")
    ds.tianji.plot_return(ax=axes[0])
    ds.tianji.plot_return(x="env_steps", ax=axes[1])
    ds.tianji.plot_throughput(ax=axes[2])
    for ax in axes[:2]:
        ax.axhline(float(ds.attrs.get("target_return", 18.0)), color="k", ls=":", lw=1)
    fig.suptitle(
        f"{s['algo'].upper()} Pong, seed {s['seed']}: {s['actors']} actors x "
        f"{s['envs_per_actor']} envs, learner on {s['learner_device']}"
    )
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ppo", nargs="*", default=[], metavar="DIR", help="PPO run directories")
    p.add_argument("--dqn", nargs="*", default=[], metavar="DIR", help="DQN run directories")
    p.add_argument("--target", type=float, default=18.0, help="return target (default 18)")
    p.add_argument(
        "--budget", type=float, default=1800.0, help="wall-time budget in seconds (default 1800, the 30-minute bar)"
    )
    p.add_argument("--out", required=True, help="directory for pong_summary.json and .png")
    p.add_argument("--run-pngs", action="store_true", help="also write return.png in each run dir")
    a = p.parse_args(argv)
    if not a.ppo and not a.dqn:
        p.error("no runs: pass run directories with --ppo and/or --dqn")
    if a.budget <= 0:
        p.error(f"--budget {a.budget:g}: must be positive seconds")

    runs = []
    for algo, dirs in (("ppo", a.ppo), ("dqn", a.dqn)):
        for d in dirs:
            try:
                ds = open_run(d)
            except RunNotFound as e:
                print(f"pong_summary.py: {e}", file=sys.stderr)
                return 2
            s = run_summary(ds, a.target, a.budget)
            if s["algo"] != algo:
                print(
                    f"pong_summary.py: {d} is a {s['algo']} run, passed as --{algo}; pass it with --{s['algo']}",
                    file=sys.stderr,
                )
                return 2
            runs.append((ds, s))

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"target": a.target, "budget_s": a.budget, "runs": [s for _, s in runs]}
    for algo in ("ppo", "dqn"):
        ss = [s for _, s in runs if s["algo"] == algo]
        if not ss:
            continue
        times = [s["time_to_target_s"] for s in ss if s["time_to_target_s"] is not None]
        bests = [s["best_return_mean_100"] for s in ss if s["best_return_mean_100"] is not None]
        # a run that missed the target counts as the budget: a lower bound of its time
        bounded = [a.budget if s["time_to_target_s"] is None else s["time_to_target_s"] for s in ss]
        median = statistics.median(bounded)
        summary[algo] = {
            "runs": len(ss),
            "reached_target": len(times),
            "median_time_to_target_s": median,
            "median_is_lower_bound": len(times) <= len(ss) // 2,  # the median's run(s) missed
            "time_to_target_s": times,
            "median_best_return_mean_100": statistics.median(bests) if bests else None,
        }
    (out / "pong_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_runs(runs, a.target, a.budget, out / "pong_summary.png")
    if a.run_pngs:
        for ds, s in runs:
            plot_one(ds, s, Path(ds.attrs["run_dir"]) / "return.png")

    for _, s in runs:
        reached = (
            f"{a.target:g} at {s['time_to_target_s']:.1f} s"
            if s["time_to_target_s"]
            else f"best {s['best_return_mean_100']} at {s['best_at_s']} s"
        )
        print(
            f"{s['algo']} seed {s['seed']} ({s['dir']}): {reached}, "
            f"{s['env_steps']:,} env steps in {s['duration_s']:.0f} s"
        )
    for algo in ("ppo", "dqn"):
        if algo in summary:
            m = summary[algo]
            at_least = "at least " if m["median_is_lower_bound"] else ""
            print(
                f"{algo}: median time to {a.target:g}: {at_least}{m['median_time_to_target_s']:.1f} s "
                f"({m['reached_target']} of {m['runs']} runs reached it; a miss counts as the {a.budget:g}-s budget)"
            )
    print(f"wrote {out / 'pong_summary.json'} and {out / 'pong_summary.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
