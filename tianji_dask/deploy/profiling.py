"""Performance analysis (the paper's first step of its distribution strategy): measure what one
config's components produce and consume on the current cluster.

* TR_A(k): env steps per second produced by ``k`` actor processes stepping at once (one core
  each), for k = 1, 2, 4, ... up to the actor cores available;
* TR_L(T, B): samples per second a learner consumes with ``T`` torch threads at batch size ``B``;
* with ``gpu=True`` (``--gpu``), on the workers' GPU: TR_L(B) of a learner on the GPU, and, for
  envs that step on threads (ale-py's vector env), TR_A(t) of one actor process with its
  inference on the GPU and its envs stepped by ``t`` threads;
* the message: bytes per trajectory chunk (or rollout), and the time to serialize (T_sd) and
  deserialize (T_rv) one with distributed's protocol;
* replay memory bytes per transition (the planner's memory check).

The CPU actors are single-core (one env thread, inference on the CPU) and the CPU learner
trains on the CPU, whatever devices the config names: the planner chooses the devices.

Every measurement runs the real role objects (the serial runner's actor, buffer and learner,
wired by in-process channels) inside a Dask worker, with exploration at its final value so the
actor does its steady-state work. Results go to an xarray Dataset (``profile.nc``), which
:func:`tianji_dask.deploy.planner.Profile.from_dataset` reads back, so a plan can be recomputed without
profiling again.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import numpy as np

from tianji_dask.algos.registry import spec_for
from tianji_dask.config import ExperimentConfig
from tianji_dask.config.deployment import deployment_settings
from tianji_dask.runtime.cluster.workers import scheduler_workers

DEFAULT_SECONDS = 3.0


def _steady_config(
    cfg: ExperimentConfig,
    batch_size: int | None = None,
    *,
    device: str = "cpu",
    env_threads: int | None = None,
) -> ExperimentConfig:
    """The config as the profile runs it: no balance controller, exploration already decayed,
    warm-up as short as a batch, the batch size under test, the learner and the actor's
    inference on ``device``, and ``env_threads`` threads stepping the envs (where they do)."""
    data = cfg.model_dump(mode="json")
    data["algo"]["ratio_tolerance"] = None
    spec_for(cfg).steady_algo(data["algo"], batch_size)
    data["topology"].update(actors=1, learners=1, groups=1, mode="relaxed")
    data["learner"]["device"] = data["actor"]["device"] = device
    if env_threads is not None and cfg.env.stepping_threads:
        data["env"]["atari_threads"] = env_threads
    return ExperimentConfig.model_validate(data)


def measure_actor(cfg_json: str, seconds: float, start_at: float, device: str = "cpu", env_threads: int = 1) -> dict:
    """One actor process's production (env steps/s), and its message size and (de)serialization
    time. Waits until the wall clock reaches ``start_at`` so that concurrent actors overlap."""
    import torch
    from distributed.protocol import dumps, loads

    from tianji_dask.runtime.serial import SerialRun

    torch.set_num_threads(1)
    cfg = _steady_config(ExperimentConfig.model_validate_json(cfg_json), device=device, env_threads=env_threads)
    run = SerialRun(cfg)
    run.learner.publish()
    run.actor.probe_params()
    for _ in range(20):  # first steps: lazy allocations, first env resets
        run.actor.step()
    run.queue.poll()
    time.sleep(max(0.0, start_at - time.time()))
    steps0 = run.actor.counters.env_steps
    busy = 0.0
    last = None
    t_end = time.perf_counter() + seconds
    while (now := time.perf_counter()) < t_end:
        run.actor.step()
        busy += time.perf_counter() - now
        items = run.queue.poll()
        if items:
            last = items[-1]
    steps = run.actor.counters.env_steps - steps0
    run.actor.flush()
    while last is None:  # a slow actor (a whole rollout per message) sends after the window
        items = run.queue.poll()
        if items:
            last = items[-1]
        else:
            run.actor.step()
    run.actor.close()
    msg = {"items": [[0, last.nbytes, last.payload]]}
    t = time.perf_counter()
    frames = dumps(msg)
    t_sd = time.perf_counter() - t
    t = time.perf_counter()
    loads(frames)
    t_rv = time.perf_counter() - t
    return {
        "env_steps_per_s": steps / busy,
        "message_bytes": int(sum(len(memoryview(f)) for f in frames)),
        "steps_per_message": spec_for(cfg).steps_per_message(cfg),
        "serialize_s": t_sd,
        "deserialize_s": t_rv,
    }


def measure_learner(cfg_json: str, threads: int, batch_size: int | None, seconds: float, device: str = "cpu") -> dict:
    """A learner's consumption (samples/s) with ``threads`` torch threads on ``device``, on a
    buffer filled by its actor, and the replay memory's bytes per transition."""
    import torch

    from tianji_dask.runtime.serial import SerialRun

    torch.set_num_threads(threads)
    cfg = _steady_config(ExperimentConfig.model_validate_json(cfg_json), batch_size, device=device)
    run = SerialRun(cfg)
    run.learner.publish()
    run.actor.probe_params()
    spec = spec_for(cfg)
    work, per_transition = spec.learner_workload(run)
    run.actor.close()
    work()  # first update: optimizer state, lazy allocations
    if torch.device(cfg.learner.device).type == "cuda":
        work()  # a PPO learner captures its iteration's CUDA graph in its second iteration
    samples = 0
    t0 = time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds or samples == 0:
        samples += work()
    if torch.device(cfg.learner.device).type == "cuda":  # updates still queued count once done
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
    return {
        "samples_per_s": samples / elapsed,
        "replay_bytes_per_transition": per_transition,
        "batch_size": spec.samples_per_update(cfg),
    }


