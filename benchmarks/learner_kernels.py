"""Where a learner iteration's GPU time goes: the kernels of a few steady-state iterations,
under torch.profiler, as a table (the top kernels by device time) and totals per iteration
(kernels launched, their summed device time, the wall time). The companion of
``learner_throughput.py``: that one says how fast, this one says on what.

    python benchmarks/learner_kernels.py configs/pong_ppo.yaml --set algo.precision=bf16
    python benchmarks/learner_kernels.py configs/pong_ppo.yaml --src /tmp/old

The learner is :func:`tianji_dask.deploy.profiling.measure_learner`'s (the serial runner's learner on
a batch its actor made), on ``--device`` (default cuda), imported from ``--src`` (a directory
holding ``tianji_dask``; default: this checkout). It warms up ``--warmup`` iterations (CUDA
graphs captured), then profiles ``--iterations``. Writes ``<out>/learner_kernels.txt`` and
``.json``. Kernels inside a CUDA graph's replay are listed where the profiler sees them (CUPTI
on CUDA 12 does); if the table holds only ``cudaGraphLaunch``, compare with
``--set algo.cuda_graph=minibatch`` or an eager variant.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("config", help="experiment config file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--src", default=str(ROOT), metavar="DIR", help="source tree holding tianji_dask/")
    p.add_argument("--device", default="cuda")
    p.add_argument("--warmup", type=int, default=3, help="iterations before profiling (default 3)")
    p.add_argument("--iterations", type=int, default=3, help="iterations profiled (default 3)")
    p.add_argument("--rows", type=int, default=30, help="kernels in the table (default 30)")
    p.add_argument("--out", default="benchmarks/results/learner_kernels", help="output directory")
    a = p.parse_args(argv)
    if a.warmup < 0 or a.iterations < 1:
        p.error("--warmup must be 0 or more, --iterations at least 1")
    src = Path(a.src).resolve()
    if not (src / "tianji_dask" / "__init__.py").is_file():
        p.error(f"--src {src}: holds no tianji_dask package")
    sys.path.insert(0, str(src))

    import torch
    from torch.profiler import ProfilerActivity, profile

    import tianji_dask
    from tianji_dask.algos.registry import spec_for
    from tianji_dask.config import load_config
    from tianji_dask.deploy.profiling import _steady_config
    from tianji_dask.runtime.serial import SerialRun

    torch.set_num_threads(1)
    cfg = _steady_config(load_config(a.config, a.overrides), device=a.device)
    run = SerialRun(cfg)
    run.learner.publish()
    run.actor.probe_params()
    work, _ = spec_for(cfg).learner_workload(run)
    run.actor.close()
    cuda = torch.device(a.device).type == "cuda"
    for _ in range(a.warmup):
        work()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    samples = 0
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(a.iterations):
            samples += work()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0

    def device_us(e) -> float:
        for name in ("self_device_time_total", "self_cuda_time_total"):
            if hasattr(e, name):
                return float(getattr(e, name))
        return 0.0

    kernels = [e for e in prof.events() if cuda and e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_us = sum(device_us(e) for e in kernels)
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    try:
        table = prof.key_averages().table(sort_by=sort, row_limit=a.rows)
    except (AttributeError, KeyError, ValueError):
        table = prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else sort, row_limit=a.rows)
    n = a.iterations
    summary = {
        "config": a.config,
        "overrides": a.overrides,
        "package": tianji_dask.__file__,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "iterations": n,
        "samples_per_s": samples / wall,
        "wall_ms_per_iteration": wall / n * 1e3,
        "device_events_per_iteration": len(kernels) / n,
        "device_ms_per_iteration": kernel_us / n / 1e3,
    }
    text = "\n".join([json.dumps(summary, indent=2), table])
    print(text)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "learner_kernels.txt").write_text(text + "\n")
    (out / "learner_kernels.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
