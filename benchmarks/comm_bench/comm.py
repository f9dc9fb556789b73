"""The paper's virtual communication experiment (TianJi, Fig. 5 and equation 1) on this project's
data plane, with plain TCP sockets as the physical anchor.

Simulated actors, one Dask worker process each, produce messages of a given size, sampling
(sleeping, by default) a given time before each, and push them through a ``QueueSender`` into
one ``QueueInbox`` on a receiver worker until that inbox has delivered N messages to its
consumer. Every case is also run over raw TCP between plain Python processes with the same
sizes, senders and sample time, right before it, and reported as a fraction of it.

    python benchmarks/comm.py [--small] [--out DIR] [--max-actors 16]

Sweeps (docs/benchmarks.md defines every output):
  size       64 KiB .. 4 MiB, 1 actor, sample time 0
  actors     1, 2, 4 (.. --max-actors) actors at 512 KiB, sample time 0, 0.001 s and 0.01 s
  transports distributed.Queue put/get and Dask actor calls, 512 KiB, 1 actor, fewer messages
  tiny       100-byte messages, 1 actor: messages per second end to end

Equation 1 of the paper, with the ``/ N_A`` that its text implies ("increasing the number of
actors is equivalent to linearly accelerating the sample collection") and that the printed
formula lacks::

    T_c = N * max((T_sp + T_sd) / N_A, T_rv)     actor-bound when the first term is larger

is evaluated from the per-message times measured at the two ends and stored beside the
measured collection time.

Writes ``comm.nc`` (one ``case`` dimension), ``comm.json`` and ``comm.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from tianji_dask.workers import scheduler_workers

from .workload import SAMPLE_MODES, RssSampler, loadavg_1m

KIB, MIB = 1 << 10, 1 << 20
MB = 1e6
DEFAULT_OUT = Path("benchmarks/results/comm")
#: the default config's ``channel.capacity_mb`` (tianji_dask/defaults/cartpole_dqn.yaml)
DEFAULT_CAPACITY_MB = 16.0
IDLE_PROBE_S = 2.0  # how long the idle workers' background CPU is measured at start-up
BAR_TIME_RATIO = 1.5  # the bar: 4 actors at 512 KiB within 1.5x raw TCP's collection time
BAR_RSS_MB = 300.0  # ... with the receiver's RSS under 300 MB throughout
BAR_TINY_RATE = 10_000.0  # ... and at least 10,000 100-byte messages per second into one inbox

SWEEPS = ("size", "actors", "transports", "tiny")
TRANSPORTS = {
    "raw_tcp": "plain sockets between Python processes (sendall / recv_into a fresh buffer)",
    "channel": "tianji_dask.channels QueueSender -> QueueInbox (credit flow control)",
    "dask_queue": "distributed.Queue put / get (items pass through the scheduler)",
    "dask_actor": "Dask actor calls to an async def method, 16 calls in flight",
}

#: every data variable of comm.nc: name -> (long_name, units). docs/benchmarks.md lists the same.
VARIABLES: dict[str, tuple[str, str]] = {
    "collection_time": ("time from the first send of any actor to the receiver holding the N-th message", "s"),
    "throughput": ("payload bytes received per second over the collection time (MB = 1e6 bytes)", "MB s-1"),
    "message_rate": ("messages received per second over the collection time", "s-1"),
    "messages_sent": ("messages the actors sent, all of them (the loops run until stopped, so at least N)", "1"),
    "receiver_rss_start": ("resident memory of the receiving process when the case started", "MB"),
    "receiver_rss_peak": ("peak resident memory of the receiving process during the case, sampled every 10 ms", "MB"),
    "t_sp": ("sample time T_sp: measured wall time of one sampling step, mean over messages sent", "s"),
    "t_sp_cpu": ("CPU time of one sampling step, mean over messages sent (0 for sleep)", "s"),
    "t_sd": ("send time T_sd: CPU seconds of an actor's process per message sent, outside sampling", "s"),
    "t_rv": ("receive time T_rv: CPU seconds of the receiving process per message received", "s"),
    "send_call_time": (
        "wall time of one send call in the actor's loop (channel: push() without credit "
        "waits; raw TCP: sendall), mean per message",
        "s",
    ),
    "credit_wait_time": ("time an actor's push() waited for credit, mean per message (channel only)", "s"),
    "items_per_wire_message": ("items per message written on the wire: the channel's batching (channel only)", "1"),
    "inbox_max_queued": ("most bytes the inbox held queued for its consumer (channel only)", "MB"),
    "t_c_eq1": ("collection time predicted by equation 1: N x max((T_sp + T_sd) / N_A, T_rv)", "s"),
    "eq1_over_measured": ("equation 1 prediction / measured collection time", "1"),
    "critical_path": ("equation 1's critical path: 'actor' if (T_sp + T_sd) / N_A > T_rv, else 'buffer'", "1"),
    "t_c_eq1_overlap": (
        "equation 1 with the send overlapping the next sample: N x max(max(T_sp + send call, T_sd) / N_A, T_rv)",
        "s",
    ),
    "t_c_cpu_bound": ("lower bound from CPU: N x (T_sd + T_rv + T_sp_cpu) / cores", "s"),
    "fraction_of_raw_tcp": ("throughput / raw TCP throughput of the same size, actors and sample time", "1"),
    "time_ratio_to_raw_tcp": (
        "collection time per message / raw TCP's for the same size, actors and sample time (the bar is <= 1.5)",
        "1",
    ),
    "load_avg_1m_before": ("1-minute load average of the machine just before the case", "1"),
    "load_avg_1m_after": ("1-minute load average of the machine just after the case", "1"),
}
COORDS: dict[str, tuple[str, str]] = {
    "case": ("case number, in the order run", "1"),
    "sweep": ("sweep the case belongs to: size, actors, transports or tiny", "1"),
    "transport": ("transport: raw_tcp, channel, dask_queue or dask_actor", "1"),
    "message_bytes": ("message payload size", "B"),
    "actors": ("number of actors N_A (sender processes)", "1"),
    "sample_time": ("configured sample time per message", "s"),
    "messages": ("messages to collect, N", "1"),
}


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


# ------------------------------------------------------------------------------ running cases
class _Bench:
    """A LocalCluster of 1 + max_actors single-threaded workers on 127.0.0.1: worker 0 receives,
    workers 1.. are the actors. No preload (torch is not imported), no dashboard."""

    def __init__(self, cfg: CommBenchConfig):
        self.cfg = cfg

    def __enter__(self):
        import dask
        from distributed import Client

        from tianji_dask.channels import ChannelPlugin
        from tianji_dask.cluster import local_cluster

        env = dict(self.cfg.worker_env)
        if self.cfg.unset_malloc_trim:
            env["MALLOC_TRIM_THRESHOLD_"] = None
        # The nannies read a variable from this process's environment before their config and
        # write their pre-spawn values into it (an earlier LocalCluster in this process may have
        # left MALLOC_TRIM_THRESHOLD_ here): clear what is to be unset, restore all on exit.
        self._environ = dict(os.environ)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
        self._cfgctx = dask.config.set({f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in env.items()})
        self._cfgctx.__enter__()
        n_workers = 1 + self.cfg.max_actors
        self.cluster = local_cluster(n_workers, dashboard=False, preload_roles=False)
        self.client = Client(self.cluster)
        self.client.wait_for_workers(n_workers, timeout=120)
        self.client.register_plugin(ChannelPlugin())
        self.workers = sorted(scheduler_workers(self.client))
        self.pids = self.client.run(os.getpid)
        # Dask's own background work (heartbeats, monitors, ticks) counts in T_sd and T_rv: measure it.
        cpu0 = self.client.run(time.process_time)
        time.sleep(IDLE_PROBE_S)
        cpu1 = self.client.run(time.process_time)
        self.idle_cpu_fraction = float(np.median([(cpu1[w] - cpu0[w]) / IDLE_PROBE_S for w in cpu0]))
        names = sorted({"MALLOC_TRIM_THRESHOLD_", *env})
        envs = self.client.run(lambda: {k: os.environ.get(k, "unset") for k in names})
        self.worker_env = {k: ",".join(sorted({e[k] for e in envs.values()})) for k in names}
        return self

    def __exit__(self, *exc):
        try:
            self.client.close()
            self.cluster.close()
        finally:
            self._cfgctx.__exit__(None, None, None)
            os.environ.clear()
            os.environ.update(self._environ)

    def _actor(self, cls, worker, *args):
        return self.client.submit(cls, *args, actor=True, workers=[worker], pure=False)

    def run_channel(self, case: Case, name: str) -> dict:
        from .hosts import ChannelCollector, ChannelProducer

        cfg, A = self.cfg, case.actors
        cap = int(cfg.capacity_mb * MB)
        recv_w, send_ws = self.workers[0], self.workers[1 : 1 + A]
        futs = [self._actor(ChannelCollector, recv_w, name, cap * A)]
        futs += [self._actor(ChannelProducer, w) for w in send_ws]
        try:
            coll, *prods = [f.result(timeout=60) for f in futs]
            address = coll.address().result(timeout=30)
            with RssSampler(self.pids[recv_w]) as rss:
                collected = coll.collect(case.messages, A, cfg.case_timeout_s)
                readies = [
                    p.prepare(address, name, f"actor-{i}", case.message_bytes, cfg.sample_mode, case.sample_time, cap)
                    for i, p in enumerate(prods)
                ]
                for r in readies:
                    r.result(timeout=90)
                start_at = time.monotonic() + 0.05 + 0.01 * A
                for g in [p.go(start_at) for p in prods]:
                    g.result(timeout=30)
                got = collected.result(timeout=cfg.case_timeout_s + 30)
                sent = [f.result(timeout=60) for f in [p.finish() for p in prods]]
                fin = coll.finish().result(timeout=60)
        finally:
            self.client.cancel(futs)
        n_sent = sum(s["sent"] for s in sent)
        return {
            "collection_time": got["t_n"] - min(s["t_first"] for s in sent),
            "messages_sent": n_sent,
            "t_sp": sum(s["sample_wall_s"] for s in sent) / n_sent,
            "t_sp_cpu": sum(s["sample_cpu_s"] for s in sent) / n_sent,
            "t_sd": sum(s["cpu_s"] - s["sample_cpu_s"] for s in sent) / n_sent,
            "t_rv": got["cpu_s"] / case.messages,
            "send_call_time": sum(s["push_wall_s"] - s["blocked_s"] for s in sent) / n_sent,
            "credit_wait_time": sum(s["blocked_s"] for s in sent) / n_sent,
            "items_per_wire_message": n_sent / max(1, sum(s["wire_messages"] for s in sent)),
            "inbox_max_queued": fin["max_queued_bytes"] / MB,
            "receiver_rss_start": rss.start_bytes / MB,
            "receiver_rss_peak": rss.peak_bytes / MB,
        }

    def run_actor_calls(self, case: Case, name: str) -> dict:
        from .hosts import CallReceiver, CallSender

        futs = [self._actor(CallReceiver, self.workers[0]), self._actor(CallSender, self.workers[1])]
        try:
            recv, snd = [f.result(timeout=60) for f in futs]
            recv.start(case.messages).result(timeout=30)
            with RssSampler(self.pids[self.workers[0]]) as rss:
                s = snd.send(recv, case.messages, case.message_bytes).result(timeout=self.cfg.case_timeout_s)
                got = recv.wait(60).result(timeout=90)
        finally:
            self.client.cancel(futs)
        return self._simple(case, s, got, rss)

    def run_queue(self, case: Case, name: str) -> dict:
        from distributed import Queue

        from .hosts import QueueCollector, QueueProducer

        q = Queue(name, client=self.client, maxsize=16)  # created here first, so this maxsize holds
        futs = [self._actor(QueueCollector, self.workers[0]), self._actor(QueueProducer, self.workers[1])]
        try:
            coll, prod = [f.result(timeout=60) for f in futs]
            with RssSampler(self.pids[self.workers[0]]) as rss:
                collected = coll.collect(name, case.messages)
                s = prod.send(name, case.messages, case.message_bytes).result(timeout=self.cfg.case_timeout_s)
                got = collected.result(timeout=120)
        finally:
            self.client.cancel(futs)
            q.close()
        return self._simple(case, s, got, rss)

    @staticmethod
    def _simple(case: Case, s: dict, got: dict, rss: RssSampler) -> dict:
        return {
            "collection_time": got["t_n"] - s["t_first"],
            "messages_sent": s["sent"],
            "t_sp": 0.0,
            "t_sp_cpu": 0.0,
            "t_sd": s["cpu_s"] / s["sent"],
            "t_rv": got["cpu_s"] / case.messages,
            "receiver_rss_start": rss.start_bytes / MB,
            "receiver_rss_peak": rss.peak_bytes / MB,
        }


def run_raw(case: Case, cfg: CommBenchConfig) -> dict:
    from .rawtcp import run_raw_tcp

    r = run_raw_tcp(
        case.messages, case.message_bytes, case.actors, case.sample_time, cfg.sample_mode, timeout=cfg.case_timeout_s
    )
    return {
        "collection_time": r["collection_time_s"],
        "messages_sent": r["sent"],
        "t_sp": r["t_sp_s"],
        "t_sp_cpu": r["t_sp_cpu_s"],
        "t_sd": r["t_sd_s"],
        "t_rv": r["t_rv_s"],
        "send_call_time": r["send_call_s"],
        "receiver_rss_start": r["receiver_start_rss_bytes"] / MB,
        "receiver_rss_peak": r["receiver_peak_rss_bytes"] / MB,
        "receiver_malloc_env": json.dumps(r["receiver_malloc_env"], sort_keys=True),
    }


def derive(row: dict, case: Case, cores: int) -> dict:
    """Throughput, rates and equation 1 from one case's raw measurements (in place)."""
    n, t = case.messages, row["collection_time"]
    row["throughput"] = n * case.message_bytes / t / MB
    row["message_rate"] = n / t
    per_actor = (row["t_sp"] + row["t_sd"]) / case.actors
    row["t_c_eq1"] = n * max(per_actor, row["t_rv"])
    row["eq1_over_measured"] = row["t_c_eq1"] / t
    row["critical_path"] = "actor" if per_actor > row["t_rv"] else "buffer"
    call = row.get("send_call_time")
    if call is not None and not math.isnan(call):
        row["t_c_eq1_overlap"] = n * max(max(row["t_sp"] + call, row["t_sd"]) / case.actors, row["t_rv"])
    row["t_c_cpu_bound"] = n * (row["t_sd"] + row["t_rv"] + row["t_sp_cpu"]) / cores
    return row


