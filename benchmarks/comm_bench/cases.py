"""What the benchmark runs: its settings (``CommBenchConfig``) and the cases they make, in the
order they run."""

from __future__ import annotations

import dataclasses

from .workload import SAMPLE_MODES

KIB, MIB = 1 << 10, 1 << 20
MB = 1e6
#: the default config's ``channel.capacity_mb`` (tianji_dask/defaults/cartpole_dqn.yaml)
DEFAULT_CAPACITY_MB = 16.0

SWEEPS = ("size", "actors", "transports", "tiny")


@dataclasses.dataclass
class CommBenchConfig:
    """What to run. ``CommBenchConfig.small()`` is ``--small``; the defaults are the full run."""

    messages: int = 10_000
    sizes: tuple[int, ...] = (64 * KIB, 256 * KIB, 512 * KIB, 1 * MIB, 2 * MIB, 4 * MIB)
    actor_counts: tuple[int, ...] = (1, 2, 4)
    actor_sweep_size: int = 512 * KIB
    sample_times: tuple[float, ...] = (0.0, 0.001, 0.01)
    sample_mode: str = "sleep"
    alt_messages: int = 2_000
    alternatives: tuple[str, ...] = ("dask_queue", "dask_actor")
    tiny_messages: int = 20_000
    tiny_size: int = 100
    capacity_mb: float = DEFAULT_CAPACITY_MB
    unset_malloc_trim: bool = False
    #: extra environment for the worker processes, set before they start (None: unset the variable)
    worker_env: dict = dataclasses.field(default_factory=dict)
    case_timeout_s: float = 600.0
    sweeps: tuple[str, ...] = SWEEPS

    @classmethod
    def small(cls, **kw) -> CommBenchConfig:
        return cls(**{"messages": 500, "alt_messages": 200, "tiny_messages": 2_000, **kw})

    def validate(self) -> None:
        if self.sample_mode not in SAMPLE_MODES:
            raise ValueError(f"sample_mode must be one of {SAMPLE_MODES}, got {self.sample_mode!r}")
        for name in ("messages", "alt_messages", "tiny_messages"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        bad = set(self.alternatives) - {"dask_queue", "dask_actor"}
        if bad:
            raise ValueError(f"unknown alternative transports {sorted(bad)}; choose from dask_queue, dask_actor")
        bad = set(self.sweeps) - set(SWEEPS)
        if bad:
            raise ValueError(f"unknown sweeps {sorted(bad)}; choose from {', '.join(SWEEPS)}")
        if any(a < 1 for a in self.actor_counts):
            raise ValueError(f"actor counts must be >= 1, got {self.actor_counts}")

    @property
    def max_actors(self) -> int:
        return max([1, *self.actor_counts])


def actor_counts(max_actors: int) -> tuple[int, ...]:
    """The actor sweep: 1, 2, 4, ... below ``max_actors``, then ``max_actors``."""
    counts, a = [], 1
    while a < max_actors:
        counts.append(a)
        a *= 2
    return (*counts, max_actors)


@dataclasses.dataclass
class Case:
    sweep: str
    transport: str
    message_bytes: int
    actors: int
    sample_time: float
    messages: int


def plan_cases(cfg: CommBenchConfig) -> list[Case]:
    """The cases in the order they run: each channel case right after its raw TCP anchor."""
    cases: list[Case] = []

    def pair(sweep, size, actors, st, n):
        cases.append(Case(sweep, "raw_tcp", size, actors, st, n))
        cases.append(Case(sweep, "channel", size, actors, st, n))

    if "size" in cfg.sweeps:
        for size in cfg.sizes:
            pair("size", size, 1, 0.0, cfg.messages)
    if "actors" in cfg.sweeps:
        for st in cfg.sample_times:
            for a in cfg.actor_counts:
                pair("actors", cfg.actor_sweep_size, a, st, cfg.messages)
    if "transports" in cfg.sweeps:
        for t in cfg.alternatives:
            cases.append(Case("transports", t, cfg.actor_sweep_size, 1, 0.0, cfg.alt_messages))
    if "tiny" in cfg.sweeps:
        pair("tiny", cfg.tiny_size, 1, 0.0, cfg.tiny_messages)
    return cases
