"""Quantities derived from one case's raw measurements: throughput, rates, equation 1, and the
ratios to raw TCP."""

from __future__ import annotations

import math

from .cases import MB, Case


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