def add_raw_ratios(rows: list[dict], cases: list[Case]) -> None:
    """Each case against the raw TCP case of the same size, actors and sample time (any N): the
    anchor of its own sweep (run right before it), else the first such raw case of the run."""
    own: dict = {}
    first: dict = {}
    for c, r in zip(cases, rows):
        if c.transport == "raw_tcp" and "throughput" in r:
            key = (c.message_bytes, c.actors, c.sample_time)
            own.setdefault((c.sweep, *key), r["throughput"])
            first.setdefault(key, r["throughput"])
    for c, r in zip(cases, rows):
        key = (c.message_bytes, c.actors, c.sample_time)
        ref = own.get((c.sweep, *key), first.get(key))
        if ref and "throughput" in r:
            r["fraction_of_raw_tcp"] = r["throughput"] / ref
            r["time_ratio_to_raw_tcp"] = ref / r["throughput"]


# ------------------------------------------------------------------------------ results
def machine_description() -> dict:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "unknown"
    try:
        import psutil

        mem = f"{psutil.virtual_memory().total / 2**30:.1f} GiB"
    except Exception:  # noqa: BLE001 - description only
        pass
    return {"cpu_cores": os.cpu_count() or 1, "cpu_model": model, "memory": mem, "platform": platform.platform()}


