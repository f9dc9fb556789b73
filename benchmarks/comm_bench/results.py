"""comm.nc and comm.json: the variables and coordinates they hold (docs/benchmarks.md lists the
same), the Dataset, the headline summary and the machine's description."""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path

import numpy as np

from .cases import KIB, MIB, Case, CommBenchConfig

BAR_TIME_RATIO = 1.5  # the bar: 4 actors at 512 KiB within 1.5x raw TCP's collection time
BAR_RSS_MB = 300.0  # ... with the receiver's RSS under 300 MB throughout
BAR_TINY_RATE = 10_000.0  # ... and at least 10,000 100-byte messages per second into one inbox

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
    "receiver_faults_per_message": (
        "minor page faults of the receiving process (all its threads) during the case, per message collected",
        "1",
    ),
    "receiver_switches_per_message": (
        "context switches (voluntary and involuntary) of the receiving process during the case, per message collected",
        "1",
    ),
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


def json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return str(o)
