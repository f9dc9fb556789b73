"""Chaos: time to target while a random worker process of the run is killed with SIGKILL every
``--interval`` seconds, against the same runs left alone, side by side.

    python benchmarks/chaos.py                      # DQN and PPO CartPole to 300, seeds 0 1 2
    python benchmarks/chaos.py --algos dqn --seeds 0 --target 100 --interval 5 --out /tmp/chaos

Each run trains on its own LocalCluster (distributed mode, the config's topology) with
``run.max_restarts`` large enough for every kill. In a chaos run a thread waits until the hosts
produce, then, from a random moment within the first ``--interval`` on, every ``--interval``
seconds picks one of the cluster's workers at random (any role: an actor's, or the learner's with
its buffer) and sends its process SIGKILL; the nanny starts a
new process and the driver re-creates the lost hosts there. Calm and chaos runs of a seed run one
after the other, which goes first alternating from seed to seed. Writes ``<out>/chaos.json`` and
``<out>/chaos.nc`` (dims ``algo`` x ``mode`` x ``seed``: time to target, wall time, kills,
re-created hosts, what was lost) and prints per algorithm the medians and their ratio; exit 1
if a run missed its target.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import threading
import time
from pathlib import Path

import dask
import numpy as np
import xarray as xr
from distributed import Client

from tianji_dask.config import load_config
from tianji_dask.results.metric_table import LOSS_KEYS
from tianji_dask.runtime.driver import train

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"dqn": ROOT / "configs" / "cartpole_dqn.yaml", "ppo": ROOT / "configs" / "cartpole_ppo.yaml"}
MODES = ("calm", "chaos")


class Chaos:
    """Kills a random worker process of the run every ``interval`` seconds while it trains."""

    def __init__(self, run, interval: float, rng: random.Random, max_kills: int | None = None):
        self.run, self.interval, self.rng, self.max_kills = run, interval, rng, max_kills
        self.kills: list[tuple[float, str]] = []  # (seconds since the run's start, worker address)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="chaos", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        run = self.run
        while run.scheduler_address is None and not run.done and not self._stop.wait(0.05):
            pass
        if run.done or self._stop.is_set():
            return
        with Client(run.scheduler_address, timeout="30s") as client:
            while run.recorder.tally.env_steps == 0 and not run.done and not self._stop.wait(0.1):
                pass
            wait = self.rng.uniform(0, self.interval)  # the first kill at a random phase, then every interval
            while not self._stop.wait(wait) and not run.done:
                wait = self.interval
                if self.max_kills is not None and len(self.kills) >= self.max_kills:
                    return
                try:
                    pids = client.run(os.getpid)
                except Exception:  # noqa: BLE001 - a worker is starting again: try at the next tick
                    continue
                if not pids:
                    continue
                victim = self.rng.choice(sorted(pids))
                try:
                    os.kill(pids[victim], signal.SIGKILL)
                except ProcessLookupError:
                    continue
                self.kills.append((time.time() - run.t0, victim))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=40)


def one_run(algo: str, mode: str, seed: int, args, runs_dir: Path) -> dict:
    overrides = [
        f"seed={seed}",
        f"stop.target_return={args.target}",
        "stop.max_env_steps=null",
        f"stop.max_seconds={args.max_seconds}",
        "run.max_restarts=1000",
        "run.checkpoint=false",
    ]
    cfg = load_config(CONFIGS[algo], overrides)
    out = runs_dir / f"{algo}-{mode}-seed{seed}"
    t = time.time()
    events: list[str] = []
    run = train(cfg, out=out, on_event=lambda e: events.append(f"{time.time() - t:.1f}s {e}"))
    chaos = Chaos(run, args.interval, random.Random(f"{algo}-{seed}"), args.kills) if mode == "chaos" else None
    result = run.wait()
    if chaos is not None:
        chaos.stop()
    assert result is not None
    ds = run.metrics()
    last = {k: int(ds[k].values[-1]) if ds.sizes["time"] else 0 for k in LOSS_KEYS}
    row = {
        "algo": algo,
        "mode": mode,
        "seed": seed,
        "status": result.status,
        "time_to_target_s": result.time_to_target_s,
        "wall_s": time.time() - t,
        "env_steps": result.env_steps,
        "kills": len(chaos.kills) if chaos else 0,
        "killed": [f"{s:.1f}s {w}" for s, w in chaos.kills] if chaos else [],
        "error": result.error,
        "events": events,
        "load_1min": os.getloadavg()[0],
        **last,
    }
    print(
        f"{algo} {mode:5s} seed {seed}: {result.status}, time to target {result.time_to_target_s:.1f} s, "
        f"{row['kills']} kills, restarts a/b/l {last['actor_restarts']}/{last['buffer_restarts']}/"
        f"{last['learner_restarts']}, lost env steps {last['lost_env_steps']}, replay {last['lost_replay']}, "
        f"updates {last['lost_updates']} (load {row['load_1min']:.2f})",
        flush=True,
    )
    return row


def summarize(rows: list[dict], algos: list[str]) -> dict:
    summary = {}
    for algo in algos:
        med = {}
        for mode in MODES:
            times = [r["time_to_target_s"] for r in rows if r["algo"] == algo and r["mode"] == mode]
            med[mode] = statistics.median(times) if times else float("nan")
        summary[algo] = {**{f"median_{m}_s": med[m] for m in MODES}, "ratio": med["chaos"] / med["calm"]}
    return summary


def to_dataset(rows: list[dict], algos: list[str], seeds: list[int]) -> xr.Dataset:
    names = ["time_to_target_s", "wall_s", "env_steps", "kills", *LOSS_KEYS]
    data = {n: np.full((len(algos), len(MODES), len(seeds)), np.nan) for n in names}
    for r in rows:
        idx = (algos.index(r["algo"]), MODES.index(r["mode"]), seeds.index(r["seed"]))
        for n in names:
            data[n][idx] = r[n]
    return xr.Dataset(
        {n: (("algo", "mode", "seed"), v) for n, v in data.items()},
        coords={"algo": algos, "mode": list(MODES), "seed": seeds},
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algos", nargs="+", choices=sorted(CONFIGS), default=["dqn", "ppo"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--target", type=float, default=300.0, help="stop.target_return (default 300)")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between kills (default 10)")
    p.add_argument("--kills", type=int, default=None, help="at most this many kills a run (default: no limit)")
    p.add_argument("--max-seconds", type=float, default=600.0, help="each run's stop.max_seconds")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "chaos")
    args = p.parse_args(argv)
    if args.interval <= 0:
        p.error(f"--interval must be positive, got {args.interval}")
    args.out.mkdir(parents=True, exist_ok=True)
    runs_dir = args.out / "runs"
    rows = []
    for algo in args.algos:
        for k, seed in enumerate(args.seeds):
            for mode in MODES if k % 2 == 0 else MODES[::-1]:
                rows.append(one_run(algo, mode, seed, args, runs_dir))
    summary = summarize(rows, args.algos)
    meta = {"target": args.target, "interval_s": args.interval, "cpus": os.cpu_count(), "summary": summary}
    (args.out / "chaos.json").write_text(json.dumps({**meta, "runs": rows}, indent=1))
    ds = to_dataset(rows, args.algos, args.seeds)
    ds.attrs.update(target=args.target, interval_s=args.interval, summary=json.dumps(summary))
    with dask.config.set(scheduler="synchronous"):  # the chaos threads' clients set Dask's default
        ds.to_netcdf(args.out / "chaos.nc", engine="netcdf4")
    for algo, s in summary.items():
        print(
            f"{algo}: median time to target calm {s['median_calm_s']:.1f} s, chaos {s['median_chaos_s']:.1f} s: "
            f"ratio {s['ratio']:.2f}"
        )
    missed = [r for r in rows if r["status"] != "target_reached"]
    for r in missed:
        print(f"missed: {r['algo']} {r['mode']} seed {r['seed']}: {r['status']} {r['error'] or ''}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
