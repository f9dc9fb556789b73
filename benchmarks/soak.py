"""Soak: a long CartPole DQN run whose target is out of reach, watched for leaks.

    python benchmarks/soak.py --minutes 30                   # the bar: 30 minutes
    python benchmarks/soak.py --minutes 2 --warmup-minutes 0.5 --out /tmp/soak   # a quick look

Every host reports its worker process's resident memory, open file descriptors and threads in
each heartbeat (``*_rss_mb``, ``*_open_fds``, ``*_threads`` in metrics.nc). After the warm-up
they must not grow: per host, the RSS at the end (median of the last minute) at most
``--rss-growth`` (5 %) above the RSS after warm-up (median of the minute after it), and the
descriptors and threads at the end no more than after warm-up. Writes ``soak.json`` (the figures
and the verdict), ``soak.nc`` (the per-host series) and ``soak.png`` into ``--out``, and the
run's own directory beneath it. Exit 0 when every host holds, 1 when one grew.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]
SERIES = ("rss_mb", "open_fds", "threads")


def window_median(da: xr.DataArray, start: float, stop: float) -> np.ndarray:
    """Per host: the median of ``da`` over ``start <= time < stop`` (NaN rows left out)."""
    sel = da.sel(time=slice(start, stop - 1e-9))
    return np.asarray(sel.median("time", skipna=True))


def verdict(ds: xr.Dataset, warmup_s: float, end_s: float, rss_growth: float, window_s: float) -> dict:
    """Per role and host: each series after warm-up and at the end, and whether it held."""
    out: dict = {"hosts": {}, "held": True}
    for role in ("actor", "buffer", "learner"):
        for series in SERIES:
            da = ds[f"{role}_{series}"]
            after = window_median(da, warmup_s, warmup_s + window_s)
            end = window_median(da, end_s - window_s, end_s)
            for i, (a, e) in enumerate(zip(after, end)):
                host = out["hosts"].setdefault(f"{role} {i}", {})
                allowed = a * (1 + rss_growth) if series == "rss_mb" else a
                held = bool(np.isfinite(a) and np.isfinite(e) and e <= allowed)
                host[series] = {"after_warmup": float(a), "end": float(e), "allowed": float(allowed), "held": held}
                out["held"] &= held
    return out


def plot(ds: xr.Dataset, warmup_s: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4), constrained_layout=True)
    minutes = ds["time"] / 60
    for ax, series in zip(axes, SERIES):
        for role in ("actor", "buffer", "learner"):
            da = ds[f"{role}_{series}"]
            for i in range(da.sizes[role]):
                ax.plot(minutes, da.isel({role: i}), label=f"{role} {i}")
        ax.axvline(warmup_s / 60, color="gray", linestyle=":", label="end of warm-up")
        ax.set_xlabel("minutes")
        ax.set_title(series)
    axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "cartpole_dqn.yaml"))
    p.add_argument("--minutes", type=float, default=30.0, help="length of the run (default 30)")
    p.add_argument("--warmup-minutes", type=float, default=5.0, help="growth is measured after this (default 5)")
    p.add_argument("--window-minutes", type=float, default=1.0, help="medians over windows this long (default 1)")
    p.add_argument("--rss-growth", type=float, default=0.05, help="allowed RSS growth after warm-up (default 0.05)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak")
    a = p.parse_args(argv)
    if a.minutes <= a.warmup_minutes + 2 * a.window_minutes:
        p.error("--minutes must exceed --warmup-minutes by at least two windows (--window-minutes)")
    if a.out.exists() and any(a.out.iterdir()):
        p.error(f"--out {a.out} is not empty; choose a new directory (nothing is replaced)")

    from tianji_dask.config import load_config
    from tianji_dask.runtime.driver import train

    seconds = a.minutes * 60
    cfg = load_config(
        a.config,
        ["stop.target_return=null", "stop.max_env_steps=null", f"stop.max_seconds={seconds}", "run.checkpoint=false"],
    )
    a.out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    t0 = time.time()

    def on_row(row: dict) -> None:
        if int(row["time"]) % 60 == 0:
            print(f"{row['time'] / 60:5.1f} min  env steps {row['env_steps']:,.0f}", flush=True)

    result = train(cfg, out=a.out / "run", on_row=on_row, on_event=lambda text: print(text, flush=True)).wait()
    if result.status != "max_seconds":
        print(f"soak: the run ended {result.status}: {result.error}", file=sys.stderr)
        return 1
    with xr.open_dataset(result.run_dir / "metrics.nc", engine="netcdf4") as metrics:
        names = [f"{role}_{s}" for role in ("actor", "buffer", "learner") for s in SERIES]
        ds = metrics[names].load()
    end_s = float(ds["time"].max())
    figures = verdict(ds, a.warmup_minutes * 60, end_s, a.rss_growth, a.window_minutes * 60)
    figures.update(
        config=a.config,
        minutes=a.minutes,
        warmup_minutes=a.warmup_minutes,
        window_minutes=a.window_minutes,
        rss_growth_allowed=a.rss_growth,
        env_steps=result.env_steps,
        wall_s=round(time.time() - t0, 1),
        load_before=load_before,
        load_after=os.getloadavg(),
        cpus=os.cpu_count(),
    )
    ds.attrs.update(config=a.config, warmup_s=a.warmup_minutes * 60, held=int(figures["held"]))
    ds.to_netcdf(a.out / "soak.nc", engine="netcdf4")
    (a.out / "soak.json").write_text(json.dumps(figures, indent=2))
    plot(ds, a.warmup_minutes * 60, a.out / "soak.png")
    for host, series in figures["hosts"].items():
        print(
            f"{host}: "
            + ", ".join(
                f"{k} {v['after_warmup']:.1f} -> {v['end']:.1f} ({'ok' if v['held'] else 'GREW'})"
                for k, v in series.items()
            )
        )
    print(f"soak: {'held' if figures['held'] else 'grew'}; wrote {a.out}/soak.json, soak.nc, soak.png")
    return 0 if figures["held"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
