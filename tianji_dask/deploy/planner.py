"""The planner: TianJi's distribution strategy (paper, equations 2 to 4) as a pure function.

    maximise  min(TR_L, TR_A)   subject to   N_c / N_s = P,   M_A + M_L = M,   TR_L ~ TR_A

Units: TR_A is env steps produced per second; the learner consumes TR_L samples per second,
which at the serial algorithm's replay ratio R (samples consumed per env step produced, fixed
by the config) stands for TR_L / R env steps per second. A group is one learner with T torch
threads plus A single-core actors (M_A = A, M_L = T); its throughput is
min(TR_A(A), TR_L(T, B) / R). Beyond one balanced group the planner replicates groups (paper,
Fig. 6c): G groups of M // G cores each.

Staleness: the replay ratio R and P = B_s / N_s are the serial algorithm's. The balance
controller (``algo.ratio_tolerance``) holds R at run time; when the plan picks another batch
size B for DQN it scales ``train_freq`` and ``buffer_size`` with it, so R and P stay as they were.

:func:`make_plan` reads only its arguments (a :class:`Profile`, :class:`Resources` and the
config), so it is tested on synthetic profiles with known optima.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tianji_dask.algos.registry import ALGORITHMS, spec_for
from tianji_dask.config.deployment import deployment_settings

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig

# Memory a host process needs besides replay: Python, torch, Dask worker (docs/benchmarks.md,
# "Memory of a host process", has the measurements these round up).
ACTOR_PROCESS_BYTES = 512 * 2**20
LEARNER_PROCESS_BYTES = 1024 * 2**20
TIE = 0.02  # throughputs within 2 % count as equal; the simpler plan wins


class PlanError(ValueError):
    """An infeasible request; the message carries the arithmetic."""


@dataclass(frozen=True)
class Profile:
    """What the planner needs from a profile (``tianji-dask profile``'s profile.nc)."""

    actors: tuple[int, ...]  # actor processes measured at once
    actor_env_steps_per_s: tuple[float, ...]  # TR_A(k), all k actors together
    threads: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    learner_samples_per_s: tuple[tuple[float, ...], ...]  # TR_L[threads][batch]
    replay_bytes_per_transition: float = 0.0
    message_bytes: int = 0
    # Measured on a GPU (``tianji-dask profile --gpu``); empty when not.
    gpu_learner_samples_per_s: tuple[float, ...] = ()  # TR_L on the GPU, by batch size
    env_threads: tuple[int, ...] = ()  # env threads of the one GPU-inference actor measured
    gpu_actor_env_steps_per_s: tuple[float, ...] = ()  # TR_A of that actor, by env threads

    def __post_init__(self):
        if not self.actors or len(self.actors) != len(self.actor_env_steps_per_s):
            raise PlanError("profile: actors and actor_env_steps_per_s must be non-empty and of equal length")
        if self.gpu_learner_samples_per_s and len(self.gpu_learner_samples_per_s) != len(self.batch_sizes):
            raise PlanError("profile: gpu_learner_samples_per_s needs one value per batch size")
        if len(self.env_threads) != len(self.gpu_actor_env_steps_per_s):
            raise PlanError("profile: env_threads and gpu_actor_env_steps_per_s must be of equal length")
        if not self.threads and not self.gpu_learner_samples_per_s:
            raise PlanError("profile: no learner measured, on the CPU (threads) or on the GPU")
        shape = np.shape(self.learner_samples_per_s)
        if self.threads and shape != (len(self.threads), len(self.batch_sizes)):
            raise PlanError(
                f"profile: learner_samples_per_s has shape {shape}, expected "
                f"(threads={len(self.threads)}, batch_sizes={len(self.batch_sizes)})"
            )

    @classmethod
    def load(cls, path, cfg=None) -> Profile:
        """Read a profile file (``tianji-dask profile``); with ``cfg``, refuse one measured for
        another algorithm or env. Every problem is a :class:`PlanError` naming the fix."""
        from pathlib import Path

        import xarray as xr

        path = Path(path)
        make = "make one with tianji-dask profile CONFIG --out " + str(path)
        if not path.is_file():
            raise PlanError(f"--profile {path}: no such file; {make}")
        try:
            with xr.open_dataset(path, engine="netcdf4") as ds:
                ds.load()
        except Exception as exc:  # noqa: BLE001 - h5py/xarray raise many kinds for a non-netCDF file
            raise PlanError(f"--profile {path} is not a NetCDF file ({type(exc).__name__}); {make}") from None
        missing = sorted(
            {"actor_env_steps_per_s", "learner_samples_per_s", "message_bytes", "replay_bytes_per_transition"}
            - set(ds.data_vars)
        )
        if missing:
            raise PlanError(f"--profile {path} is not a tianji-dask profile (no {', '.join(missing)}); {make}")
        if cfg is not None and (ds.attrs.get("algo"), ds.attrs.get("env_id")) != (cfg.algo.name, cfg.env.id):
            raise PlanError(
                f"--profile {path} measured {ds.attrs.get('algo')} on {ds.attrs.get('env_id')}, "
                f"the config is {cfg.algo.name} on {cfg.env.id}: profile this config"
            )
        return cls.from_dataset(ds)

    @classmethod
    def from_dataset(cls, ds) -> Profile:
        return cls(
            actors=tuple(int(k) for k in ds.actors.values),
            actor_env_steps_per_s=tuple(float(v) for v in ds.actor_env_steps_per_s.values),
            threads=tuple(int(t) for t in ds.threads.values),
            batch_sizes=tuple(int(b) for b in ds.batch_size.values),
            learner_samples_per_s=tuple(tuple(float(v) for v in row) for row in ds.learner_samples_per_s.values),
            replay_bytes_per_transition=float(ds.replay_bytes_per_transition),
            message_bytes=int(ds.message_bytes),
            gpu_learner_samples_per_s=tuple(float(v) for v in _values(ds, "gpu_learner_samples_per_s")),
            env_threads=tuple(int(t) for t in _values(ds, "env_threads")),
            gpu_actor_env_steps_per_s=tuple(float(v) for v in _values(ds, "gpu_actor_env_steps_per_s")),
        )

    def with_batch_sizes(self, batch_sizes: list[int]) -> Profile:
        """The profile with only these of its learner batch sizes, for a plan that may choose
        only among them; :class:`PlanError` naming the measured ones when one was not measured."""
        missing = [b for b in batch_sizes if b not in self.batch_sizes]
        if missing:
            raise PlanError(
                f"--batch-sizes {','.join(map(str, missing))}: not in the profile, which measured "
                f"{','.join(map(str, self.batch_sizes))}; choose among those, or measure a new "
                "profile with these batch sizes (--profile to a file that does not exist)"
            )
        keep = [self.batch_sizes.index(b) for b in batch_sizes]
        return replace(
            self,
            batch_sizes=tuple(batch_sizes),
            learner_samples_per_s=tuple(tuple(row[j] for j in keep) for row in self.learner_samples_per_s),
            gpu_learner_samples_per_s=tuple(self.gpu_learner_samples_per_s[j] for j in keep)
            if self.gpu_learner_samples_per_s
            else (),
        )

    @property
    def gpu_learner(self) -> bool:
        return bool(self.gpu_learner_samples_per_s)

    @property
    def gpu_actor(self) -> bool:
        return bool(self.gpu_actor_env_steps_per_s)

    def tr_a(self, k: int) -> float:
        """Production of k actors: interpolated between measured counts; beyond the largest,
        each further actor adds the per-actor rate measured there (actors share nothing)."""
        ks, v = np.asarray(self.actors, float), np.asarray(self.actor_env_steps_per_s, float)
        if k >= ks[-1]:
            return float(v[-1] * k / ks[-1])
        if k <= ks[0]:
            return float(v[0] * k / ks[0])
        return float(np.interp(k, ks, v))

    def tr_l(self, threads: int, batch_size: int) -> float:
        """Consumption of one learner: interpolated in threads; flat beyond the largest thread
        count measured (no speed-up is assumed that was not seen)."""
        j = self.batch_sizes.index(batch_size)
        ts = np.asarray(self.threads, float)
        v = np.asarray([row[j] for row in self.learner_samples_per_s], float)
        return float(np.interp(threads, ts, v))

    def tr_l_gpu(self, batch_size: int) -> float:
        """Consumption of one learner on the GPU (one core for its process)."""
        return self.gpu_learner_samples_per_s[self.batch_sizes.index(batch_size)]

    def tr_a_gpu(self, threads: int) -> float:
        """Production of one actor process with inference on the GPU and its envs on ``threads``
        threads: interpolated; proportional below the fewest threads measured, flat beyond the
        most (no speed-up is assumed that was not seen)."""
        ts, v = np.asarray(self.env_threads, float), np.asarray(self.gpu_actor_env_steps_per_s, float)
        if threads < ts[0]:
            return float(v[0] * threads / ts[0])
        return float(np.interp(threads, ts, v))


def _values(ds, name: str):
    """A profile variable's values; none for the GPU's in a profile measured without one."""
    return ds[name].values if name in ds.variables else ()


@dataclass(frozen=True)
class Resources:
    cores: int
    nodes: int = 1
    cores_per_node: int | None = None
    memory_per_node: float | None = None  # bytes; None = not checked
    gpus: int = 0  # in all, spread evenly over the nodes

    def __post_init__(self):
        if self.cores < 1 or self.nodes < 1:
            raise PlanError(f"resources: cores ({self.cores}) and nodes ({self.nodes}) must be at least 1")
        if self.gpus < 0 or self.gpus % self.nodes:
            raise PlanError(
                f"resources: --gpus {self.gpus} over --nodes {self.nodes}: give a multiple of the node "
                f"count (every node has the same GPUs), or 0"
            )
        if self.cores_per_node is not None and self.cores_per_node * self.nodes < self.cores:
            raise PlanError(
                f"resources: --cores {self.cores} exceeds --nodes {self.nodes} x --cores-per-node "
                f"{self.cores_per_node} = {self.nodes * self.cores_per_node}"
            )

    @property
    def group_core_limit(self) -> int:
        return min(self.cores, self.cores_per_node) if self.cores_per_node else self.cores

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes


@dataclass
class Job:
    """One batch job (or a LocalCluster's share of workers): the hosts it carries."""

    kind: str  # "learner" (buffer + learner of a group), "actors", or "group" (both, one GPU)
    group: int
    cores: int
    processes: int
    memory_bytes: int
    node: int
    gpus: int = 0

    @property
    def resources(self) -> dict[str, int]:
        """Dask worker resources that tag which hosts each worker takes. A group job's workers
        carry both roles: its first worker by name takes the learner, the others the actors."""
        roles = {"learner": ["tianji_learner"], "actors": ["tianji_actor"]}.get(
            self.kind, ["tianji_learner", "tianji_actor"]
        )
        return {**dict.fromkeys(roles, 1), f"tianji_group_{self.group}": 1}


@dataclass
class Plan:
    algo: str
    env_id: str
    groups: int
    actors: int  # per group
    learner_threads: int
    batch_size: int
    buffer_size: int | None  # DQN only
    train_freq: int | None  # DQN only
    cores_total: int
    cores_used: int
    replay_ratio: float
    predicted: dict[str, float]
    bottleneck: str
    explanation: list[str]
    jobs: list[Job] = field(default_factory=list)
    learners: int = 1  # per group; plans replicate groups rather than add data-parallel learners
    # None (a plan written before plans chose devices): the config's devices stay
    learner_device: str | None = None
    actor_device: str | None = None  # where the actors' inference runs
    env_threads: int | None = None  # threads stepping one actor's envs (envs that step on threads)
    gpus_used: int = 0
    # DQN, where the batch differs from the config's: lr and the target sync interval (in
    # updates) that go with it; None: the config's stay
    lr: float | None = None
    target_update_interval: int | None = None

    def overrides(self) -> dict[str, object]:
        """The config fields the plan sets (dotted names, as ``--set`` takes them)."""
        out: dict[str, object] = {
            "topology.groups": self.groups,
            "topology.actors": self.actors,
            "topology.learners": self.learners,
            "topology.learner_threads": self.learner_threads,
        }
        if self.learner_device is not None:
            out["learner.device"] = self.learner_device
        if self.actor_device is not None:
            out["actor.device"] = self.actor_device
        if self.env_threads is not None:
            out["env.atari_threads"] = self.env_threads
        if ALGORITHMS[self.algo].tunable_batch:
            out.update(
                {
                    "algo.batch_size": self.batch_size,
                    "algo.buffer_size": self.buffer_size,
                    "algo.train_freq": self.train_freq,
                }
            )
            if self.lr is not None:
                out["algo.lr"] = self.lr
            if self.target_update_interval is not None:
                out["algo.target_update_interval"] = self.target_update_interval
        return out

    def predictions(self) -> dict[str, float | str]:
        """What the plan predicts for the whole run, as a run records it beside what it measures
        (metrics.nc's ``plan_*`` attributes): the env steps per second its actors produce (TR_A)
        and its learners consume (TR_L / R), the training rate in env steps and in samples, the
        replay ratio R and the bottleneck."""
        return {
            **{f"plan_{name}": float(value) for name, value in self.predicted.items()},
            "plan_replay_ratio": float(self.replay_ratio),
            "plan_bottleneck": self.bottleneck,
        }

    def apply(self, cfg: ExperimentConfig):
        """``cfg`` with the plan's fields set; refuses a plan made for another algorithm or env."""
        from tianji_dask.config import ConfigError, apply_overrides, validate_config

        if (cfg.algo.name, cfg.env.id) != (self.algo, self.env_id):
            raise ConfigError(
                f"the plan was made for {self.algo} on {self.env_id}, the config is "
                f"{cfg.algo.name} on {cfg.env.id}; make a plan for this config with "
                "tianji-dask plan CONFIG --cores M"
            )
        data = apply_overrides(cfg.model_dump(mode="json"), [f"{k}={v}" for k, v in self.overrides().items()])
        return validate_config(data)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["jobs"] = [{**asdict(j), "resources": j.resources} for j in self.jobs]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        d = dict(d)
        jobs = [Job(**{k: v for k, v in j.items() if k != "resources"}) for j in d.pop("jobs", [])]
        return cls(**d, jobs=jobs)


def _int_or_none(x: float | None) -> int | None:
    return None if x is None else int(x)


def _learner_memory(cfg: ExperimentConfig, profile: Profile, buffer_size: int | None) -> int:
    replay = (buffer_size or 0) * profile.replay_bytes_per_transition
    return int(LEARNER_PROCESS_BYTES + replay)


@dataclass(frozen=True)
class GroupShape:
    """One training group's hosts and devices, and what the profile says they do."""

    learner_device: str  # "cpu" or "cuda"
    learner_threads: int  # torch threads; the learner's cores when it trains on the CPU
    actor_device: str  # where the actors' inference runs
    actors: int  # actor processes
    env_threads: int | None  # threads stepping each actor's envs; None: the env steps on none
    production: float  # TR_A, env steps/s
    consumption: float  # TR_L / R, env steps/s

    @property
    def learner_cores(self) -> int:
        return self.learner_threads if self.learner_device == "cpu" else 1

    @property
    def actor_cores(self) -> int:
        return self.actors if self.actor_device == "cpu" else self.actors * (self.env_threads or 1)

    @property
    def cores(self) -> int:
        return self.learner_cores + self.actor_cores

    @property
    def gpu(self) -> bool:
        return "cuda" in (self.learner_device, self.actor_device)

    @property
    def throughput(self) -> float:
        return min(self.production, self.consumption)


def group_shapes(
    profile: Profile, cores: int, batch: int, R: float, *, gpu: bool, threaded_env: bool, max_actors: int | None
):
    """Every group of ``cores`` cores the profile can predict: a learner on the CPU with T
    threads or on the GPU, and single-core actors on the rest (at most ``max_actors``), or (on a
    GPU, for an env that steps on threads) one actor with inference on the GPU stepping its envs
    on t threads. A learner on the GPU may also have fewer CPU actors than the rest of the
    cores: where it is the bottleneck, the fewest that keep up with it (the actors' inference
    then stays off the GPU the learner needs, as it would not with a GPU actor of as many cores)."""
    learners = [("cpu", T, profile.tr_l(T, batch) / R) for T in range(1, cores) if profile.threads]
    if gpu and profile.gpu_learner:
        learners.append(("cuda", 1, profile.tr_l_gpu(batch) / R))
    for device, T, consumption in learners:
        rest = cores - (T if device == "cpu" else 1)
        A = min(rest, max_actors or rest)
        env_threads = 1 if threaded_env else None
        counts = range(1, A + 1) if device == "cuda" else (A,)
        for k in counts:
            yield GroupShape(device, T, "cpu", k, env_threads, profile.tr_a(k), consumption)
        if gpu and threaded_env and profile.gpu_actor:
            for t in range(1, rest + 1):
                yield GroupShape(device, T, "cuda", 1, t, profile.tr_a_gpu(t), consumption)


def make_plan(cfg: ExperimentConfig, profile: Profile, resources: Resources) -> Plan:
    """The best core (and GPU) allocation for ``cfg`` on ``resources`` according to ``profile``."""
    _check_resources(profile, resources)
    R = cfg.algo.target_replay_ratio
    best, refused_memory = _best_allocation(cfg, profile, resources, R)
    if best is None and not refused_memory:
        raise PlanError(
            "the profile measured no learner on the CPU (profile --max-threads 0) and the plan has no "
            "GPU: plan with --gpus, or profile again with a CPU learner"
        )
    if best is None:
        raise PlanError(
            "no allocation fits in memory:\n  "
            + "\n  ".join(sorted(set(refused_memory))[:5])
            + "\nGive more memory per node, or a smaller algo.buffer_size."
        )
    return _build(cfg, profile, resources, R, **best)


def _check_resources(profile: Profile, resources: Resources) -> None:
    """Refuse resources no group fits in, and GPUs the profile did not measure."""
    M = resources.cores
    m_max = resources.group_core_limit
    if M < 2 or m_max < 2:
        raise PlanError(
            f"{M} core(s) (at most {m_max} per node) cannot hold a training group: it needs "
            "1 actor core + 1 learner core = 2 cores. Give --cores 2 or more."
        )
    if resources.gpus and not (profile.gpu_learner or profile.gpu_actor):
        raise PlanError(
            f"--gpus {resources.gpus}, but the profile has no GPU measurements: measure one with "
            "tianji-dask profile CONFIG --gpu on a machine with the GPU (or plan with --gpus 0)"
        )


def _best_allocation(
    cfg: ExperimentConfig, profile: Profile, resources: Resources, R: float
) -> tuple[dict | None, list[str]]:
    """Every batch size, group count and group shape the resources hold: the best that fits in
    memory (:func:`_build`'s arguments; None where none does), and why each one that did not fit
    was refused."""
    M = resources.cores
    spec = spec_for(cfg)
    config_batch = spec.samples_per_update(cfg)
    max_actors = spec.actors_per_group_limit(cfg)
    per_node = resources.cores_per_node or M
    best = None
    refused_memory: list[str] = []
    for b in (b for b in profile.batch_sizes if b >= 1):
        scaled = spec.scaled_for_batch(cfg, b)
        buffer_size = _int_or_none(scaled.get("buffer_size"))
        learner_mem = _learner_memory(cfg, profile, buffer_size)
        for G in range(1, M // 2 + 1):
            m = min(M // G, resources.group_core_limit)
            if resources.nodes * (per_node // m) < G:
                continue  # groups never straddle nodes
            gpu = resources.nodes * min(per_node // m, resources.gpus_per_node) >= G
            shapes = group_shapes(
                profile, m, b, R, gpu=gpu, threaded_env=cfg.env.stepping_threads, max_actors=max_actors
            )
            for shape in shapes:
                fit = per_node // m if not shape.gpu else min(per_node // m, resources.gpus_per_node)
                groups_per_node = min(G, fit)
                node_mem = groups_per_node * (learner_mem + shape.actors * ACTOR_PROCESS_BYTES)
                if resources.memory_per_node is not None and node_mem > resources.memory_per_node:
                    refused_memory.append(
                        f"{G} group(s) x ({shape.actors} actors x {ACTOR_PROCESS_BYTES / 2**30:.2f} GiB + learner "
                        f"{learner_mem / 2**30:.2f} GiB incl. replay {buffer_size or 0:,} x "
                        f"{profile.replay_bytes_per_transition:,.0f} B) = {node_mem / 2**30:.2f} GiB on a node "
                        f"> {resources.memory_per_node / 2**30:.2f} GiB"
                    )
                    continue
                # simpler wins a tie: fewer cores, the config's own batch, fewer groups, no GPU
                key = (G * shape.throughput, -(G * shape.cores), b == config_batch, -G, not shape.gpu)
                if best is None or _better(key, best[0]):
                    best = (
                        key,
                        dict(
                            G=G,
                            b=b,
                            shape=shape,
                            groups_per_node=groups_per_node,
                            scaled=scaled,
                            learner_mem=learner_mem,
                        ),
                    )
    return (None if best is None else best[1]), refused_memory


def _better(key, other) -> bool:
    """Throughput first (within TIE counts as equal), then the tie-breakers."""
    a, b = key[0], other[0]
    if a > b * (1 + TIE):
        return True
    if b > a * (1 + TIE):
        return False
    return key[1:] > other[1:] or (key[1:] == other[1:] and a > b)


def _hosts_text(shape: GroupShape) -> str:
    if shape.actor_device == "cpu":
        actors = f"{shape.actors} actor cores"
    else:
        actors = f"{shape.actors} actor with inference on the GPU and {shape.env_threads} env threads"
    if shape.learner_device == "cpu":
        return f"{actors} + 1 learner with {shape.learner_threads} torch thread(s)"
    return f"{actors} + 1 learner on the GPU (1 core)"


def _next_resource(profile: Profile, shape: GroupShape, b: int, R: float) -> str:
    """What one more core would give the bottleneck, as the profile predicts it."""
    T, A, prod, cons = shape.learner_threads, shape.actors, shape.production, shape.consumption
    if cons < prod:
        if shape.learner_device != "cpu":
            return "cores do not speed up the learner on the GPU: more GPUs make more groups"
        more = profile.tr_l(T + 1, b) / R
        seen = "" if max(profile.threads) >= T + 1 else f"; not measured beyond {max(profile.threads)}: assumed flat"
        text = f"another core: {T + 1} learner threads would consume {more:,.0f} env steps/s ({_pct(more, cons)}{seen})"
        if shape.actor_device != "cpu":
            return text
        return text + (
            f"; moving a core from the actors would drop production to {profile.tr_a(A - 1):,.0f}"
            if A > 1
            else "; more actors add nothing while the learner is the bottleneck"
        )
    if shape.actor_device != "cpu":
        t = shape.env_threads or 1
        more = profile.tr_a_gpu(t + 1)
        seen = (
            ""
            if max(profile.env_threads) >= t + 1
            else f"; not measured beyond {max(profile.env_threads)}: assumed flat"
        )
        return f"another core: {t + 1} env threads would produce {more:,.0f} env steps/s ({_pct(more, prod)}{seen})"
    more = profile.tr_a(A + 1)
    return f"another core: {A + 1} actors would produce {more:,.0f} env steps/s ({_pct(more, prod)})" + (
        f", but one learner thread fewer would consume only {profile.tr_l(T - 1, b) / R:,.0f}"
        if T > 1 and shape.learner_device == "cpu"
        else ""
    )


def _where_inference_runs(profile: Profile, shape: GroupShape, max_actors: int | None) -> str:
    cores = shape.actor_cores
    cpu_actors = min(cores, max_actors or cores)
    return (
        f"inference on the {'GPU' if shape.actor_device != 'cpu' else 'CPU'}: on {cores} actor cores, one actor "
        f"with inference on the GPU produces {profile.tr_a_gpu(cores):,.0f} env steps/s, {cpu_actors} "
        f"single-core actor(s) with inference on the CPU {profile.tr_a(cpu_actors):,.0f}"
    )


def _build(
    cfg: ExperimentConfig,
    profile: Profile,
    resources: Resources,
    R: float,
    *,
    G: int,
    b: int,
    shape: GroupShape,
    groups_per_node: int,
    scaled: dict[str, float],
    learner_mem: int,
) -> Plan:
    """``scaled``: the config's fields for batch ``b`` (``AlgorithmSpec.scaled_for_batch``)."""
    prod, cons = shape.production, shape.consumption
    group = shape.throughput
    config_batch = spec_for(cfg).samples_per_update(cfg)
    return Plan(
        algo=cfg.algo.name,
        env_id=cfg.env.id,
        groups=G,
        actors=shape.actors,
        learner_threads=shape.learner_threads,
        batch_size=b,
        buffer_size=_int_or_none(scaled.get("buffer_size")),
        train_freq=_int_or_none(scaled.get("train_freq")),
        lr=scaled.get("lr") if b != config_batch else None,
        target_update_interval=_int_or_none(scaled.get("target_update_interval")) if b != config_batch else None,
        cores_total=resources.cores,
        cores_used=G * shape.cores,
        replay_ratio=R,
        predicted={
            "actor_env_steps_per_s": G * prod,
            "learner_env_steps_per_s": G * cons,
            "train_env_steps_per_s": G * group,
            "train_samples_per_s": G * group * R,
        },
        bottleneck="learner" if cons < prod else "actors",
        explanation=_explanation(cfg, profile, resources, R, G, b, shape)
        + _batch_explanation(cfg, b, config_batch, scaled),
        jobs=_jobs(resources, G, shape, groups_per_node, learner_mem),
        learner_device="cuda" if shape.learner_device != "cpu" else "cpu",
        actor_device="cuda" if shape.actor_device != "cpu" else "cpu",
        env_threads=shape.env_threads,
        gpus_used=G if shape.gpu else 0,
    )


def _explanation(
    cfg: ExperimentConfig, profile: Profile, resources: Resources, R: float, G: int, b: int, shape: GroupShape
) -> list[str]:
    """Why the plan is this allocation: the replay ratio, the groups, the bottleneck, what more
    cores would give, and the cores it leaves idle."""
    spec = spec_for(cfg)
    prod, cons = shape.production, shape.consumption
    gpus = G if shape.gpu else 0
    learner_text = "GPU" if shape.learner_device != "cpu" else shape.learner_threads
    why = [
        f"replay ratio R = {R:g} samples consumed per env step (the serial algorithm's); "
        f"a learner's TR_L samples/s consume TR_L / R env steps/s",
        f"chosen: {G} group(s) x ({_hosts_text(shape)}) = {G * shape.cores} of {resources.cores} cores"
        + (f" and {gpus} of {resources.gpus} GPU(s)" if gpus else "")
        + (f"; batch {b}" if spec.tunable_batch else ""),
        f"per group: TR_A = {prod:,.0f} env steps/s produced, TR_L({learner_text}, {b}) / R = "
        f"{cons:,.0f} env steps/s consumed (ratio {prod / cons:.2f})",
        f"bottleneck: {'learner' if cons < prod else 'actors'}",
        _next_resource(profile, shape, b, R),
    ]
    limit = spec.actors_per_group_limit(cfg)
    if resources.gpus and profile.gpu_actor and cfg.env.stepping_threads:
        why.append(_where_inference_runs(profile, shape, limit))
    if limit is not None and shape.actor_device == "cpu" and shape.actors == limit:
        why.append(
            f"at most {limit} actor(s) a group: a group's A actors each finish a rollout every "
            f"A / algo.rollouts_per_update learner iterations, and rollouts more than "
            f"algo.max_policy_lag versions old are dropped"
        )
    if G > 1:
        why.append(
            f"replicated groups: {G} x {shape.throughput:,.0f} = {G * shape.throughput:,.0f} env steps/s; "
            f"groups average parameters every topology.sync_interval_s"
        )
    m = min(resources.cores // G, resources.group_core_limit)
    if m > shape.cores:
        why.append(
            f"{m - shape.cores} core(s) of each group's {m} left idle: using them would not raise "
            f"the throughput by {TIE:.0%} or more"
        )
    if resources.cores > G * m:
        why.append(f"{resources.cores - G * m} core(s) left idle: a group of {m} cores does not fit in them")
    return why


def _batch_explanation(cfg: ExperimentConfig, b: int, config_batch: int, scaled: dict[str, float]) -> list[str]:
    """What a batch size other than the config's changes with it (none for the config's own)."""
    if b == config_batch:
        return []
    changed = " and ".join(
        f"{k} {getattr(cfg.algo, k):,} -> {v:,}"
        for k, v in scaled.items()
        if k in ("train_freq", "buffer_size", "target_update_interval")
    )
    why = [
        f"batch {config_batch} -> {b}: {changed} keep R, P = B/N_s and the target network's "
        "age in samples of serial training"
    ]
    algo, lr = cfg.algo.model_dump(), scaled.get("lr")
    if lr is not None and lr != algo["lr"]:
        why.append(f"lr {algo['lr']:g} -> {lr:g} for batch {b} (algo.lr_batch_scaling: {algo['lr_batch_scaling']})")
    return why


def _jobs(resources: Resources, G: int, shape: GroupShape, groups_per_node: int, learner_mem: int) -> list[Job]:
    """The batch jobs of ``G`` groups of ``shape``, ``groups_per_node`` to a node."""
    actors_mem = shape.actors * ACTOR_PROCESS_BYTES
    jobs: list[Job] = []
    for g in range(G):
        node = g // groups_per_node
        # one job holds the group where its actor shares the learner's GPU, and on several nodes,
        # where a group's jobs could otherwise land on two nodes: a batch system places jobs, not groups
        if shape.actor_device != "cpu" or resources.nodes > 1:
            group_gpus = int(shape.actor_device != "cpu" or shape.learner_device != "cpu")
            jobs.append(Job("group", g, shape.cores, 1 + shape.actors, learner_mem + actors_mem, node, group_gpus))
            continue
        learner_gpus = int(shape.learner_device != "cpu")
        jobs.append(Job("learner", g, shape.learner_cores, 1, learner_mem, node, gpus=learner_gpus))
        jobs.append(Job("actors", g, shape.actors, shape.actors, actors_mem, node))
    return jobs


def _pct(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.0f} %" if old > 0 else "n/a"


def default_plan_path(config, cores: int, gpus: int = 0) -> Path:
    """Where ``tianji-dask plan`` writes without ``--out``: ``<runs-dir>/plans/<config>-<cores>cores.yaml``,
    ``<config>-<cores>cores-<gpus>gpus.yaml`` with GPUs (``tianji.runs-dir``,
    :mod:`tianji_dask.config.deployment`; ``runs`` by default)."""
    gpu = f"-{gpus}gpus" if gpus else ""
    return deployment_settings().runs_dir / "plans" / f"{Path(config).stem}-{cores}cores{gpu}.yaml"


def profile_beside(plan_path) -> Path:
    """The profile ``tianji-dask plan`` reads, or measures and keeps, without ``--profile``."""
    return Path(plan_path).with_suffix(".profile.nc")


def save_plan(plan: Plan, path) -> None:
    """Write the plan as YAML (replacing a file only with a complete one)."""
    from pathlib import Path

    import yaml

    from tianji_dask.results.atomic import atomic_write

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as tmp:
        tmp.write_text(
            "# tianji-dask plan: tianji-dask train CONFIG --plan "
            + path.name
            + "\n"
            + yaml.safe_dump(plan.to_dict(), sort_keys=False),
            encoding="utf-8",
        )


def load_plan(path) -> Plan:
    from pathlib import Path

    import yaml

    path = Path(path)
    if not path.is_file():
        raise PlanError(f"--plan {path}: no such file; make one with tianji-dask plan CONFIG --cores M --out {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return Plan.from_dict(data)
    except (yaml.YAMLError, TypeError, AttributeError) as exc:
        raise PlanError(
            f"--plan {path} is not a tianji-dask plan ({exc}); make one with tianji-dask plan CONFIG --cores M"
        ) from None


def plan_table(plan: Plan):
    """A rich Table of the plan's jobs and predictions (``rich.print`` it)."""
    from rich.table import Table

    gpus = f" and {plan.gpus_used} GPU(s)" if plan.gpus_used else ""
    t = Table(title=f"plan: {plan.algo} on {plan.env_id}, {plan.cores_used} of {plan.cores_total} cores{gpus}")
    for col in ("group", "job", "processes", "cores", "gpus", "memory", "hosts"):
        t.add_column(col, justify="left" if col in ("job", "hosts") else "right")
    learner = (
        f"buffer + learner ({plan.learner_threads} torch threads)"
        if (plan.learner_device or "cpu") == "cpu"
        else "buffer + learner on the GPU"
    )
    actors = (
        "actor(s)"
        if (plan.actor_device or "cpu") == "cpu"
        else f"actor(s), inference on the GPU, {plan.env_threads} env threads"
    )
    for j in plan.jobs:
        hosts = {"learner": learner, "actors": f"{j.processes} {actors}"}.get(
            j.kind, f"{learner}; {j.processes - 1} {actors}"
        )
        t.add_row(
            str(j.group),
            j.kind,
            str(j.processes),
            str(j.cores),
            str(j.gpus),
            f"{j.memory_bytes / 2**30:.2f} GiB",
            hosts,
        )
    return t
