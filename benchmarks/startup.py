"""Start-up: seconds from ``tianji-dask train``'s process start to each phase of the run.

    python benchmarks/startup.py configs/cartpole_dqn.yaml --repeats 5
    python benchmarks/startup.py configs/cartpole_dqn.yaml --repeats 5 --before a1f4c2f
    python benchmarks/startup.py configs/pong_ppo.yaml --repeats 5 --tree before=/tmp/old-tree
    python benchmarks/startup.py configs/pong_dqn.yaml --repeats 3 --compile-cache cold

Each repeat starts ``python -m tianji_dask.cli train CONFIG --set seed=S`` (a new seed each
repeat) in each tree, the trees alternating and which goes first alternating from repeat to
repeat, one run at a time. A run is stopped with SIGINT once its start-up timeline is complete
(the line ``start-up, seconds from the process start: ...``), or, in a tree that has no timeline,
``--after-ready-s`` seconds after its ``hosts ready`` line; then it writes its results and exits.

Per run: the phases of metrics.nc's ``startup_*`` attributes (seconds from the interpreter's
start: cluster up, hosts built, first parameters, first env step, first learner update), and,
the same for every tree, the seconds from the process's spawn to its ``hosts ready`` line (the
last host's loop begun: every actor stepping). For an off-policy config also ``replay_ready_s``,
when the actors' env steps first reached ``algo.learning_starts`` (from metrics.nc's rows,
to ``run.metrics_interval``), and ``update_after_replay_s``, the first learner update after it.

``--tree NAME=PATH`` adds a tree (a checkout or a copy of one, run with PATH first on
``PYTHONPATH`` and this interpreter's packages); ``--before REF`` adds the commit REF in a temporary git worktree;
the tree this script is in is ``this``. ``--compile-cache cold`` gives every run an empty inductor
and Triton cache; ``warm`` one shared cache, filled by one run before the measured ones; by
default the machine's own.

Writes ``<out>/startup.json`` (every run, the medians per tree
and phase, the load average and machine) and ``<out>/startup.nc`` (dims ``tree`` x ``repeat``)
and prints the medians; with ``--logs DIR`` each run's output too, every line with its seconds
since the spawn (``DIR/<k>-<tree>-<seed>.log``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import xarray as xr
import yaml

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("cluster_up", "hosts_built", "first_parameters", "first_env_step", "first_learner_update")
TIMELINE = re.compile(r"^start-up, seconds from the process start: ")
HOSTS_READY = re.compile(r"^hosts ready ")
FIGURES = (
    *(f"{p}_s" for p in PHASES),
    "hosts_ready_line_s",
    "learner_prepare_s",
    "replay_ready_s",
    "update_after_replay_s",
    "exit_s",
    "load_avg_1m",
)
DESCRIBED = {
    "cluster_up_s": "seconds from the process start to the run's cluster up",
    "hosts_built_s": "seconds from the process start to the last host built",
    "first_parameters_s": "seconds from the process start to the learner's first parameters published",
    "first_env_step_s": "seconds from the process start to the first env step",
    "first_learner_update_s": "seconds from the process start to the first learner update",
    "hosts_ready_line_s": "seconds from the process's spawn to its 'hosts ready' line",
    "learner_prepare_s": "seconds the slowest learner took for its optimiser and compile after its first parameters",
    "replay_ready_s": "seconds from the process start to env steps reaching algo.learning_starts",
    "update_after_replay_s": "first learner update after the replay reached algo.learning_starts",
    "exit_s": "seconds from the process's spawn to its exit after the SIGINT",
    "load_avg_1m": "1-minute load average before the run",
}


class TimedRun:
    """One ``tianji-dask train`` process: its output lines with the seconds since its spawn."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict[str, str]):
        self.lines: list[tuple[float, str]] = []
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic() - self.t0, line.rstrip("\n")))

    def seen(self, pattern: re.Pattern) -> float | None:
        return next((t for t, line in self.lines if pattern.search(line)), None)

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)


