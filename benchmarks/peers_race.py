"""tianji-dask against the systems users pick (Sample Factory 2, stable-baselines3, ...), each with
its own published settings, on one machine: Pong to a 100-episode mean of 18, or HalfCheetah-v5 for
1M env steps.

    python benchmarks/peers_race.py pong --peer sf --seeds 1 --max-seconds 600
    python benchmarks/peers_race.py pong --peer sf --seeds 2 --max-seconds 600 --continue
    python benchmarks/peers_race.py halfcheetah --peer sf --peer sb3=.venv-sb3/bin/python --seeds 1 2
    python benchmarks/peers_race.py cartpole --peer sf=.venv-sf/bin/python --seeds 0 --target 30 \\
        --max-seconds 60 --out benchmarks/results/tmp                 # a smoke run: proves the wiring

Per seed, tianji-dask (the task's config through ``time_to_target.py`` in a process of its own,
``vs_single.run_tianji``: its clock starts just before its LocalCluster is built) and each
``--peer`` (its runner in ``benchmarks/peers/``, a process of its own: its clock starts just
before its system is built), one after the other, the order alternating from seed to seed
(``vs_single.alternate``) so all see the same machine conditions. Every system stops at the first
full 100-episode window whose mean reaches the target, at ``--max-seconds``, or (HalfCheetah) at
the budget of env steps. A peer runs in the interpreter given with it (``--peer sf=PYTHON``;
without one, ``$TIANJI_PEER_PYTHON_SF`` (``_SB3``, ...), else this one), so each can live in its
own environment; a peer still running ``--grace`` seconds after its cap is killed (its process
group) and recorded as failed. ``--peer-arg sf=--settings=atari_faster`` passes one more argument
to a peer's runner.

Peers: ``sf``: Sample Factory 2.1.1's APPO (``peers/sf_appo.py``, its Atari or MuJoCo example
settings); ``sb3``: stable-baselines3's PPO with rl-baselines3-zoo's settings (``peers/ppo_sb3.py``: its
``atari`` entry on Pong, its tuned HalfCheetah entry).

``--continue`` adds seeds to the race already in the folder (same task, config, overrides, target,
limits and peers); without it a folder that holds a race is refused. One seed a call fits a device
call of 10 minutes; run it detached from a copy of the tree and poll the log (docs/benchmarks.md,
"On the GPU machine").

Writes into ``<out>/peers_<task>_<gpu>_<yyyymmdd>/`` (``--dir`` names it instead), after every run:
``peers.json`` (every run with its curve; per system the medians of time to target, env steps
then, env steps/s, final and best 100-episode means, wall time, its settings' source; each peer's
ratio to tianji-dask and the fastest peer's: a run that missed the target counts as longer than
its cap, which makes a median a lower bound, flagged ``*_at_least``), ``peers.nc`` (dims
``system`` x ``seed``) and ``return.png`` (the 100-episode mean return against wall time, every
system and seed on one axes); each run's log beside them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import xarray as xr
from vs_single import alternate, compare, continued, run_tianji, system_seed_grid

from tianji_dask.results.provenance import portable_path, provenance_attrs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEER_DIR = HERE / "peers"
TIANJI = "tianji"


@dataclass(frozen=True)
class Task:
    config: str
    target: float | None
    max_env_steps: int | None
    #: peer -> its runner's arguments for this task (the seed, target and limits added per run)
    peers: dict[str, Callable[[int], list[str]]]


SB3_SOURCE = "DLR-RM/rl-baselines3-zoo hyperparams/ppo.yml (commits 00128b5d, 208b6fdf), see peers/ppo_sb3.py"


def sf(env: str) -> Callable[[int], list[str]]:
    return lambda workers: ["sf_appo.py", "--env", env, "--workers", str(workers)]


def sb3(env: str) -> Callable[[int], list[str]]:
    return lambda workers: ["ppo_sb3.py", "--env", env]


TASKS = {
    "pong": Task("configs/pong_ppo.yaml", 18.0, None, {"sf": sf("atari_pong"), "sb3": sb3("PongNoFrameskip-v4")}),
    "halfcheetah": Task(
        "configs/halfcheetah_ppo_16core.yaml",
        None,
        1_000_000,
        {"sf": sf("HalfCheetah-v5"), "sb3": sb3("HalfCheetah-v5")},
    ),
    # small tasks for smoke runs on a CPU machine
    "cartpole": Task("configs/cartpole_ppo.yaml", 100.0, None, {"sf": sf("CartPole-v1")}),
    "pendulum": Task("configs/pendulum_ppo.yaml", -200.0, None, {"sf": sf("Pendulum-v1"), "sb3": sb3("Pendulum-v1")}),
}
RACE_KEYS = ("task", "config", "overrides", "target", "max_seconds", "max_env_steps", "peers", "peer_args")
VARIABLES = {
    "time_to_target_s": ("wall time to the target (start-up included); NaN if missed", "s"),
    "env_steps_to_target": ("env steps at the target; NaN if missed", "1"),
    "wall_s": ("wall time of the run (start-up included)", "s"),
    "env_steps": ("env steps of the run (one policy step; Atari: 4 frames)", "1"),
    "env_steps_per_s": ("env steps per second over the run", "1/s"),
    "return_mean_100": ("mean return of the last 100 episodes at the end", "1"),
    "best_return_mean_100": ("best mean return over 100 episodes", "1"),
    "load_avg_1m": ("1-minute load average after the run", "1"),
}


def peer_python(name: str, given: str | None) -> str:
    return given or os.environ.get(f"TIANJI_PEER_PYTHON_{name.upper()}") or sys.executable


def parse_pairs(p: argparse.ArgumentParser, flag: str, values: list[str], names) -> dict[str, list[str]]:
    """``NAME[=VALUE]`` arguments as {name: [values]}; an unknown name stops the parser."""
    out: dict[str, list[str]] = {}
    for v in values:
        name, _, value = v.partition("=")
        if name not in names:
            p.error(f"{flag} {v}: {name!r} is not one of {', '.join(sorted(names))}")
        out.setdefault(name, [])
        if value:
            out[name].append(value)
    return out


def gpu_slug() -> str:
    """The GPU's short name for the folder (h100, h200, ...), or cpu."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name(0)
    m = re.search(r"\b([A-Z]+\d+[A-Z]*)\b", name.replace("NVIDIA ", ""))
    return (m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", name.lower())).lower()


def peer_command(name: str, task: Task, args, seed: int) -> list[str]:
    script, *rest = task.peers[name](args.workers)
    cmd = [peer_python(name, args.peers[name][0] if args.peers[name] else None), "-u", str(PEER_DIR / script), *rest]
    cmd += ["--seed", str(seed), "--max-seconds", str(args.max_seconds)]
    if args.target is not None:
        cmd += ["--target", str(args.target)]
    if args.max_env_steps is not None:
        cmd += ["--max-env-steps", str(args.max_env_steps)]
    return cmd + args.peer_args.get(name, [])


def run_peer(name: str, cmd: list[str], seed: int, log: Path, timeout: float) -> dict:
    """One peer run; its record (the last JSON line of its output) as a race row."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        killed = ""
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            killed = f"still running {timeout:.0f} s after its start: killed"
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("{")]
    if not lines or (rc != 0 and not killed):
        return {"system": name, "seed": seed, "error": killed or f"exit {rc}, see {portable_path(log)}"}
    res = json.loads(lines[-1])  # a runner killed in its shutdown printed its record as it stopped
    t, steps, mean = zip(*res["curve"], strict=True) if res["curve"] else ((), (), ())

    def nan(x):
        return math.nan if x is None else x

    return {
        "system": name,
        "seed": seed,
        "time_to_target_s": nan(res["seconds_to_target"]),
        "env_steps_to_target": nan(res["env_steps_to_target"]),
        "wall_s": res["wall_s"],
        "env_steps": res["env_steps"],
        "env_steps_per_s": res["env_steps_per_s"],
        "return_mean_100": nan(res["return_mean_100"]),
        "best_return_mean_100": nan(res.get("best_return_mean_100")),
        "episodes": res.get("episodes"),
        "settings_source": res.get("settings_source", SB3_SOURCE if name == "sb3" else None),
        "settings": res.get("settings", res.get("hyperparameters")),
        "killed": killed or None,
        "curve": {"time": list(t), "env_steps": list(steps), "return": list(mean)},
    }


def summarise(rows: list[dict], systems: tuple[str, ...], meta: dict) -> dict:
    """Per system: the medians (time to target with its censoring, ``vs_single.medians``), the
    runs' returns and wall times, its settings' source; per peer: tianji-dask's ratio to it; and
    the fastest peer by median time to target (or, with no target, by median wall time)."""
    summary: dict = {}
    for peer in systems[1:] if meta["target"] is not None else ():
        pair = compare(rows, (TIANJI, peer), dict.fromkeys((TIANJI, peer), meta["max_seconds"]))
        summary.setdefault(TIANJI, pair[TIANJI])
        summary[peer] = pair[peer]
        summary[f"{TIANJI}_over_{peer}"] = {k: v for k, v in pair.items() if k.startswith("ratio")}
    for system in systems:
        ok = [r for r in rows if r["system"] == system and "error" not in r]
        entry = summary.setdefault(system, {"runs": 0})
        entry["failed"] = sum(1 for r in rows if r["system"] == system and "error" in r)
        if not ok:
            continue
        entry |= {
            "median_wall_s": statistics.median(r["wall_s"] for r in ok),
            "median_env_steps": statistics.median(r["env_steps"] for r in ok),
            "median_env_steps_per_s": statistics.median(r["env_steps_per_s"] for r in ok),
            "median_return_mean_100": statistics.median(r["return_mean_100"] for r in ok),
            "returns": [r["return_mean_100"] for r in ok],
            "best_returns": [r["best_return_mean_100"] for r in ok],
            "wall_s": [r["wall_s"] for r in ok],
            "seeds": [r["seed"] for r in ok],
            "settings_source": ok[0].get("settings_source") or f"{meta['config']} (this repository)",
        }
        entry["runs"] = entry["runs"] or len(ok)
    peers = [s for s in systems[1:] if summary[s].get("runs")]
    key = "median_time_to_target_s" if meta["target"] is not None else "median_wall_s"
    if peers and summary[TIANJI].get("runs"):
        fastest = min(peers, key=lambda s: summary[s][key])
        summary["fastest_peer"] = fastest
        summary[f"ratio_{key}_to_fastest_peer"] = summary[TIANJI][key] / summary[fastest][key]
    return summary


def write(out: Path, rows: list[dict], meta: dict, seeds: list[int]) -> dict:
    systems = (TIANJI, *meta["peers"])
    summary = summarise(rows, systems, meta)
    (out / "peers.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": rows}, indent=2))
    ds = xr.Dataset(
        {
            k: (("system", "seed"), system_seed_grid(rows, systems, seeds, k), {"long_name": n, "units": u})
            for k, (n, u) in VARIABLES.items()
        },
        coords={
            "system": ("system", list(systems), {"long_name": "the system raced", "units": "1"}),
            "seed": ("seed", seeds, {"long_name": "the root seed of both systems' runs", "units": "1"}),
        },
        attrs={k: json.dumps(v) if not isinstance(v, (int, float, str)) else v for k, v in meta.items()},
    )
    ds.to_netcdf(out / "peers.nc", engine="netcdf4")
    plot(out / "return.png", rows, systems, meta)
    return summary


def plot(path: Path, rows: list[dict], systems: tuple[str, ...], meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours = dict(zip(systems, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    labelled: set[str] = set()
    for r in rows:
        if "curve" not in r or not r["curve"]["return"]:
            continue
        label = None if r["system"] in labelled else r["system"]
        labelled.add(r["system"])
        ax.plot(r["curve"]["time"], r["curve"]["return"], color=colours[r["system"]], alpha=0.8, label=label)
    if meta["target"] is not None:
        ax.axhline(meta["target"], color="grey", lw=0.8, ls="--", label=f"target {meta['target']:g}")
    ax.set(xlabel="wall time [s]", ylabel="100-episode mean return", title=f"{meta['task']} on {meta['gpu']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def race_dir(args) -> Path:
    """``--dir``, else ``<out>/peers_<task>_<gpu>_<yyyymmdd>``; with ``--continue`` and no such
    folder for today, the newest of that task and GPU (a race that went on past midnight)."""
    if args.dir:
        return args.dir
    prefix = f"peers_{args.task}_{args.gpu}_"
    today = args.out / f"{prefix}{time.strftime('%Y%m%d')}"
    if args.go_on and not (today / "peers.json").exists():
        older = sorted(p for p in args.out.glob(f"{prefix}*") if (p / "peers.json").exists())
        if older:
            return older[-1]
    return today


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=sorted(TASKS))
    p.add_argument("--peer", action="append", default=[], metavar="NAME[=PYTHON]", help="a peer to race (repeat)")
    p.add_argument("--peer-arg", action="append", default=[], metavar="NAME=ARG", help="one more peer argument")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--set", dest="overrides", action="append", default=[], help="for tianji-dask only")
    p.add_argument("--target", type=float, help="the 100-episode mean to reach (default: the task's)")
    p.add_argument("--max-seconds", type=float, default=600.0, help="every run's cap")
    p.add_argument("--max-env-steps", type=int, help="every run's budget of env steps (default: the task's)")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="the peers' workers (default: the cores)")
    p.add_argument("--grace", type=float, default=180.0, help="seconds past the cap before a peer is killed")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--dir", type=Path, help="the race's folder (default: <out>/peers_<task>_<gpu>_<yyyymmdd>)")
    p.add_argument("--continue", dest="go_on", action="store_true", help="add the seeds to the race in the folder")
    args = p.parse_args(argv)
    task = TASKS[args.task]
    if not args.peer:
        p.error(f"give at least one --peer: {', '.join(sorted(task.peers))} race {args.task}")
    args.peers = parse_pairs(p, "--peer", args.peer, task.peers)
    args.peer_args = parse_pairs(p, "--peer-arg", args.peer_arg, args.peers)
    for name in args.peers:
        python = peer_python(name, args.peers[name][0] if args.peers[name] else None)
        if not Path(python).is_file():
            p.error(f"--peer {name}: interpreter {python} not found; give --peer {name}=PYTHON")
    args.config = task.config
    args.target = task.target if args.target is None else args.target
    args.max_env_steps = args.max_env_steps or task.max_env_steps
    args.gpu = gpu_slug()
    out = race_dir(args)
    meta = {
        "task": args.task,
        "config": args.config,
        "overrides": args.overrides,
        "target": args.target,
        "max_seconds": args.max_seconds,
        "max_env_steps": args.max_env_steps,
        "peers": sorted(args.peers),
        "peer_args": args.peer_args,
        "gpu": args.gpu,
        "machine": f"{os.cpu_count()} cores",
        "workers": args.workers,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "peer_commands": {n: peer_command(n, task, args, 0)[1:] for n in sorted(args.peers)},
        **provenance_attrs(),
    }
    systems = (TIANJI, *meta["peers"])
    rows, todo, _ = continued(out, meta, args.seeds, args.go_on, name="peers.json", systems=systems, keys=RACE_KEYS)
    seeds = sorted({r["seed"] for r in rows}, key=[r["seed"] for r in rows].index) + todo
    out.mkdir(parents=True, exist_ok=True)
    tianji_args = argparse.Namespace(**vars(args))
    if args.max_env_steps is not None:
        tianji_args.overrides = [f"stop.max_env_steps={args.max_env_steps}", *args.overrides]

    def run(system: str, seed: int) -> dict:
        if system == TIANJI:
            row = run_tianji(seed, tianji_args, out / f"tianji-seed{seed}", out / f"tianji-seed{seed}.log")
            return row | {"settings_source": f"{args.config} (this repository)"}
        cmd = peer_command(system, task, args, seed)
        return run_peer(system, cmd, seed, out / f"{system}-seed{seed}.log", args.max_seconds + args.grace)

    summary = alternate(todo, systems, run, lambda done: write(out, done, meta, seeds), rows) if todo else {}
    if not todo:
        summary = write(out, rows, meta, seeds)
    for system in systems:
        m = summary.get(system, {})
        bound = ">=" if m.get("median_time_to_target_at_least") else ""
        print(
            f"{system:>7}: median time to target {bound}{m.get('median_time_to_target_s', math.nan):.1f} s, "
            f"wall {m.get('median_wall_s', math.nan):.1f} s, "
            f"return(100) {m.get('median_return_mean_100', math.nan):.1f}, "
            f"{m.get('median_env_steps_per_s', math.nan):,.0f} env steps/s, runs {m.get('runs', 0)}, "
            f"failed {m.get('failed', 0)}"
        )
    if "fastest_peer" in summary:
        ratio = next(v for k, v in summary.items() if k.endswith("_to_fastest_peer"))
        print(f"tianji-dask / the fastest peer ({summary['fastest_peer']}): {ratio:.2f}")
    print(f"written: {portable_path(out)}/peers.json, peers.nc, return.png", flush=True)
    return 0 if all(summary.get(s, {}).get("runs") for s in systems) else 1


if __name__ == "__main__":
    sys.exit(main())
