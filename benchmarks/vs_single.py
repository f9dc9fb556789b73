"""Pong: tianji-dask against the single-process alternative, side by side on one machine.

    python benchmarks/vs_single.py --seeds 5 6 7 --max-seconds 300 --out benchmarks/results/ppo_vs_single
    python benchmarks/vs_single.py --config configs/pong_dqn.yaml --seeds 1 --max-seconds 900 \
        --single-max-seconds 1200 --out benchmarks/results/dqn_vs_single
    python benchmarks/vs_single.py --seeds 5 --set topology.actors=2      # --set goes to tianji-dask

Per seed, both systems train to a 100-episode mean return of ``--target`` (18) or for
``--max-seconds`` (the single process for ``--single-max-seconds``, by default the same), one
after the other, the order alternating from seed to seed so both see the same machine
conditions: the single process (PPO: ``benchmarks/peers/ppo_pong_single.py``; DQN:
``benchmarks/dqn_pong_single.py`` with the config's hyperparameters and as many envs as the
config's actors have (PPO: as many as one learner iteration's rollouts hold); one synchronous
process, the ale-py vector env on all cores, inference and training on the GPU; its clock starts
just before its env and network are built) and ``benchmarks/time_to_target.py`` on ``--config``
(its clock starts just before the LocalCluster is built). Before them, the raw rate of the
emulator: ale-py's vector env stepping random actions for ``--ale-seconds``, with the single
script's envs on all cores, and with the config's envs on its ``env.atari_threads`` (every
actor's envs on all their threads: what tianji-dask's actors make together is compared with this
one: ``actor_share_of_raw_ale``, their median ``env_fps`` after the first update over it).

``--continue`` adds seeds to the race already in ``--out`` (same config, overrides, target and
limits; the runs it has are kept, and the order goes on alternating): a race longer than one
device call runs as one seed per call. Without it, an ``--out`` that holds a race is refused.

Writes into ``--out``, after every run (a stopped benchmark keeps what it measured):
``vs_single.json`` (every run, the raw ALE rates, the medians and their ratios; a run that
missed the target counts as longer than its time limit, which can make a median a lower
bound and a ratio an upper bound, flagged ``*_at_least`` / ``*_at_most``),
``vs_single.nc`` (dims ``system`` x ``seed``) and ``return.png`` (the 100-episode mean
return against wall time and against env steps, both systems, every seed). Run it detached on
the GPU machine and poll ``<out>/bench.log`` (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import xarray as xr

from tianji_dask.config import load_config

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SYSTEMS = ("tianji", "single")


def raw_ale_rate(seconds: float, envs: int, threads: int) -> float:
    """Env steps/s of ale-py's vector env (Pong, DeepMind preprocessing) with random actions."""
    from ale_py.vector_env import AtariVectorEnv

    env = AtariVectorEnv("pong", num_envs=envs, num_threads=threads, autoreset_mode="SameStep")
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.step(rng.integers(0, env.single_action_space.n, envs))
        n += envs
    rate = n / (time.perf_counter() - t0)
    env.close()
    return rate