def measure(tree: Path, config: str, seed: int, out: Path, log: Path, args, env: dict[str, str]) -> dict:
    cmd = [sys.executable, "-m", "tianji_dask.cli", "train", config, "--out", str(out), "--set", f"seed={seed}"]
    for override in args.set:
        cmd += ["--set", override]
    load = os.getloadavg()[0]
    run = TimedRun(cmd, tree, env)
    deadline = time.monotonic() + args.timeout
    stop_at = None
    while run.proc.poll() is None and time.monotonic() < deadline:
        if run.seen(TIMELINE) is not None:
            break
        ready = run.seen(HOSTS_READY)
        if ready is not None and stop_at is None:
            stop_at = time.monotonic() + args.after_ready_s
        if stop_at is not None and time.monotonic() >= stop_at:
            break
        time.sleep(0.05)
    if run.proc.poll() is None:
        run.proc.send_signal(signal.SIGINT)
    try:
        run.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        run.proc.kill()
        run.proc.wait()
    run._reader.join(5)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("".join(f"{t:7.2f} {line}\n" for t, line in run.lines))
    row: dict = {"seed": seed, "exit_code": run.proc.returncode, "load_avg_1m": load}
    row["exit_s"] = time.monotonic() - run.t0
    row["hosts_ready_line_s"] = run.seen(HOSTS_READY) or math.nan
    metrics = out / "metrics.nc"
    if not metrics.exists():
        raise SystemExit(f"startup: {' '.join(cmd)} in {tree} wrote no metrics.nc:\n{run.output()[-3000:]}")
    with xr.open_dataset(metrics) as ds:
        for phase in PHASES:
            row[f"{phase}_s"] = float(ds.attrs.get(f"startup_{phase}_s", math.nan))
        row["learner_prepare_s"] = float(ds.attrs.get("startup_learner_prepare_s", math.nan))
        row.update(replay_figures(ds, row))
    return row


def replay_figures(ds: xr.Dataset, row: dict) -> dict:
    """When the actors' env steps reached ``algo.learning_starts`` (an off-policy config), on
    the process-start clock, and how long after it the learner's first update came."""
    cfg = json.loads(ds.attrs.get("config_json", "{}"))
    starts = (cfg.get("algo") or {}).get("learning_starts")
    nothing = {"replay_ready_s": math.nan, "update_after_replay_s": math.nan}
    if not starts or "env_steps" not in ds or "startup_origin_unix" not in ds.attrs:
        return nothing
    reached = ds.time.values[ds.env_steps.values >= starts]
    if not len(reached):
        return nothing
    # metrics' time counts from the run's t0, the timeline from its origin (the process start)
    ready = float(ds.attrs["t0_unix"]) + float(reached[0]) - float(ds.attrs["startup_origin_unix"])
    return {"replay_ready_s": ready, "update_after_replay_s": row["first_learner_update_s"] - ready}


def add_worktree(ref: str, parent: Path) -> Path:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", f"{ref}^{{commit}}"], cwd=ROOT, capture_output=True, text=True
    )
    if commit.returncode != 0:
        raise SystemExit(f"startup: --before {ref!r} is not a commit of {ROOT} ({commit.stderr.strip()})")
    path = parent / commit.stdout.strip()
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), commit.stdout.strip()], cwd=ROOT, check=True)
    return path


def trees_of(args, scratch: Path) -> dict[str, Path]:
    trees = {"this": ROOT}
    for spec in args.tree:
        name, sep, path = spec.partition("=")
        if not sep or not name or not Path(path, "tianji_dask").is_dir():
            raise SystemExit(f"startup: --tree {spec!r}: give NAME=PATH, PATH a tree with tianji_dask/ in it")
        trees[name] = Path(path).resolve()
    if args.before:
        trees[f"before {args.before}"] = add_worktree(args.before, scratch)
    return trees


def python_path(tree: Path) -> str:
    """``tree`` first on the path, then what the caller's path had (wheels installed with ``--target``)."""
    return os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])


def cache_env(mode: str, scratch: Path, run: int) -> dict[str, str]:
    """The compile caches' directories of one run: its own empty ones (cold), the shared ones
    (warm), or the machine's (default)."""
    if mode == "default":
        return {}
    where = scratch / ("cache" if mode == "warm" else f"cache-{run}")
    return {"TORCHINDUCTOR_CACHE_DIR": str(where / "inductor"), "TRITON_CACHE_DIR": str(where / "triton")}