def build_dataset(cases: list[Case], rows: list[dict], attrs: dict):
    """The cases as an xarray Dataset over one ``case`` dimension (see docs/benchmarks.md)."""
    import xarray as xr

    data = {}
    for name, (long_name, units) in VARIABLES.items():
        if name == "critical_path":
            values = np.array([r.get(name, "") for r in rows], dtype=object).astype(str)
        else:
            values = np.array([r.get(name, math.nan) for r in rows], dtype=float)
        data[name] = ("case", values, {"long_name": long_name, "units": units})
    coords = {
        "case": np.arange(len(cases)),
        "sweep": ("case", np.array([c.sweep for c in cases], dtype=str)),
        "transport": ("case", np.array([c.transport for c in cases], dtype=str)),
        "message_bytes": ("case", np.array([c.message_bytes for c in cases], dtype=np.int64)),
        "actors": ("case", np.array([c.actors for c in cases], dtype=np.int64)),
        "sample_time": ("case", np.array([c.sample_time for c in cases], dtype=float)),
        "messages": ("case", np.array([c.messages for c in cases], dtype=np.int64)),
    }
    ds = xr.Dataset(data, coords=coords)
    for name, (long_name, units) in COORDS.items():
        ds[name].attrs.update(long_name=long_name, units=units)
    ds.attrs.update({k: (v if isinstance(v, str) else json.dumps(v)) for k, v in attrs.items()})
    return ds