def single_command(args) -> tuple[list[str], int, str]:
    """The single-process script and its arguments but the seed (either script with the
    hyperparameters of ``--config`` that it takes, and the config's envs: a DQN config's actors'
    envs together), its envs, and the config's algorithm."""
    limits = ["--target", str(args.target), "--max-seconds", str(args.single_max_seconds or args.max_seconds)]
    cfg = load_config(ROOT / args.config, args.overrides, check_env=False, check_device=False)
    algo = cfg.algo
    if algo.name == "ppo":
        script = HERE / "peers" / "ppo_pong_single.py"
        # a learner iteration trains on rollouts_per_update rollouts of num_envs envs each: the
        # single process steps that many envs, so an update holds the same transitions
        envs = args.envs or cfg.env.num_envs * algo.rollouts_per_update
        hyper = {
            "--envs": envs,
            "--steps": algo.rollout_steps,
            "--epochs": algo.epochs,
            "--minibatches": algo.minibatches,
            "--lr": algo.lr,
            "--anneal-steps": algo.lr_anneal_steps or 0,
        }
    else:
        if algo.exploration != "linear" or algo.replay != "uniform":
            raise SystemExit(
                f"--config {args.config}: the single DQN script has only uniform replay and a decaying epsilon"
            )
        script = HERE / "dqn_pong_single.py"
        envs = args.envs or cfg.topology.actors * cfg.env.num_envs
        hyper = {
            "--envs": envs,
            "--gamma": algo.gamma,
            "--n-step": algo.n_step,
            "--lr": algo.lr,
            "--batch-size": algo.batch_size,
            "--buffer-size": algo.buffer_size,
            "--learning-starts": algo.learning_starts,
            "--train-freq": algo.train_freq,
            "--gradient-steps": algo.gradient_steps,
            "--target-update-interval": algo.target_update_interval,
            "--initial-eps": algo.exploration_initial_eps,
            "--final-eps": algo.exploration_final_eps,
            "--exploration-steps": algo.exploration_steps,
            "--max-grad-norm": algo.max_grad_norm,
        }
    flags = [str(x) for kv in hyper.items() for x in kv]
    return [str(script), *flags, "--threads", str(args.threads), *limits], envs, algo.name