def machine() -> dict:
    info = {"cores": os.cpu_count(), "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    return info


def summarise(rows: list[dict], trees: list[str]) -> list[dict]:
    out = []
    for tree in trees:
        mine = [r for r in rows if r["tree"] == tree]
        entry: dict = {"tree": tree, "runs": len(mine)}
        for key in FIGURES:
            values = [r[key] for r in mine if not math.isnan(r[key])]
            entry[f"median_{key}"] = statistics.median(values) if values else math.nan
            entry[f"range_{key}"] = [min(values), max(values)] if values else None
        out.append(entry)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="the run's config file, relative to each tree (e.g. configs/cartpole_dqn.yaml)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=1000, help="repeat k runs seed FIRST_SEED + k (default 1000)")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=PATH", help="another tree to run beside")
    p.add_argument("--before", help="a commit to run beside, in a temporary git worktree")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override for every run")
    p.add_argument("--compile-cache", choices=("default", "cold", "warm"), default="default")
    p.add_argument("--after-ready-s", type=float, default=2.0, help="a tree without the timeline: seconds kept on")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take to complete its start-up")
    p.add_argument("--out", type=Path, help="default benchmarks/results/startup_<config>")
    p.add_argument("--logs", type=Path, help="keep each run's timestamped output here (default: not kept)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats: at least 1")
    if not (ROOT / args.config).is_file():
        p.error(f"{args.config}: no such config in {ROOT}")
    yaml.safe_load((ROOT / args.config).read_text())
    out = args.out or ROOT / "benchmarks" / "results" / f"startup_{Path(args.config).stem}"
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        scratch = Path(tmp)
        trees = trees_of(args, scratch)
        names = list(trees)
        try:
            if args.compile_cache == "warm":
                for name, tree in trees.items():
                    env = {**os.environ, "PYTHONPATH": python_path(tree), **cache_env("warm", scratch, 0)}
                    warm_up = scratch / f"warm-up-{name.replace(' ', '-')}"
                    measure(
                        tree, args.config, args.first_seed - 1, warm_up, out / "logs" / f"{warm_up.name}.log", args, env
                    )
            for k in range(args.repeats):
                for name in names if k % 2 == 0 else names[::-1]:
                    tree, seed = trees[name], args.first_seed + k
                    env = {
                        **os.environ,
                        "PYTHONPATH": python_path(tree),
                        **cache_env(args.compile_cache, scratch, len(rows)),
                    }
                    log = (args.logs or scratch / "logs") / f"{len(rows)}-{name.replace(' ', '-')}-{seed}.log"
                    row = measure(tree, args.config, seed, scratch / f"run-{len(rows)}", log, args, env)
                    row.update(tree=name, repeat=k)
                    rows.append(row)
                    print(
                        f"{name} seed {seed}: "
                        + ", ".join(f"{key.removesuffix('_s')} {row[key]:.2f}" for key in FIGURES[:8])
                        + f"  load {row['load_avg_1m']:.2f}",
                        flush=True,
                    )
        finally:
            for name, tree in trees.items():
                if name.startswith("before "):
                    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
                    shutil.rmtree(tree, ignore_errors=True)
    summary = summarise(rows, names)
    for s in summary:
        print(
            f"{s['tree']} (median of {s['runs']}): "
            + ", ".join(f"{key.removesuffix('_s')} {s[f'median_{key}']:.2f}" for key in FIGURES[:8])
        )
    meta = {"config": args.config, "overrides": args.set, "compile_cache": args.compile_cache, **machine()}
    (out / "startup.json").write_text(json.dumps({"meta": meta, "runs": rows, "summary": summary}, indent=2))
    grid = {key: np.full((len(names), args.repeats), np.nan) for key in FIGURES}
    for r in rows:
        for key in FIGURES:
            grid[key][names.index(r["tree"]), r["repeat"]] = r[key]
    ds = xr.Dataset(
        {
            key: (
                ("tree", "repeat"),
                grid[key],
                {"long_name": DESCRIBED[key], "units": "1" if key == "load_avg_1m" else "s"},
            )
            for key in FIGURES
        },
        coords={"tree": names, "repeat": np.arange(args.repeats)},
        attrs={k: json.dumps(v) if isinstance(v, list) else v for k, v in meta.items()},
    )
    ds.to_netcdf(out / "startup.nc", engine="netcdf4")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
