"""Atari throughput: sample, receive and training throughput of a Pong config in env frames per
second, with the raw ALE step rate of one core measured in the same run as the anchor.

    python benchmarks/atari_throughput.py configs/pong_dqn_small.yaml configs/pong_ppo_small.yaml --seconds 60

Per config: (1) raw anchor: one process steps the config's env (same backend, same
preprocessing, random actions, ``num_envs`` envs, one thread) for ``--raw-seconds``; (2) a
training run of ``--seconds`` on a LocalCluster sized by the config; rates are medians over the
run's rows after warm-up (learning_starts for DQN) and before shutdown. Frames = env steps x
frame skip 4. ``fraction_of_raw`` = sample rate / (raw rate per core x actor processes).
Writes ``<out>/atari_throughput.json`` and ``.nc`` (dim ``config``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FRAME_SKIP = 4


def raw_rate(cfg, seconds: float) -> float:
    """Env steps per second of one core stepping the config's vector env with random actions."""
    import torch

    from tianji_dask.envs import make_env

    torch.set_num_threads(1)
    env = make_env(cfg.env, seed=0)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    n_act = env.single_action_space.n
    for _ in range(50):
        env.step(rng.integers(0, n_act, env.num_envs))
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.step(rng.integers(0, n_act, env.num_envs))
        steps += env.num_envs
    rate = steps / (time.perf_counter() - t0)
    env.close()
    return rate


def run_rates(cfg, seconds: float, out: Path) -> dict:
    import xarray as xr

    from tianji_dask.config import apply_overrides, validate_config
    from tianji_dask.runtime.driver import train

    data = apply_overrides(
        cfg.model_dump(mode="json"),
        ["stop.target_return=null", "stop.max_env_steps=null", f"stop.max_seconds={seconds}", "run.checkpoint=false"],
    )
    res = train(validate_config(data), out=out).wait()
    with xr.open_dataset(Path(res.run_dir) / "metrics.nc", engine="netcdf4") as ds:
        t = ds.time.values
        warm = ds.updates.values > 0  # the learner trains: warm-up is over
        keep = warm & (t < t[-1] - 1.0)
        if keep.sum() < 3:
            keep = t < t[-1] - 1.0
        med = {k: float(np.nanmedian(ds[k].values[keep])) for k in ("env_fps", "receive_fps", "train_fps")}
        med["rows"] = int(keep.sum())
        med["return_mean_100_last"] = float(ds.return_mean_100.values[-1])
    med.update(status=res.status, error=res.error, env_steps=res.env_steps, wall_s=res.wall_s)
    return med


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("configs", nargs="+")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--raw-seconds", type=float, default=5.0)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/atari_throughput"))
    args = p.parse_args(argv)

    import xarray as xr

    from tianji_dask.config import load_config
    from tianji_dask.results.provenance import provenance_attrs
    from tianji_dask.results.recorder import write_netcdf_atomic

    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="atari-throughput-") as tmp:
        for path in args.configs:
            cfg = load_config(path, args.overrides)
            load = os.getloadavg()[0]
            raw = raw_rate(cfg, args.raw_seconds)
            r = run_rates(cfg, args.seconds, Path(tmp) / Path(path).stem)
            actor_cores = cfg.topology.groups * cfg.topology.actors
            row = {
                "config": Path(path).stem,
                "algo": cfg.algo.name,
                "actors": actor_cores,
                "num_envs": cfg.env.num_envs,
                "learner_device": cfg.learner.device,
                "raw_env_steps_per_s_per_core": raw,
                "raw_frames_per_s_per_core": raw * FRAME_SKIP,
                "sample_frames_per_s": r["env_fps"] * FRAME_SKIP,
                "receive_frames_per_s": r["receive_fps"] * FRAME_SKIP,
                "train_samples_per_s": r["train_fps"],
                "train_frames_per_s": r["train_fps"] / cfg.algo.target_replay_ratio * FRAME_SKIP,
                "fraction_of_raw": r["env_fps"] / (raw * actor_cores),
                "load_avg_1m": load,
                **{k: r[k] for k in ("status", "error", "env_steps", "wall_s", "rows", "return_mean_100_last")},
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    names = [r["config"] for r in rows]
    var = lambda key, long, units: ("config", [r[key] for r in rows], {"long_name": long, "units": units})  # noqa: E731
    ds = xr.Dataset(
        {
            "raw_frames_per_s_per_core": var(
                "raw_frames_per_s_per_core", "raw ALE rate of one core, same preprocessing", "frames/s"
            ),
            "sample_frames_per_s": var("sample_frames_per_s", "sample throughput (all actors)", "frames/s"),
            "receive_frames_per_s": var("receive_frames_per_s", "receive throughput (all buffers)", "frames/s"),
            "train_frames_per_s": var(
                "train_frames_per_s", "training throughput, env frames consumed at the serial replay ratio", "frames/s"
            ),
            "train_samples_per_s": var("train_samples_per_s", "training throughput", "samples/s"),
            "fraction_of_raw": var("fraction_of_raw", "sample rate / (raw rate per core x actor processes)", "1"),
            "actors": var("actors", "actor processes", "1"),
        },
        coords={"config": ("config", names, {"long_name": "config file", "units": "1"})},
        attrs={
            "title": "Atari throughput",
            "machine": platform.platform(),
            "cpu_count": os.cpu_count(),
            "seconds_per_run": args.seconds,
            **{k: str(v) for k, v in provenance_attrs().items()},
        },
    )
    write_netcdf_atomic(ds, args.out / "atari_throughput.nc")
    (args.out / "atari_throughput.json").write_text(json.dumps(rows, indent=1, default=str))
    print(f"wrote {args.out}/atari_throughput.nc, .json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