def grid(ds, sweep: str, dims: tuple[str, ...]):
    """One sweep of ``comm.nc`` as a gridded Dataset, e.g.
    ``grid(ds, "actors", ("transport", "sample_time", "actors"))["collection_time"]``."""
    sel = ds.isel(case=np.flatnonzero(ds["sweep"].values == sweep))
    drop = [c for c in COORDS if c not in dims and c != "case"]
    return sel.drop_vars(drop).set_index(case=list(dims)).unstack("case")


def _size_label(nbytes: int) -> str:
    return f"{nbytes // MIB}MiB" if nbytes % MIB == 0 else f"{nbytes // KIB}KiB" if nbytes % KIB == 0 else f"{nbytes}B"


def summary(cases: list[Case], rows: list[dict], cfg: CommBenchConfig) -> dict:
    """Headline numbers and the issue's bars."""

    def find(**kw):
        return [
            (c, r)
            for c, r in zip(cases, rows)
            if all(getattr(c, k) == v for k, v in kw.items()) and "collection_time" in r
        ]

    out: dict = {"bars": {}, "size_sweep": [], "actor_sweep": [], "transports": {}}
    four = max((a for a in cfg.actor_counts if a <= 4), default=None)
    for st in cfg.sample_times:
        ch = find(sweep="actors", transport="channel", actors=four, sample_time=st)
        raw = find(sweep="actors", transport="raw_tcp", actors=four, sample_time=st)
        if ch and raw:
            ratio = ch[0][1]["collection_time"] / raw[0][1]["collection_time"]
            out["bars"][f"{four}_actors_{_size_label(cfg.actor_sweep_size)}_sample_{st:g}s"] = {
                "channel_collection_time_s": ch[0][1]["collection_time"],
                "raw_tcp_collection_time_s": raw[0][1]["collection_time"],
                "time_ratio": ratio,
                "bar": BAR_TIME_RATIO,
                "pass": bool(ratio <= BAR_TIME_RATIO),
                "load_avg_1m": ch[0][1].get("load_avg_1m_before"),
            }
    ch_rss = [
        r["receiver_rss_peak"] for c, r in zip(cases, rows) if c.transport == "channel" and "receiver_rss_peak" in r
    ]
    if ch_rss:
        out["bars"]["receiver_rss_peak_MB_max_over_channel_cases"] = {
            "value": max(ch_rss),
            "bar": BAR_RSS_MB,
            "pass": bool(max(ch_rss) < BAR_RSS_MB),
        }
    tiny = find(sweep="tiny", transport="channel")
    if tiny:
        rate = tiny[0][1]["message_rate"]
        out["bars"]["tiny_100B_messages_per_s"] = {
            "value": rate,
            "bar": BAR_TINY_RATE,
            "pass": bool(rate >= BAR_TINY_RATE),
        }
        raw = find(sweep="tiny", transport="raw_tcp")
        if raw:
            out["bars"]["tiny_100B_messages_per_s"]["raw_tcp"] = raw[0][1]["message_rate"]
    for size in cfg.sizes:
        ch, raw = (
            find(sweep="size", transport="channel", message_bytes=size),
            find(sweep="size", transport="raw_tcp", message_bytes=size),
        )
        if ch:
            out["size_sweep"].append(
                {
                    "message_bytes": size,
                    "channel_MBps": ch[0][1]["throughput"],
                    "raw_tcp_MBps": raw[0][1]["throughput"] if raw else None,
                    "fraction_of_raw_tcp": ch[0][1].get("fraction_of_raw_tcp"),
                    "receiver_rss_peak_MB": ch[0][1]["receiver_rss_peak"],
                }
            )
    for c, r in zip(cases, rows):
        if c.sweep == "actors" and "collection_time" in r:
            out["actor_sweep"].append(
                {
                    "transport": c.transport,
                    "actors": c.actors,
                    "sample_time_s": c.sample_time,
                    "collection_time_s": r["collection_time"],
                    "t_c_eq1_s": r["t_c_eq1"],
                    "critical_path": r["critical_path"],
                    "time_ratio_to_raw_tcp": r.get("time_ratio_to_raw_tcp"),
                }
            )
    for c, r in zip(cases, rows):
        if (
            c.message_bytes == cfg.actor_sweep_size
            and c.actors == 1
            and c.sample_time == 0
            and "throughput" in r
            and c.sweep in ("size", "transports")
        ):
            out["transports"][c.transport] = {
                "MBps": r["throughput"],
                "messages": c.messages,
                "fraction_of_raw_tcp": r.get("fraction_of_raw_tcp"),
            }
    return out