def run_single(seed: int, args, log: Path) -> dict:
    cmd = [sys.executable, "-u", *args.single, "--seed", str(seed)]
    with log.open("w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("{")]
    if rc != 0 or not lines:
        return {"system": "single", "seed": seed, "error": f"exit {rc}, see {log}"}
    res = json.loads(lines[-1])
    curve = res.get("curve", [])
    return {
        "system": "single",
        "seed": seed,
        "time_to_target_s": res["seconds_to_target"] if res["seconds_to_target"] is not None else math.nan,
        "env_steps_to_target": res["env_steps_to_target"] if res["env_steps_to_target"] is not None else math.nan,
        "wall_s": res["wall_s"],
        "env_steps": res["env_steps"],
        "env_steps_per_s": res["env_steps_per_s"],
        "curve": {"time": [c[0] for c in curve], "env_steps": [c[1] for c in curve], "return": [c[2] for c in curve]},
    }


def run_tianji(seed: int, args, out: Path, log: Path) -> dict:
    cmd = [sys.executable, "-u", str(HERE / "time_to_target.py"), args.config, "--modes", "distributed"]
    cmd += ["--seeds", str(seed), "--out", str(out), "--runs", str(out / "runs")]
    target = "null" if args.target is None else args.target  # None: no target (a budget of env steps)
    for s in [f"stop.target_return={target}", f"stop.max_seconds={args.max_seconds}", *args.overrides]:
        cmd += ["--set", s]
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    result = out / "time_to_target.json"
    if rc != 0 or not result.exists():
        return {"system": "tianji", "seed": seed, "error": f"exit {rc}, see {log}"}
    row = json.loads(result.read_text())["runs"][0]
    # time_to_target.py ran in ROOT: a run directory below it is written relative to it
    with xr.open_dataset(ROOT / row["run_dir"] / "metrics.nc") as ds:
        curve = {
            "time": ds.time.values.tolist(),
            "env_steps": ds.env_steps.values.tolist(),
            "return": ds.return_mean_100.values.tolist(),
        }
        rates = in_run_rates(ds)
        best = float(ds.return_mean_100.where(ds.episodes >= 100).max()) if "episodes" in ds else math.nan
    return {
        "system": "tianji",
        "seed": seed,
        "time_to_target_s": row["time_to_target_s"],
        "env_steps_to_target": row["env_steps_to_target"],
        "wall_s": row["wall_s"],
        "env_steps": row["env_steps"],
        "env_steps_per_s": row["env_steps"] / row["wall_s"],
        "return_mean_100": row["return_mean_100"],
        "best_return_mean_100": best,
        "run_dir": row["run_dir"],
        "curve": curve,
        **rates,
    }


def in_run_rates(ds: xr.Dataset) -> dict[str, float]:
    """A tianji-dask run's rates once its learner has updated (medians over the metrics rows:
    the actors' env steps/s, the learner's samples/s per wall second and per second of update
    time, its busy share, ...) and the env steps it dropped as stale in all."""
    steady = ds.where(ds.updates > 0) if "updates" in ds else ds
    out = {
        f"median_{name}": float(steady[name].median())
        for name in ("env_fps", "train_fps", "train_fps_in_updates", "train_busy", "receive_fps", "policy_lag_mean")
        if name in steady
    }
    if "stale_dropped" in ds:
        out["median_stale_dropped"] = float(ds.stale_dropped.max())
    return out


def medians(rows: list[dict], system: str, max_seconds: float) -> dict:
    """Medians over a system's runs. A run that missed the target counts as taking longer than
    ``max_seconds`` (and more env steps than it made): the median is then a lower bound
    (``*_at_least``) whenever the middle run is one of those."""
    mine = [r for r in rows if r["system"] == system and "error" not in r]
    if not mine:
        return {"runs": 0, "reached": 0}
    missed = [math.isnan(r["time_to_target_s"]) for r in mine]
    times = sorted((math.inf if m else r["time_to_target_s"], m) for r, m in zip(mine, missed))
    steps = sorted((r["env_steps"] if m else r["env_steps_to_target"], m) for r, m in zip(mine, missed))
    mid = len(mine) // 2  # an odd number of runs: the middle one; even: the upper middle, conservatively
    time_median, time_censored = times[mid]
    steps_median, steps_censored = steps[mid]
    return {
        "runs": len(mine),
        "reached": missed.count(False),
        "median_time_to_target_s": max_seconds if time_censored else time_median,
        "median_time_to_target_at_least": time_censored,
        "median_env_steps_to_target": steps_median,
        "median_env_steps_to_target_at_least": steps_censored,
        "median_env_steps_per_s": statistics.median([r["env_steps_per_s"] for r in mine]),
    }


def compare(rows: list[dict], systems: tuple[str, str], limits: Mapping[str, float]) -> dict:
    """Each system's :func:`medians` (``limits``: each system's time limit, for runs that missed
    the target), and the ratios of the first system's median time and env steps to target to
    the second's. A censored median makes a ratio a bound: the second system's an upper one
    (``*_at_most``), the first's a lower one (``*_at_least``)."""
    summary: dict = {s: medians(rows, s, limits[s]) for s in systems}
    a, b = (summary[s] for s in systems)
    for key, flag, name in (
        ("median_time_to_target_s", "median_time_to_target_at_least", "time_to_target"),
        ("median_env_steps_to_target", "median_env_steps_to_target_at_least", "env_steps_to_target"),
    ):
        if a.get("runs") and b.get("runs"):
            summary[f"ratio_{name}"] = a[key] / b[key]
            summary[f"ratio_{name}_at_most"] = b[flag] and not a[flag]
            summary[f"ratio_{name}_at_least"] = a[flag] and not b[flag]
    return summary


def system_seed_grid(rows: list[dict], systems: tuple[str, ...], seeds: list[int], key: str) -> np.ndarray:
    """``key`` of each run as a (system, seed) array, NaN where a run lacks it."""
    g = np.full((len(systems), len(seeds)), np.nan)
    for r in rows:
        if key in r:
            g[systems.index(r["system"]), seeds.index(r["seed"])] = r[key]
    return g


def alternate(
    seeds: list[int],
    systems: tuple[str, ...],
    run: Callable[[str, int], dict],
    save: Callable[[list[dict]], dict],
    rows: list[dict] | None = None,
) -> dict:
    """Per seed, ``run(system, seed)`` for both systems one after the other, the order alternating
    from seed to seed so both see the same machine conditions; each run's row gets the load
    average after it, is printed, and ``save(rows)`` (which returns the summary) runs after every
    run, so a stopped benchmark keeps what it measured. ``rows``: the runs of a race being
    continued; its seeds count for the alternation. Returns the last summary."""
    rows = list(rows or [])
    summary: dict = {}
    done = len({r["seed"] for r in rows})
    for i, seed in enumerate(seeds, start=done):
        for system in systems if i % 2 == 0 else systems[::-1]:
            t0 = time.time()
            r = run(system, seed)
            r["load_avg_1m"] = os.getloadavg()[0]
            rows.append(r)
            print(
                f"{system:>6} seed {seed}: time to target {r.get('time_to_target_s', math.nan):6.1f} s, "
                f"env steps {r.get('env_steps_to_target', math.nan):>11,.0f}, "
                f"{r.get('env_steps_per_s', math.nan):7,.0f} env steps/s, run {time.time() - t0:5.0f} s "
                f"{r.get('error') or ''}",
                flush=True,
            )
            summary = save(rows)
    return summary


RACE_KEYS = ("config", "overrides", "target", "max_seconds", "single_max_seconds")


def continued(
    out: Path,
    meta: dict,
    seeds: list[int],
    go_on: bool,
    *,
    name: str = "vs_single.json",
    systems: tuple[str, ...] = SYSTEMS,
    keys: tuple[str, ...] = RACE_KEYS,
) -> tuple[list[dict], list[int], list[dict]]:
    """(the runs kept, the seeds still to run, the raw ALE measurements kept) for a race into
    ``out`` (its ``name``, of ``systems``): nothing kept for a new race. An ``out`` holding a race
    is continued only with ``go_on`` (``--continue``) and only if it is the same race (``keys`` of
    ``meta``); anything else is a ``SystemExit`` naming the fix, before any run."""
    path = out / name
    if not path.exists():
        return [], seeds, []
    if not go_on:
        raise SystemExit(f"--out {out} holds a race already: add --continue to add seeds to it, or give another --out")
    try:
        old = json.loads(path.read_text())
        old_meta, rows = old["meta"], old["runs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--continue: {path} is not a race's result ({exc!r}): give another --out") from None
    differs = [k for k in keys if old_meta.get(k) != meta.get(k)]
    if differs:
        said = ", ".join(f"{k} {old_meta.get(k)!r} there, {meta.get(k)!r} now" for k in differs)
        raise SystemExit(f"--continue: the race in {out} is another one ({said}): give the same flags or another --out")
    finished = {(r["seed"], r["system"]) for r in rows if "error" not in r}
    ran = {seed for seed, _ in finished if all((seed, system) in finished for system in systems)}
    rows = [
        r for r in rows if r["seed"] in ran and "error" not in r
    ]  # a seed with a failed run runs again, both systems
    return rows, [s for s in seeds if s not in ran], list(old_meta.get("raw_ale", []))


def run_meta(args) -> dict:
    """What every race records of itself: when, the machine's cores, the tianji-dask config and
    its overrides, the target and the time limit."""
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": f"{os.cpu_count()} cores",
        "config": args.config,
        "overrides": args.overrides,
        "target": args.target,
        "max_seconds": args.max_seconds,
    }


def actor_share(rows: list[dict], raw_rate: float) -> float:
    """tianji-dask's actor rate inside its runs (the median of each run's median ``env_fps``
    after the first update) over the raw ALE rate of its envs and threads."""
    rates = [r["median_env_fps"] for r in rows if r["system"] == "tianji" and "median_env_fps" in r]
    return statistics.median(rates) / raw_rate if rates and raw_rate > 0 else math.nan


def write(out: Path, rows: list[dict], meta: dict, seeds: list[int]) -> dict:
    summary = compare(rows, SYSTEMS, {"tianji": meta["max_seconds"], "single": meta["single_max_seconds"]})
    summary["actor_share_of_raw_ale"] = actor_share(rows, meta.get("raw_ale_config_env_steps_per_s", math.nan))
    (out / "vs_single.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": rows}, indent=2))
    units = {"time_to_target_s": "s", "env_steps_to_target": "1", "env_steps_per_s": "1/s"}
    ds = xr.Dataset(
        {k: (("system", "seed"), system_seed_grid(rows, SYSTEMS, seeds, k), {"units": u}) for k, u in units.items()},
        coords={"system": list(SYSTEMS), "seed": seeds},
        attrs={k: json.dumps(v) if not isinstance(v, (int, float, str)) else v for k, v in meta.items()},
    )
    ds.to_netcdf(out / "vs_single.nc", engine="netcdf4")
    plot(out / "return.png", rows, meta.get("target", 18.0), meta["algo"])
    return summary


