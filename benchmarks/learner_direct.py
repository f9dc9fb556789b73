"""A PPO learner's update alone: ``PPOLearner.train`` on synthetic Atari batches already in this
process, without the role, the actor or the buffer, for every combination of ``algo.precision``
x ``algo.cuda_graph`` x ``cudnn.benchmark``. Where ``learner_throughput.py`` measures the whole
learner path on a real actor's rollouts, this isolates the device's part.

    python benchmarks/learner_direct.py configs/pong_ppo.yaml --out benchmarks/results/NAME

Two rates per variant: ``batch_samples_per_s`` counts each transition of a batch once (the unit
of ``learner_throughput.py`` and of the metrics' ``train_fps``); ``gradient_samples_per_s``
counts it once per epoch (``algo.epochs`` passes over the batch). Needs CUDA: on a CPU one
8,192-sample Nature-CNN iteration takes tens of seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tianji_dask.algos.ppo.core import PPOLearner  # noqa: E402
from tianji_dask.config import load_config  # noqa: E402


def atari_batch(n: int, seed: int, extra_frames: int = 192) -> dict[str, np.ndarray]:
    """A rollout-shaped batch: ``n`` stacks of 4 over ``n + extra_frames`` random 84x84 frames."""
    rng = np.random.default_rng(seed)
    n_frames = n + extra_frames
    return {
        "frames": rng.integers(0, 256, (n_frames, 84, 84), dtype=np.uint8),
        "obs_frames": (rng.integers(0, n_frames - 3, n)[:, None] + np.arange(4)).astype(np.int32),
        "actions": rng.integers(0, 6, n).astype(np.int64),
        "logp": np.log(rng.uniform(0.1, 0.3, n)).astype(np.float32),
        "advantages": rng.normal(size=n).astype(np.float32),
        "returns": rng.normal(size=n).astype(np.float32),
    }


def measure(algo, batches: list[dict], warmup: int, iterations: int) -> float:
    """Seconds per iteration after ``warmup`` iterations (a graph is captured in the second)."""
    learner = PPOLearner(0, 6, algo, seed=0, device="cuda", network="nature_cnn")
    for i in range(warmup):
        learner.train(batches[i % len(batches)])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(iterations):
        learner.train(batches[i % len(batches)])
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iterations


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", help="a PPO Atari config (its algo section is used)")
    p.add_argument("--precision", nargs="+", default=["fp32", "tf32", "bf16"])
    p.add_argument("--cuda-graph", nargs="+", default=["iteration", "minibatch"])
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA device: torch.cuda.is_available() is False here")
    algo0 = load_config(a.config).algo
    n = algo0.rollout_steps * load_config(a.config).env.num_envs * algo0.rollouts_per_update
    batches = [atari_batch(n, s) for s in range(4)]
    results = []
    for precision, graph, bench in itertools.product(a.precision, a.cuda_graph, (False, True)):
        torch.backends.cudnn.benchmark = bench
        algo = algo0.model_copy(update={"precision": precision, "cuda_graph": graph})
        row = {"precision": precision, "cuda_graph": graph, "cudnn_benchmark": bench}
        try:
            s = measure(algo, batches, warmup=3, iterations=a.iterations)
            row |= {"batch_samples_per_s": n / s, "gradient_samples_per_s": n * algo.epochs / s}
            print(f"{precision:5s} {graph:9s} cudnn.benchmark={bench!s:5s}: {n / s:9,.0f} batch samples/s", flush=True)
        except Exception as exc:  # noqa: BLE001 - one variant failing (a capture) is a result too
            row["error"] = repr(exc)[:300]
            print(f"{precision:5s} {graph:9s} cudnn.benchmark={bench!s:5s}: failed: {row['error']}", flush=True)
        results.append(row)
    a.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "config": a.config,
        "batch": n,
        "epochs": algo0.epochs,
        "minibatches": algo0.minibatches,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "host": platform.node(),
        "load_1min": os.getloadavg()[0],
    }
    (a.out / "learner_direct.json").write_text(json.dumps({**meta, "results": results}, indent=1))
    print(f"wrote {a.out / 'learner_direct.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
