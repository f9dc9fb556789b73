"""Learner throughput (TR_L, samples/s) of configs, optionally for several source trees side by
side: the way to measure a change to the learner's code path against the code before it.

    python benchmarks/learner_throughput.py configs/pong_dqn.yaml configs/pong_ppo.yaml
    python benchmarks/learner_throughput.py configs/pong_dqn.yaml --src . /tmp/old --repeats 3
    python benchmarks/learner_throughput.py configs/pong_ppo.yaml --variant old /tmp/old \
        --variant new . --variant new_bf16 . algo.precision=bf16

Each measurement is :func:`tianji_dask.deploy.profiling.measure_learner` (the real learner role on a
buffer filled by a real actor, exploration at its final value, no balance controller) in a fresh
Python process whose ``tianji_dask`` comes from the given source tree (``--src``, a directory
holding a ``tianji_dask`` package; default: this checkout). ``--variant NAME DIR [KEY=VALUE ...]``
(repeatable, instead of ``--src``) names a source tree with overrides of its own on top of
``--set``'s, so one tree's settings (a key the other tree does not know) can be compared with
another tree in the same run. Sources alternate within every repeat, so they see the same
machine. A DQN learner samples from a replay filled only to its
warm-up size here, so its rate is an upper bound for a full 1M-transition replay. Writes
``<out>/learner_throughput.json`` and ``.nc`` (dims config x src x repeat) and prints the median
per config and source, and each source's ratio to the first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]

# sys.path[0] is the source tree under test, ahead of the working directory, PYTHONPATH and an
# installed (editable) tianji_dask; the child reports which package it imported
MEASURE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import tianji_dask
from tianji_dask.config import load_config
from tianji_dask.deploy.profiling import measure_learner
cfg = load_config(sys.argv[2], sys.argv[5:])
r = measure_learner(cfg.model_dump_json(), int(sys.argv[3]), None, float(sys.argv[4]), cfg.learner.device)
print("RESULT " + json.dumps({**r, "package": tianji_dask.__file__}))
"""


def measure(src: Path, config: str, overrides: list[str], threads: int, seconds: float) -> float:
    r = subprocess.run(
        [sys.executable, "-c", MEASURE, str(src), str(Path(config).resolve()), str(threads), str(seconds), *overrides],
        capture_output=True,
        text=True,
        cwd=src,
        timeout=600,
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"measuring {config} with {src} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    package = Path(result["package"]).resolve()
    if not package.is_relative_to(src):
        raise RuntimeError(f"measuring with --src {src} imported tianji_dask from {package} instead")
    return float(result["samples_per_s"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("configs", nargs="+", help="experiment config files")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for every config (repeatable)",
    )
    p.add_argument(
        "--src",
        nargs="+",
        default=[str(ROOT)],
        metavar="DIR",
        help="source trees to compare, each a directory holding tianji_dask/ (default: this checkout)",
    )
    p.add_argument(
        "--variant",
        nargs="+",
        action="append",
        default=[],
        metavar="ARG",
        help="a labelled source tree with its own config overrides (repeatable; replaces --src): "
        "NAME DIR [KEY=VALUE ...]",
    )
    p.add_argument("--seconds", type=float, default=10.0, help="length of one measurement (default 10)")
    p.add_argument("--repeats", type=int, default=3, help="measurements per config and source (default 3)")
    p.add_argument("--threads", type=int, default=1, help="learner torch threads (default 1)")
    p.add_argument("--out", default="benchmarks/results/learner_throughput", help="output directory")
    a = p.parse_args(argv)
    for c in a.configs:
        if not Path(c).is_file():
            p.error(f"config {c} does not exist; pass a config file such as configs/pong_dqn.yaml")
    if a.variant:
        if any(len(v) < 2 or any("=" not in kv for kv in v[2:]) for v in a.variant):
            p.error("--variant takes NAME DIR and then KEY=VALUE overrides, e.g. --variant new . algo.precision=bf16")
        names = [v[0] for v in a.variant]
        srcs = [Path(v[1]).resolve() for v in a.variant]
        extra = [v[2:] for v in a.variant]
    else:
        srcs = [Path(s).resolve() for s in a.src]
        names = [s.name for s in srcs]
        extra = [[] for _ in srcs]
    for s in srcs:
        if not (s / "tianji_dask" / "__init__.py").is_file():
            p.error(f"--src {s}: holds no tianji_dask package; pass a directory with tianji_dask/ in it")
    if len(set(names)) != len(names):
        p.error(
            "--src: the directories' names must differ (they label the results)"
            if not a.variant
            else "--variant: the names must differ"
        )
    if a.seconds <= 0 or a.repeats < 1 or a.threads < 1:
        p.error("--seconds must be positive, --repeats and --threads at least 1")

    rates = np.full((len(a.configs), len(srcs), a.repeats), np.nan)
    loads = np.full_like(rates, np.nan)
    for r in range(a.repeats):
        for i, config in enumerate(a.configs):
            order = list(range(len(srcs)))
            if r % 2:
                order.reverse()  # neither source always goes first
            for j in order:
                loads[i, j, r] = os.getloadavg()[0]
                rates[i, j, r] = measure(srcs[j], config, [*a.overrides, *extra[j]], a.threads, a.seconds)
                print(
                    f"repeat {r} {config} src {names[j]}: {rates[i, j, r]:,.0f} samples/s (load {loads[i, j, r]:.2f})",
                    flush=True,
                )

    ds = xr.Dataset(
        {
            "samples_per_s": (
                ("config", "src", "repeat"),
                rates,
                {"long_name": "learner consumption TR_L", "units": "samples/s"},
            ),
            "load_1min": (
                ("config", "src", "repeat"),
                loads,
                {"long_name": "1-minute load average before the measurement", "units": "1"},
            ),
        },
        coords={"config": list(a.configs), "src": names, "repeat": np.arange(a.repeats)},
        attrs={
            "overrides": json.dumps(a.overrides),
            "variants": json.dumps({n: {"src": str(s), "overrides": e} for n, s, e in zip(names, srcs, extra)}),
            "seconds": a.seconds,
            "threads": a.threads,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
    )
    summary = {
        "overrides": a.overrides,
        "variants": {n: {"src": str(s), "overrides": e} for n, s, e in zip(names, srcs, extra)},
        "seconds": a.seconds,
        "threads": a.threads,
        "results": {},
    }
    for i, config in enumerate(a.configs):
        med = {n: statistics.median(rates[i, j]) for j, n in enumerate(names)}
        summary["results"][config] = {
            "samples_per_s": {n: rates[i, j].tolist() for j, n in enumerate(names)},
            "median": med,
            "ratio_to_first": {n: med[n] / med[names[0]] for n in names},
        }
        print(f"{config}: " + ", ".join(f"{n} {med[n]:,.0f} samples/s ({med[n] / med[names[0]]:.2f}x)" for n in names))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ds.to_netcdf(out / "learner_throughput.nc", engine="netcdf4")
    (out / "learner_throughput.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / 'learner_throughput.json'} and {out / 'learner_throughput.nc'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