def doubling(limit: int) -> list[int]:
    """1, 2, 4, ... below ``limit``, then ``limit`` itself."""
    out, k = [], 1
    while k < limit:
        out.append(k)
        k *= 2
    return out + [limit] if limit >= 1 else []


def profile(
    cfg: ExperimentConfig,
    client,
    *,
    seconds: float = DEFAULT_SECONDS,
    max_actors: int | None = None,
    max_threads: int | None = None,
    batch_sizes: list[int] | None = None,
    gpu: bool = False,
    log=lambda s: None,
):
    """Measure TR_A and TR_L on ``client``'s cluster; returns the profile Dataset.

    Actors: k single-threaded actor processes at once on k different workers. Learner: one at a
    time, on one worker, with T torch threads (T up to the cluster's cores less one). With
    ``gpu``, also on the first worker's GPU: the learner, and one actor with its inference there
    and t env threads (t up to the cores less one, at most the envs)."""
    addresses, cores, gpu_name = _cluster_to_profile(client, gpu)
    max_actors = min(max_actors or len(addresses), len(addresses))
    max_threads = max(1, cores - 1) if max_threads is None else max_threads  # 0: no learner on the CPU
    batch_sizes = spec_for(cfg).profile_batch_sizes(cfg, batch_sizes)

    actor_counts = doubling(max_actors)
    tr_a, per_msg = _measure_actors(client, cfg, addresses, actor_counts, seconds, log)
    thread_counts = doubling(max_threads)
    tr_l, bytes_per_transition = _measure_learners(client, cfg, addresses[0], thread_counts, batch_sizes, seconds, log)
    gpu_vars, gpu_coords = {}, {}
    if gpu:
        gpu_vars, gpu_coords, bytes_per_transition = _profile_gpu(
            client, cfg, addresses[0], batch_sizes, cores, seconds, log
        )

    import xarray as xr

    return xr.Dataset(
        {**_cpu_variables(tr_a, tr_l, per_msg, bytes_per_transition), **gpu_vars},
        coords={
            "actors": ("actors", actor_counts, {"long_name": "actor processes stepping at once", "units": "1"}),
            "threads": ("threads", thread_counts, {"long_name": "learner torch threads", "units": "1"}),
            "batch_size": ("batch_size", batch_sizes, {"long_name": "learner batch size", "units": "samples"}),
            **gpu_coords,
        },
        attrs={
            "title": "tianji-dask performance profile (TR_A, TR_L)",
            "config": cfg.to_json(),
            "algo": cfg.algo.name,
            "env_id": cfg.env.id,
            "replay_ratio": cfg.algo.target_replay_ratio,
            "cluster_cores": cores,
            "cluster_workers": len(addresses),
            "seconds_per_measurement": seconds,
            "machine": platform.platform(),
            "gpu": gpu_name or "none",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
    )


def _cluster_to_profile(client, gpu: bool) -> tuple[list[str], int, str | None]:
    """The workers' addresses, the cores they have (at most the node's), and with ``gpu`` the
    name of the first worker's GPU, which it must have."""
    workers = sorted(scheduler_workers(client).items())
    if not workers:
        raise RuntimeError("the cluster has no workers to profile on")
    addresses = [a for a, _ in workers]
    gpu_name = client.submit(_cuda_device_name, workers=[addresses[0]], pure=False).result() if gpu else None
    if gpu and gpu_name is None:
        raise ProfileError(
            f"--gpu: the worker {addresses[0]} sees no CUDA device (torch.cuda.is_available() is "
            "False there); profile on a machine with the GPU, or without --gpu"
        )
    cores = min(sum(int(w.get("nthreads", 1)) for _, w in workers), _node_cpus(client))
    return addresses, cores, gpu_name


def _measure_actors(client, cfg: ExperimentConfig, addresses: list[str], actor_counts: list[int], seconds, log):
    """TR_A for each of ``actor_counts``: k actors at once on the first k workers; and the first
    measurement's message (its size, steps and (de)serialization times)."""
    cfg_json = cfg.to_json()
    tr_a, per_msg = [], None
    for k in actor_counts:
        start_at = time.time() + 2.0  # every actor builds its env and policy first
        futs = [
            client.submit(
                measure_actor,
                cfg_json,
                seconds,
                start_at,
                workers=[addresses[i]],
                pure=False,
                allow_other_workers=False,
            )
            for i in range(k)
        ]
        results = client.gather(futs)
        tr_a.append(sum(r["env_steps_per_s"] for r in results))
        per_msg = per_msg or results[0]
        log(f"actors {k:3d}: TR_A {tr_a[-1]:10.0f} env steps/s")
    assert per_msg is not None  # doubling() gives at least one actor count
    return tr_a, per_msg


def _measure_learners(
    client, cfg: ExperimentConfig, address: str, thread_counts: list[int], batch_sizes: list[int], seconds, log
) -> tuple[np.ndarray, float]:
    """TR_L (threads x batch sizes) of one learner at a time on ``address``, and the replay
    memory's bytes per transition (0 when no learner ran)."""
    spec, cfg_json = spec_for(cfg), cfg.to_json()
    tr_l = np.zeros((len(thread_counts), len(batch_sizes)))
    bytes_per_transition = 0.0
    for i, t in enumerate(thread_counts):
        for j, b in enumerate(batch_sizes):
            r = client.submit(
                measure_learner,
                cfg_json,
                t,
                b if spec.tunable_batch else None,
                seconds,
                workers=[address],
                pure=False,
            ).result()
            tr_l[i, j] = r["samples_per_s"]
            bytes_per_transition = r["replay_bytes_per_transition"]
            log(f"learner threads {t:3d} batch {b:6d}: TR_L {tr_l[i, j]:10.0f} samples/s")
    return tr_l, bytes_per_transition


def _cpu_variables(tr_a: list[float], tr_l: np.ndarray, per_msg: dict, bytes_per_transition: float) -> dict:
    """The profile's variables measured on the CPU, each with its long name and units."""
    return {
        "actor_env_steps_per_s": (
            "actors",
            np.asarray(tr_a),
            {"long_name": "production throughput TR_A of k actors at once", "units": "env steps/s"},
        ),
        "learner_samples_per_s": (
            ("threads", "batch_size"),
            tr_l,
            {"long_name": "consumption throughput TR_L of one learner", "units": "samples/s"},
        ),
        "message_bytes": ((), per_msg["message_bytes"], {"long_name": "serialized trajectory message", "units": "B"}),
        "steps_per_message": (
            (),
            per_msg["steps_per_message"],
            {"long_name": "env steps per trajectory message", "units": "1"},
        ),
        "serialize_s": (
            (),
            per_msg["serialize_s"],
            {"long_name": "time to serialize one message (T_sd)", "units": "s"},
        ),
        "deserialize_s": (
            (),
            per_msg["deserialize_s"],
            {"long_name": "time to deserialize one message (T_rv)", "units": "s"},
        ),
        "replay_bytes_per_transition": (
            (),
            bytes_per_transition,
            {"long_name": "replay memory per transition", "units": "B"},
        ),
    }


class ProfileError(RuntimeError):
    """The cluster cannot take a measurement asked for; the message names the fix."""


def _cuda_device_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def _profile_gpu(client, cfg: ExperimentConfig, address: str, batch_sizes, cores: int, seconds: float, log):
    """The GPU's measurements on the worker at ``address``: (data variables, coordinates, the
    replay's bytes per transition)."""
    spec = spec_for(cfg)
    cfg_json = cfg.to_json()
    tr_l = []
    for b in batch_sizes:
        r = client.submit(
            measure_learner,
            cfg_json,
            1,
            b if spec.tunable_batch else None,
            seconds,
            "cuda",
            workers=[address],
            pure=False,
        ).result()
        tr_l.append(r["samples_per_s"])
        bytes_per_transition = r["replay_bytes_per_transition"]
        log(f"learner on the GPU, batch {b:6d}: TR_L {tr_l[-1]:10.0f} samples/s")
    variables = {
        "gpu_learner_samples_per_s": (
            "batch_size",
            np.asarray(tr_l),
            {"long_name": "consumption throughput TR_L of one learner on the GPU", "units": "samples/s"},
        )
    }
    if not cfg.env.stepping_threads:
        return variables, {}, bytes_per_transition
    thread_counts = doubling(max(1, min(cores - 1, cfg.env.num_envs)))
    tr_a = []
    for t in thread_counts:
        r = client.submit(
            measure_actor, cfg_json, seconds, time.time(), "cuda", t, workers=[address], pure=False
        ).result()
        tr_a.append(r["env_steps_per_s"])
        log(f"actor with inference on the GPU, {t:3d} env threads: TR_A {tr_a[-1]:10.0f} env steps/s")
    variables["gpu_actor_env_steps_per_s"] = (
        "env_threads",
        np.asarray(tr_a),
        {"long_name": "production throughput TR_A of one actor with inference on the GPU", "units": "env steps/s"},
    )
    coords = {
        "env_threads": (
            "env_threads",
            thread_counts,
            {"long_name": "threads stepping the GPU actor's envs", "units": "1"},
        )
    }
    return variables, coords, bytes_per_transition


def _node_cpus(client) -> int:
    """CPUs of the machines the workers run on (a LocalCluster of single-threaded workers
    reports 1 thread each, but its machine may have more cores than workers)."""
    info = client.run(_cpu_count)
    hosts = {}
    for addr, n in info.items():
        hosts[addr.rsplit(":", 1)[0]] = n
    return sum(hosts.values())


def default_profile_path(config, scheduler: str | None = None) -> Path:
    """Where ``tianji-dask profile`` writes without ``--out``: ``<runs-dir>/profiles/<config>-<N>cores.nc``
    for this machine's N cores, or ``<config>-<host>-<port>.nc`` for a ``--scheduler``'s cluster
    (``tianji.runs-dir``, :mod:`tianji_dask.config.deployment`; ``runs`` by default)."""
    profiles = deployment_settings().runs_dir / "profiles"
    if scheduler is None:
        return profiles / f"{Path(config).stem}-{_cpu_count()}cores.nc"
    from distributed.comm.addressing import get_address_host_port

    host, port = get_address_host_port(scheduler)
    return profiles / f"{Path(config).stem}-{host.replace(':', '-')}-{port}.nc"


def _cpu_count() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def save(ds, path) -> None:
    """Write the profile atomically (an existing profile is replaced only by a complete one)."""
    from pathlib import Path

    from tianji_dask.results.recorder import write_netcdf_atomic

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_netcdf_atomic(ds, Path(path))


def describe(ds) -> str:
    lines = [f"profile of {ds.attrs['algo']} on {ds.attrs['env_id']} ({ds.attrs['cluster_cores']} cores)"]
    for k, v in zip(ds.actors.values, ds.actor_env_steps_per_s.values):
        lines.append(f"  TR_A({int(k)} actors) = {v:,.0f} env steps/s")
    for t in ds.threads.values:
        for b in ds.batch_size.values:
            v = float(ds.learner_samples_per_s.sel(threads=t, batch_size=b))
            lines.append(f"  TR_L({int(t)} threads, batch {int(b)}) = {v:,.0f} samples/s")
    if "gpu_learner_samples_per_s" in ds:
        for b in ds.batch_size.values:
            v = float(ds.gpu_learner_samples_per_s.sel(batch_size=b))
            lines.append(f"  TR_L(GPU {ds.attrs.get('gpu')}, batch {int(b)}) = {v:,.0f} samples/s")
    if "gpu_actor_env_steps_per_s" in ds:
        for t, v in zip(ds.env_threads.values, ds.gpu_actor_env_steps_per_s.values):
            lines.append(f"  TR_A(1 actor, inference on the GPU, {int(t)} env threads) = {v:,.0f} env steps/s")
    lines.append(
        f"  message {int(ds.message_bytes):,} B per {int(ds.steps_per_message)} env steps; "
        f"T_sd {float(ds.serialize_s) * 1e3:.2f} ms, T_rv {float(ds.deserialize_s) * 1e3:.2f} ms"
    )
    return "\n".join(lines)