def plot(path: Path, rows: list[dict], target: float, algo: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    colours = {"tianji": "tab:blue", "single": "tab:orange"}
    for r in rows:
        if "curve" not in r:
            continue
        c = r["curve"]
        label = f"{r['system']} seed {r['seed']}"
        axes[0].plot(c["time"], c["return"], color=colours[r["system"]], alpha=0.8, label=label)
        axes[1].plot(c["env_steps"], c["return"], color=colours[r["system"]], alpha=0.8, label=label)
    for ax, xlabel in zip(axes, ["wall time [s]", "env steps"]):
        ax.axhline(target, color="grey", lw=0.8, ls="--")
        ax.set(xlabel=xlabel, ylabel="100-episode mean return", ylim=(-21, 21))
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{algo.upper()} Pong: tianji-dask (blue) and the single-process script (orange)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[5, 6, 7])
    p.add_argument("--config", default="configs/pong_ppo.yaml")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="a config override KEY=VALUE (the single script takes the hyperparameters it changes too)",
    )
    p.add_argument("--target", type=float, default=18.0)
    p.add_argument("--max-seconds", type=float, default=300.0)
    p.add_argument("--single-max-seconds", type=float, help="the single process's limit (default --max-seconds)")
    p.add_argument("--envs", type=int, help="the single script's envs (default: the config's; DQN: its actors x envs)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="its env threads (and the raw ALE rate's)")
    p.add_argument("--ale-seconds", type=float, default=10.0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/vs_single"))
    p.add_argument("--continue", dest="go_on", action="store_true", help="add the seeds to the race in --out")
    args = p.parse_args(argv)
    if not (ROOT / args.config).is_file():
        p.error(f"--config {args.config}: no such file under {ROOT}")
    args.single, envs, algo = single_command(args)  # a bad config stops here, before any run
    meta = {
        **run_meta(args),
        "single_max_seconds": args.single_max_seconds or args.max_seconds,
        "algo": algo,
        "single_command": args.single,
    }
    rows, todo, raw = continued(args.out, meta, args.seeds, args.go_on)
    seeds = sorted({r["seed"] for r in rows}, key=[r["seed"] for r in rows].index) + todo
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(ROOT / args.config, args.overrides, check_env=False, check_device=False)
    # all the actors' envs on all their threads (at most the machine's cores)
    actors = cfg.topology.actors
    config_envs = actors * cfg.env.num_envs
    config_threads = min(actors * (cfg.env.atari_threads or 1), os.cpu_count() or 1)
    for who, n, threads in (("single", envs, args.threads), ("config", config_envs, config_threads)):
        rate = raw_ale_rate(args.ale_seconds, n, threads)
        raw.append({"for": who, "envs": n, "threads": threads, "env_steps_per_s": rate, "seeds": todo})
        print(f"raw ALE: {rate:,.0f} env steps/s, {n} envs on {threads} threads ({who})", flush=True)
    for who, key in (("single", "raw_ale_env_steps_per_s"), ("config", "raw_ale_config_env_steps_per_s")):
        meta[key] = statistics.median(m["env_steps_per_s"] for m in raw if m["for"] == who)
    meta["raw_ale"] = raw

    def run(system: str, seed: int) -> dict:
        if system == "single":
            return run_single(seed, args, args.out / f"single-seed{seed}.log")
        return run_tianji(seed, args, args.out / f"tianji-seed{seed}", args.out / f"tianji-seed{seed}.log")

    def save(done: list[dict]) -> dict:
        return write(args.out, done, meta, seeds)

    summary = alternate(todo, SYSTEMS, run, save, rows) if todo else save(rows)
    print(json.dumps(summary, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
