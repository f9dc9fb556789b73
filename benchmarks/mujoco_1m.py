"""MuJoCo tasks after 1M env steps: the mean return of the last 100 episodes and the wall time,
the measure the MuJoCo results of cleanrl, stable-baselines3 and Sample Factory report.

    python benchmarks/mujoco_1m.py configs/halfcheetah_ppo_16core.yaml --seeds 0 1 2 \\
        --envs HalfCheetah-v5 Hopper-v5 Walker2d-v5 --sb3 --out benchmarks/results/mujoco_16core_<yyyymmdd>
    python benchmarks/mujoco_1m.py configs/halfcheetah_ppo.yaml --seeds 0 1 2 --envs HalfCheetah-v5 \\
        --out benchmarks/results/halfcheetah_1m_2core
    python benchmarks/mujoco_1m.py configs/halfcheetah_ppo.yaml --seeds 0 --env-steps 20000 \\
        --out benchmarks/results/tmp/mujoco_smoke                     # a smoke run: proves the wiring

Needs the mujoco extra (pip install 'tianji-dask[mujoco]'). One config serves every task, as
cleanrl's ``ppo_continuous_action.py`` runs them all with its defaults: each ``--envs`` id is the
config with ``env.id`` set. Each (env, seed) is one distributed run on its own LocalCluster,
stopped at ``--env-steps`` (all actors together; ``stop.max_env_steps``), timed from just before
the cluster is built; runs go env by env, seed by seed. Besides the return it records the steps
the learner trained on (``samples``) and the transitions dropped as stale (``stale_dropped``),
since the actors' env steps count them too.

``--sb3``: stable-baselines3's PPO with rl-baselines3-zoo's HalfCheetah hyperparameters
(``benchmarks/peers/ppo_sb3.py``) for the same seeds and env-step budget, each right after
tianji-dask's run of that seed, in ``--sb3-python`` (as ``pendulum_vs_sb3.py``).

``--merge A/mujoco_1m.json B/mujoco_1m.json ...`` runs nothing: it writes the outputs of the runs of
earlier invocations together (a measurement split over leases or machines), refusing an (env,
seed) measured twice.

Writes into ``--out`` after every run: ``summary.json`` (per env id: ``median_return``,
``median_wall_s``, ``seeds``, the runs' returns and wall times, cleanrl's published return for
the -v4 task, and stable-baselines3's medians where run), ``mujoco_1m.json`` (every run),
``mujoco_1m.nc`` (dims ``system`` x ``env`` x ``seed``) and ``mujoco_1m.png`` (the 100-episode
mean return against env steps and against wall time, one panel pair per env).
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
from pathlib import Path

import numpy as np
import xarray as xr

from tianji_dask.config import load_config
from tianji_dask.results.provenance import portable_path, provenance_attrs
from tianji_dask.runtime.driver import train

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
ENVS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")
SYSTEMS = ("tianji", "sb3")
#: cleanrl's ppo_continuous_action.py after 1M steps, mean +- std over seeds, its -v4 tasks
#: (docs.cleanrl.dev, PPO's MuJoCo table)
CLEANRL = {"HalfCheetah-v5": (1442.64, 46.03), "Hopper-v5": (2382.86, 271.74), "Walker2d-v5": (2287.95, 571.78)}
VARIABLES = {
    "return_mean_100": ("mean return of the last 100 episodes at the end", "1"),
    "wall_s": ("wall time of the run (start-up included)", "s"),
    "env_steps": ("env steps of all actors", "1"),
    "samples": ("transitions the learner trained on", "1"),
    "stale_dropped": ("transitions dropped as stale, never trained on", "1"),
    "env_steps_per_s": ("env steps per second over the run", "1/s"),
}


def run_tianji(config: str, overrides: list[str], env_id: str, seed: int, env_steps: int, runs: Path) -> dict:
    stop = ["stop.target_return=null", f"stop.max_env_steps={env_steps}", "stop.max_seconds=86400"]
    cfg = load_config(config, [*stop, *overrides, f"env.id={env_id}", f"seed={seed}"])
    res = train(cfg, out=runs / f"{env_id}-seed{seed}").wait()
    with xr.open_dataset(res.run_dir / "metrics.nc", engine="netcdf4") as ds:
        stale = float(ds["stale_dropped"].values[-1])
    with xr.open_dataset(res.run_dir / "episodes.nc", engine="netcdf4") as eps:
        returns = eps["return"].values
        curve = {
            "time": eps["wall_time"].values.tolist(),
            "env_steps": eps["env_steps"].values.tolist(),
            "return": _running_mean_100(returns),
        }
    # the final checkpoint's metadata counts the learner's samples (the run's checkpoint is on)
    final = res.run_dir / "checkpoint" / "checkpoint.json"
    samples = float(json.loads(final.read_text())["samples"]) if final.exists() else math.nan
    return {
        "system": "tianji",
        "env": env_id,
        "seed": seed,
        "status": res.status,
        "error": res.error,
        "return_mean_100": res.return_mean_100,
        "wall_s": res.wall_s,
        "env_steps": res.env_steps,
        "env_steps_per_s": res.env_steps / res.wall_s,
        "samples": samples,
        "stale_dropped": stale,
        "run_dir": portable_path(res.run_dir),
        "load_avg_1m": os.getloadavg()[0],
        "curve": curve,
    }


def run_sb3(env_id: str, seed: int, env_steps: int, python: Path, log: Path) -> dict:
    cmd = [str(python), "-u", str(HERE / "peers" / "ppo_sb3.py"), "--env", env_id, "--seed", str(seed)]
    cmd += ["--max-env-steps", str(env_steps), "--max-seconds", "86400"]
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("{")]
    base = {"system": "sb3", "env": env_id, "seed": seed, "load_avg_1m": os.getloadavg()[0]}
    if rc != 0 or not lines:
        return {**base, "status": "failed", "error": f"exit {rc}, see {log}"}
    res = json.loads(lines[-1])
    t, steps, mean = zip(*res["curve"], strict=True) if res["curve"] else ((), (), ())
    return {
        **base,
        "status": "max_env_steps",
        "error": None,
        "return_mean_100": res["return_mean_100"],
        "wall_s": res["wall_s"],
        "env_steps": res["env_steps"],
        "env_steps_per_s": res["env_steps_per_s"],
        "samples": res["env_steps"],
        "stale_dropped": 0.0,
        "curve": {"time": list(t), "env_steps": list(steps), "return": list(mean)},
    }


def _running_mean_100(returns: np.ndarray) -> list[float]:
    c = np.concatenate([[0.0], np.cumsum(returns, dtype=float)])
    n = np.arange(1, len(returns) + 1)
    lo = np.maximum(n - 100, 0)
    return ((c[n] - c[lo]) / (n - lo)).tolist()


def summarise(rows: list[dict]) -> dict:
    """Per env id: tianji-dask's medians and runs, cleanrl's figure, stable-baselines3's medians."""
    out: dict = {}
    for env_id in dict.fromkeys(r["env"] for r in rows):
        entry: dict = {}
        for system in SYSTEMS:
            ok = [r for r in rows if r["env"] == env_id and r["system"] == system and not r["error"]]
            if not ok:
                continue
            medians = {
                "median_return": statistics.median(r["return_mean_100"] for r in ok),
                "median_wall_s": statistics.median(r["wall_s"] for r in ok),
                "median_env_steps_per_s": statistics.median(r["env_steps_per_s"] for r in ok),
                "seeds": [r["seed"] for r in ok],
                "returns": [r["return_mean_100"] for r in ok],
                "wall_s": [r["wall_s"] for r in ok],
                "stale_dropped": [r["stale_dropped"] for r in ok],
            }
            if system == "tianji":
                entry.update(medians)
            else:
                entry["stable_baselines3"] = medians
        if env_id in CLEANRL:
            entry["cleanrl_return"], entry["cleanrl_std"] = CLEANRL[env_id]
        out[env_id] = entry
    return out


