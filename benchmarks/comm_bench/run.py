"""The driver: every case of a configuration, one after another, and the files they make."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from .cases import MB, CommBenchConfig, plan_cases
from .cluster import BenchCluster
from .derived import add_raw_ratios, derive
from .plot import plot, plot_title
from .rawtcp import run_raw
from .results import TRANSPORTS, VARIABLES, build_dataset, json_default, machine_description, summary
from .workload import loadavg_1m


def run(cfg: CommBenchConfig, out: Path | None = None, log=print):
    """Run every case of ``cfg``; write comm.nc/json/png to ``out`` (if given); return the Dataset."""
    from tianji_dask.results.atomic import atomic_write
    from tianji_dask.results.provenance import provenance_attrs

    cfg.validate()
    cases = plan_cases(cfg)
    cores = os.cpu_count() or 1
    load_start = os.getloadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    rows: list[dict] = [{} for _ in cases]
    errors = []
    with BenchCluster(cfg) as bench:
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
                    f"rss {row['receiver_rss_peak']:6.1f} MB  "
                    f"faults {row.get('receiver_faults_per_message', float('nan')):5.0f}/msg  "
                    f"switches {row.get('receiver_switches_per_message', float('nan')):5.1f}/msg  "
                    f"eq1 {row['t_c_eq1']:8.3f} s ({row['critical_path']})  "
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
        with atomic_write(out / "comm.nc") as tmp:
            ds.to_netcdf(tmp, engine="netcdf4")
        meta = {
            k: (json.loads(v) if k in ("config", "transports", "errors", "worker_env") else v) for k, v in attrs.items()
        }
        js = {
            "meta": meta,
            "summary": summary(cases, rows, cfg),
            "cases": [{**dataclasses.asdict(c), **{k: r.get(k) for k in VARIABLES}} for c, r in zip(cases, rows)],
        }
        (out / "comm.json").write_text(json.dumps(js, indent=2, default=json_default))
        plot(ds, out / "comm.png", plot_title(ds))
        log(f"wrote {out / 'comm.nc'}, {out / 'comm.json'}, {out / 'comm.png'}")
    return ds