def plot(ds, path: Path, title: str) -> None:
    """Fig. 5 of the paper, this machine's version: (a) throughput vs message size, (b) collection
    time vs actors, (c) receiver peak memory, (d) equation 1 prediction vs measurement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    (ax_a, ax_b), (ax_c, ax_d) = axes
    sweep, transport = ds["sweep"].values, ds["transport"].values
    kib = ds["message_bytes"].values / KIB
    st_all, actors = ds["sample_time"].values, ds["actors"].values
    style = {
        "channel": dict(color="tab:blue", marker="o", ls="-"),
        "raw_tcp": dict(color="black", marker="s", ls="--"),
        "dask_actor": dict(color="tab:orange", marker="^", ls=""),
        "dask_queue": dict(color="tab:red", marker="v", ls=""),
    }

    def int_ticks(ax, values):
        values = sorted({int(v) for v in values})
        ax.set_xticks(values, [str(v) for v in values])
        ax.xaxis.set_minor_formatter(NullFormatter())

    for t in ("channel", "raw_tcp"):
        m = (sweep == "size") & (transport == t)
        if m.any():
            ax_a.plot(kib[m], ds["throughput"].values[m], label=t.replace("_", " "), **style[t])
    for t in ("dask_actor", "dask_queue"):
        m = (sweep == "transports") & (transport == t)
        if m.any():
            ax_a.plot(
                kib[m],
                ds["throughput"].values[m],
                label=f"{t} ({int(ds['messages'].values[m][0])} msgs)",
                ms=9,
                **style[t],
            )
    if ((sweep == "size") | (sweep == "transports")).any():
        ax_a.set_xscale("log", base=2)
        int_ticks(ax_a, kib[(sweep == "size") | (sweep == "transports")])
        ax_a.legend(fontsize=8)
    else:
        ax_a.text(0.5, 0.5, "size sweep not run", ha="center", va="center", transform=ax_a.transAxes)
    ax_a.set(
        xlabel="message size (KiB)",
        ylabel="throughput (MB/s, MB = 1e6 B)",
        ylim=(0, None),
        title="(a) throughput vs message size, 1 actor, sample time 0",
    )

    colors = ["tab:green", "tab:purple", "tab:brown", "tab:cyan", "tab:olive", "tab:pink"]
    st_colors = dict(zip(sorted(set(st_all[sweep == "actors"])), colors))
    for st, color in st_colors.items():
        for t, ls in (("channel", "-"), ("raw_tcp", "--")):
            m = (sweep == "actors") & (transport == t) & (st_all == st)
            if not m.any():
                continue
            ax_b.plot(
                actors[m], ds["collection_time"].values[m], color=color, ls=ls, marker="o" if t == "channel" else "s"
            )
            if t == "channel":
                ax_d.plot(actors[m], ds["collection_time"].values[m], color=color, ls="", marker="o", ms=7)
                ax_d.plot(actors[m], ds["t_c_eq1"].values[m], color=color, ls="-")
                ax_d.plot(actors[m], ds["t_c_eq1_overlap"].values[m], color=color, ls="--")
                ax_d.plot(actors[m], ds["t_c_cpu_bound"].values[m], color=color, ls=":")
    st_handles = [Line2D([], [], color=c, lw=3, label=f"sample time {st:g} s") for st, c in st_colors.items()]
    ax_b.legend(
        handles=st_handles
        + [
            Line2D([], [], color="grey", marker="o", ls="-", label="channel"),
            Line2D([], [], color="grey", marker="s", ls="--", label="raw TCP"),
        ],
        fontsize=8,
    )
    ax_d.legend(
        handles=st_handles
        + [
            Line2D([], [], color="grey", marker="o", ls="", label="measured (channel)"),
            Line2D([], [], color="grey", ls="-", label="equation 1: N max((T_sp+T_sd)/N_A, T_rv)"),
            Line2D([], [], color="grey", ls="--", label="eq. 1, send overlapping the next sample"),
            Line2D([], [], color="grey", ls=":", label="CPU bound: N (T_sd+T_rv+T_sp_cpu) / cores"),
        ],
        fontsize=7,
        framealpha=0.9,
    )
    for ax in (ax_b, ax_d):
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set(xlabel="actors N_A", ylabel="collection time (s)")
        if (sweep == "actors").any():
            ax.set_xscale("log", base=2)
            int_ticks(ax, actors[sweep == "actors"])
    size_kib = int(ds["message_bytes"].values[sweep == "actors"][0] / KIB) if (sweep == "actors").any() else 0
    n = int(ds["messages"].values[sweep == "actors"][0]) if (sweep == "actors").any() else 0
    ax_b.set_title(f"(b) collection time vs actors, {n} x {size_kib} KiB")
    ax_d.set_title("(d) channel: equation 1 prediction vs measurement")

    m = transport != "raw_tcp"
    labels = [
        f"{s} {t} {int(b / KIB) if b >= KIB else int(b)}{'K' if b >= KIB else 'B'} A{a} ST{st:g}"
        for s, t, b, a, st in zip(sweep[m], transport[m], ds["message_bytes"].values[m], actors[m], st_all[m])
    ]
    y = np.arange(m.sum())
    ax_c.barh(y, ds["receiver_rss_peak"].values[m], color="tab:blue", alpha=0.7, label="peak")
    ax_c.barh(y, ds["receiver_rss_start"].values[m], color="grey", alpha=0.7, label="at case start")
    ax_c.axvline(BAR_RSS_MB, color="red", lw=1, ls="--", label=f"{BAR_RSS_MB:g} MB bar")
    ax_c.set_yticks(y, labels, fontsize=6)
    ax_c.invert_yaxis()
    ax_c.set(xlabel="receiver RSS (MB)", title="(c) receiving process memory (the paper's (c) is multi-node)")
    ax_c.legend(fontsize=7, loc="lower right")
    for ax in axes.flat:
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------ driver
def run(cfg: CommBenchConfig, out: Path | None = None, log=print):
    """Run every case of ``cfg``; write comm.nc/json/png to ``out`` (if given); return the Dataset."""
    from tianji_dask.results import provenance_attrs

    cfg.validate()
    cases = plan_cases(cfg)
    cores = os.cpu_count() or 1
    load_start = os.getloadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    rows: list[dict] = [{} for _ in cases]
    errors = []
    with _Bench(cfg) as bench:
        for i, c in enumerate(cases):
            name = f"bench-comm-{os.getpid()}-{i}"
            row = rows[i]
            row["load_avg_1m_before"] = loadavg_1m()
            try:
                if c.transport == "raw_tcp":
                    row.update(run_raw(c, cfg))
                elif c.transport == "channel":
                    row.update(bench.run_channel(c, name))
                elif c.transport == "dask_actor":
                    row.update(bench.run_actor_calls(c, name))
                elif c.transport == "dask_queue":
                    row.update(bench.run_queue(c, name))
                derive(row, c, cores)
            except Exception as exc:  # noqa: BLE001 - a failed case is recorded, the others still run
                errors.append(f"case {i} ({c}): {exc!r}")
                log(f"case {i} FAILED: {exc!r}")
            row["load_avg_1m_after"] = loadavg_1m()
            if "collection_time" in row:
                log(
                    f"{i:>3} {c.sweep:>10} {c.transport:>10} {c.message_bytes:>8} B  A={c.actors:<2} "
                    f"ST={c.sample_time:<6g} N={c.messages:<6} T_c {row['collection_time']:8.3f} s  "
                    f"{row['throughput']:8.1f} MB/s  {row['message_rate']:9.0f} msg/s  "
                    f"rss {row['receiver_rss_peak']:6.1f} MB  eq1 {row['t_c_eq1']:8.3f} s ({row['critical_path']})  "
                    f"load {row['load_avg_1m_before']:.2f}"
                )
        worker_env = bench.worker_env
        idle_cpu = bench.idle_cpu_fraction
    add_raw_ratios(rows, cases)
    attrs = {
        "title": "TianJi virtual communication experiment (Fig. 5, equation 1) on tianji_dask channels",
        "created": started,
        "config": json.dumps(dataclasses.asdict(cfg)),
        "sample_mode": cfg.sample_mode,
        "channel_capacity_per_sender_bytes": int(cfg.capacity_mb * MB),
        "worker_MALLOC_TRIM_THRESHOLD_": worker_env["MALLOC_TRIM_THRESHOLD_"],
        "worker_env": json.dumps(worker_env),
        "worker_idle_cpu_fraction": idle_cpu,
        "raw_tcp_environment": "the benchmark process's environment minus MALLOC_* variables (glibc defaults)",
        "raw_tcp_receiver_MALLOC_env_seen": json.dumps(
            sorted({r["receiver_malloc_env"] for r in rows if "receiver_malloc_env" in r})
        ),
        "transports": json.dumps(TRANSPORTS),
        "cluster": (
            f"LocalCluster on 127.0.0.1, {1 + cfg.max_actors} worker processes x 1 thread, no role preload; "
            "receiver on worker 0, actor i on worker i; scheduler in the benchmark's process"
        ),
        "equation_1": "T_c = N * max((T_sp + T_sd) / N_A, T_rv); actor-bound if (T_sp + T_sd) / N_A > T_rv",
        **{f"machine_{k}": v for k, v in machine_description().items()},
        "load_avg_at_start": list(load_start),
        "load_avg_at_end": list(os.getloadavg()),
        "errors": json.dumps(errors),
        **provenance_attrs(),
    }
    ds = build_dataset(cases, rows, attrs)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "comm.nc.tmp"
        ds.to_netcdf(tmp, engine="h5netcdf")
        os.replace(tmp, out / "comm.nc")
        meta = {
            k: (json.loads(v) if k in ("config", "transports", "errors", "worker_env") else v) for k, v in attrs.items()
        }
        js = {
            "meta": meta,
            "summary": summary(cases, rows, cfg),
            "cases": [{**dataclasses.asdict(c), **{k: r.get(k) for k in VARIABLES}} for c, r in zip(cases, rows)],
        }
        (out / "comm.json").write_text(json.dumps(js, indent=2, default=_json_default))
        plot(ds, out / "comm.png", plot_title(ds))
        log(f"wrote {out / 'comm.nc'}, {out / 'comm.json'}, {out / 'comm.png'}")
    return ds


def plot_title(ds) -> str:
    """The figure's title from a comm.nc Dataset's attributes: machine, settings, load, commit."""
    a = ds.attrs
    cfg, start, end = json.loads(a["config"]), json.loads(a["load_avg_at_start"]), json.loads(a["load_avg_at_end"])
    env = json.loads(a.get("worker_env", "{}"))
    extra = "".join(f", {k} {v}" for k, v in env.items() if k != "MALLOC_TRIM_THRESHOLD_")
    return (
        f"{a['machine_cpu_cores']} cores ({a['machine_cpu_model']}), sample mode {a['sample_mode']}, "
        f"N = {cfg['messages']}; workers: MALLOC_TRIM_THRESHOLD_ {a['worker_MALLOC_TRIM_THRESHOLD_']}{extra}; "
        f"load avg 1/5/15 min at start {start[0]:.2f}/{start[1]:.2f}/{start[2]:.2f}, end {end[0]:.2f}; "
        f"git {a['git_commit'][:12]}"
    )


def replot(out: Path) -> Path:
    """Redraw ``out/comm.png`` from ``out/comm.nc`` (after changing the plot, say)."""
    import xarray as xr

    out = Path(out)
    with xr.open_dataset(out / "comm.nc", engine="h5netcdf") as ds:
        ds.load()
    plot(ds, out / "comm.png", plot_title(ds))
    return out / "comm.png"


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return str(o)


# ------------------------------------------------------------------------------ command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``benchmarks/comm.py``."""
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
    p.add_argument("--messages", type=int, default=None, help="N, messages to collect per case (overrides --small)")
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


def config_from_args(args) -> CommBenchConfig:
    if args.max_actors < 1:
        raise ValueError(f"--max-actors must be at least 1, got {args.max_actors}")
    counts, a = [], 1
    while a < args.max_actors:
        counts.append(a)
        a *= 2
    counts.append(args.max_actors)
    env = {}
    for item in args.worker_env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--worker-env takes NAME=VALUE (NAME= to unset), got {item!r}")
        env[name] = value or None
    kw = {
        "actor_counts": tuple(counts),
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
    cfg.validate()
    return cfg


def main_from_args(args) -> int:
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"benchmarks/comm.py: error: {exc}", file=sys.stderr)
        return 2
    ds = run(cfg, args.out, log=lambda s: print(s, flush=True))
    return 1 if json.loads(ds.attrs["errors"]) else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks/comm.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(p)
    return p


def main(argv=None) -> int:
    return main_from_args(build_parser().parse_args(argv))
