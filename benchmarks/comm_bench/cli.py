"""The command line of ``benchmarks/comm.py``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cases import DEFAULT_CAPACITY_MB, SWEEPS, CommBenchConfig, actor_counts
from .run import run
from .workload import SAMPLE_MODES

DEFAULT_OUT = Path("benchmarks/results/comm")


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks/comm.py", description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--small",
        action="store_true",
        help="N = 500 per case (200 for Queue/actor calls, 2,000 tiny messages) instead of 10,000",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument(
        "--max-actors",
        type=int,
        default=4,
        help="actor sweep 1, 2, 4, ... up to this many (one worker process each; default 4)",
    )
    p.add_argument(
        "--actors",
        default=None,
        metavar="LIST",
        help="comma-separated actor counts of the actor sweep instead of --max-actors' sweep, e.g. 16,32",
    )
    p.add_argument("--messages", type=int, default=None, help="N, messages to collect per case (overrides --small)")
    p.add_argument(
        "--tiny-messages",
        type=int,
        default=None,
        help="messages of the tiny sweep's case (default 20,000; 2,000 with --small)",
    )
    p.add_argument(
        "--sweeps",
        default=",".join(SWEEPS),
        metavar="LIST",
        help=f"comma-separated sweeps to run (default all: {','.join(SWEEPS)})",
    )
    p.add_argument(
        "--sample-times",
        default=None,
        metavar="LIST",
        help="comma-separated sample times of the actor sweep, seconds (default 0,0.001,0.01)",
    )
    p.add_argument(
        "--sample-mode",
        choices=SAMPLE_MODES,
        default="sleep",
        help="sampling step: sleep (default; no CPU) or busy (a pure-Python spin holding the GIL)",
    )
    p.add_argument(
        "--capacity-mb",
        type=float,
        default=DEFAULT_CAPACITY_MB,
        help=f"channel credit window per sender, MB (default {DEFAULT_CAPACITY_MB:g}, the config default)",
    )
    p.add_argument(
        "--unset-malloc-trim",
        action="store_true",
        help="start the workers without Dask's MALLOC_TRIM_THRESHOLD_=65536 (faster large receives)",
    )
    p.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment variable for the worker processes (repeatable; NAME= unsets it), "
        "e.g. MALLOC_MMAP_THRESHOLD_=16777216",
    )
    return p


def config_from_args(args) -> CommBenchConfig:
    if args.max_actors < 1:
        raise ValueError(f"--max-actors must be at least 1, got {args.max_actors}")
    env = {}
    for item in args.worker_env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--worker-env takes NAME=VALUE (NAME= to unset), got {item!r}")
        env[name] = value or None
    counts = actor_counts(args.max_actors)
    if args.actors is not None:
        try:
            counts = tuple(int(x) for x in args.actors.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"--actors takes comma-separated counts, e.g. 16,32, got {args.actors!r}") from None
        if not counts:
            raise ValueError(f"--actors needs at least one count, got {args.actors!r}")
    kw = {
        "actor_counts": counts,
        "sample_mode": args.sample_mode,
        "capacity_mb": args.capacity_mb,
        "unset_malloc_trim": args.unset_malloc_trim,
        "worker_env": env,
        "sweeps": tuple(x.strip() for x in args.sweeps.split(",") if x.strip()),
    }
    if args.sample_times is not None:
        try:
            kw["sample_times"] = tuple(float(x) for x in args.sample_times.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"--sample-times takes comma-separated seconds, got {args.sample_times!r}") from None
        if not kw["sample_times"] or min(kw["sample_times"]) < 0:
            raise ValueError(f"--sample-times needs at least one time >= 0, got {args.sample_times!r}")
    cfg = CommBenchConfig.small(**kw) if args.small else CommBenchConfig(**kw)
    if args.messages is not None:
        cfg.messages = args.messages
    if args.tiny_messages is not None:
        cfg.tiny_messages = args.tiny_messages
    cfg.validate()
    return cfg


def main(argv=None, description: str | None = None) -> int:
    args = build_parser(description).parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"benchmarks/comm.py: error: {exc}", file=sys.stderr)
        return 2
    ds = run(cfg, args.out, log=lambda s: print(s, flush=True))
    return 1 if json.loads(ds.attrs["errors"]) else 0