def write(out: Path, rows: list[dict], meta: dict) -> dict:
    summary = summarise(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "mujoco_1m.json").write_text(json.dumps({"meta": meta, "runs": rows}, indent=2, default=str))
    envs = list(dict.fromkeys(r["env"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})
    data = {k: np.full((len(SYSTEMS), len(envs), len(seeds)), np.nan) for k in VARIABLES}
    for r in rows:
        if r["error"]:
            continue
        at = (SYSTEMS.index(r["system"]), envs.index(r["env"]), seeds.index(r["seed"]))
        for k in VARIABLES:
            data[k][at] = r[k]
    ds = xr.Dataset(
        {k: (("system", "env", "seed"), v, dict(zip(("long_name", "units"), VARIABLES[k]))) for k, v in data.items()},
        coords={"system": list(SYSTEMS), "env": envs, "seed": seeds},
        attrs={k: json.dumps(v) if not isinstance(v, (int, float, str)) else v for k, v in meta.items()},
    )
    ds.to_netcdf(out / "mujoco_1m.nc", engine="netcdf4")
    plot(out / "mujoco_1m.png", rows, envs)
    return summary


def plot(path: Path, rows: list[dict], envs: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(envs), 2, figsize=(11, 3.2 * len(envs)), squeeze=False)
    colours = {"tianji": "tab:blue", "sb3": "tab:orange"}
    names = {"tianji": "tianji-dask", "sb3": "stable-baselines3"}
    for i, env_id in enumerate(envs):
        labelled: set[str] = set()
        for r in rows:
            if r["env"] != env_id or r["error"] or not r["curve"]["return"]:
                continue
            label = None if r["system"] in labelled else names[r["system"]]
            labelled.add(r["system"])
            c = r["curve"]
            axes[i, 0].plot(c["env_steps"], c["return"], color=colours[r["system"]], alpha=0.8, label=label)
            axes[i, 1].plot(c["time"], c["return"], color=colours[r["system"]], alpha=0.8, label=label)
        if env_id in CLEANRL:
            for ax in axes[i]:
                ax.axhline(CLEANRL[env_id][0], color="grey", ls="--", lw=1, label="cleanrl, 1M steps (-v4)")
        axes[i, 0].set(xlabel="env steps", ylabel=f"{env_id}\n100-episode mean return")
        axes[i, 1].set(xlabel="wall time (s)")
        axes[i, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def merge(p: argparse.ArgumentParser, parts: list[Path], out: Path) -> int:
    """``--merge``: the runs of ``parts`` (earlier invocations' ``mujoco_1m.json``) written together
    into ``out``, env by env (in :data:`ENVS` order), seed by seed; each part's own metadata kept."""
    rows: list[dict] = []
    metas: list[dict] = []
    for part in parts:
        try:
            saved = json.loads(part.read_text())
            part_rows, part_meta = saved["runs"], saved["meta"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            p.error(f"--merge {part}: not a mujoco_1m.json this script wrote ({exc!r})")
        rows += part_rows
        metas.append({"file": portable_path(part), **part_meta})
    seen: set[tuple[str, str, int]] = set()
    for r in rows:
        key = (r["system"], r["env"], r["seed"])
        if key in seen:
            p.error(f"--merge: {key[0]} {key[1]} seed {key[2]} is in more than one part; merge each run once")
        seen.add(key)
    order = {env_id: i for i, env_id in enumerate(ENVS)}
    rows.sort(key=lambda r: (order.get(r["env"], len(ENVS)), r["seed"], SYSTEMS.index(r["system"])))
    out.mkdir(parents=True, exist_ok=True)
    meta = {"created": time.strftime("%Y-%m-%dT%H:%M:%S"), "merged_from": metas, **provenance_attrs()}
    for env_id, entry in write(out, rows, meta).items():
        print(
            f"{env_id}: median return(100) {entry.get('median_return', math.nan):.1f} "
            f"in {entry.get('median_wall_s', math.nan):.1f} s, seeds {entry.get('seeds', [])}"
        )
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", default="configs/halfcheetah_ppo.yaml")
    p.add_argument("--envs", nargs="+", default=["HalfCheetah-v5"], metavar="ENV_ID")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--env-steps", type=int, default=1_000_000)
    p.add_argument("--set", dest="overrides", action="append", default=[], help="for tianji-dask only")
    p.add_argument("--sb3", action="store_true", help="stable-baselines3 beside it, HalfCheetah-v5 only")
    p.add_argument(
        "--sb3-python",
        type=Path,
        default=Path(os.environ.get("TIANJI_SB3_PYTHON", ROOT / ".venv-sb3" / "bin" / "python")),
        help="stable-baselines3's interpreter (default: $TIANJI_SB3_PYTHON, else .venv-sb3/bin/python)",
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/mujoco_1m"))
    p.add_argument(
        "--runs", type=Path, default=Path("runs/benchmarks"), help="where the runs' own directories go (not committed)"
    )
    p.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="write the runs of these mujoco_1m.json files together into --out; runs nothing",
    )
    args = p.parse_args(argv)
    if args.merge:
        return merge(p, args.merge, args.out)
    unknown = [e for e in args.envs if e not in ENVS]
    if unknown:
        p.error(f"--envs {' '.join(unknown)}: not one of {', '.join(ENVS)}")
    if args.sb3 and not args.sb3_python.exists():
        p.error(
            f"--sb3-python {args.sb3_python}: not found; make one: python3 -m venv .venv-sb3 && "
            ".venv-sb3/bin/pip install torch==2.13.0 stable-baselines3 'gymnasium[mujoco]', or give --sb3-python"
        )
    for env_id in args.envs:  # bad input stops here, before any run
        load_config(args.config, [*args.overrides, f"env.id={env_id}"])
    args.out.mkdir(parents=True, exist_ok=True)
    runs = args.runs / f"mujoco-{time.strftime('%Y%m%d-%H%M%S')}"
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
    for env_id in args.envs:
        for seed in args.seeds:
            new = [run_tianji(args.config, args.overrides, env_id, seed, args.env_steps, runs)]
            if args.sb3 and env_id == "HalfCheetah-v5":
                runs.mkdir(parents=True, exist_ok=True)
                new.append(run_sb3(env_id, seed, args.env_steps, args.sb3_python, runs / f"sb3-{env_id}-{seed}.log"))
            for r in new:
                print(
                    f"{r['system']:>6} {env_id} seed {seed}: {r['status']:>13}  return(100) "
                    f"{r.get('return_mean_100', math.nan):8.1f}  wall {r.get('wall_s', math.nan):7.1f} s  "
                    f"env steps {r.get('env_steps', 0):>9,}  stale {r.get('stale_dropped', math.nan):>9,.0f}  "
                    f"load {r['load_avg_1m']:.2f} {r['error'] or ''}",
                    flush=True,
                )
            rows += new
            summary = write(args.out, rows, meta)
    for env_id, s in summary.items():
        ret, wall = s.get("median_return", math.nan), s.get("median_wall_s", math.nan)
        line = f"{env_id}: median return(100) {ret:.1f} in {wall:.1f} s"
        if "cleanrl_return" in s:
            line += f" (cleanrl {s['cleanrl_return']:.1f} +- {s['cleanrl_std']:.1f})"
        if "stable_baselines3" in s:
            sb = s["stable_baselines3"]
            line += f"; stable-baselines3 {sb['median_return']:.1f} in {sb['median_wall_s']:.1f} s"
        print(line)
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
