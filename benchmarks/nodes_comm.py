"""The paper's Fig. 5c on real links: collection time against the number of actors, the actors
spread evenly over several nodes, the project's queue channel against raw TCP over the same links.

The nodes are network namespaces joined by veth links to a bridge (``jobqueue/netns-nodes.sh``,
root only), each link rate-limited by tc's token bucket filter or not (``--rate``). Node 1 holds
the receiver (one Dask worker); the actors are one worker each, dealt round the nodes (actor i on
node ``1 + i % nodes``), so that the first A of them are spread as evenly as A allows. Each case is
the communication benchmark's actor case (``comm_bench``: A ``QueueSender``s into one
``QueueInbox``, 512 KiB messages, a sampling sleep before each, collection time from the first send
to the N-th message held), right after raw TCP between the same worker processes
(``comm_bench.nodes``).

    sudo python benchmarks/nodes_comm.py --out benchmarks/results/nodes_comm
    sudo python benchmarks/nodes_comm.py --max-actors 4 --messages 200            # quick

Writes ``nodes_comm.nc`` (dims ``sample_time`` x ``actors``, the two transports' collection times,
throughputs and their ratio, and the bytes that came into node 1 over its link during each case:
the remote actors' share), ``nodes_comm.json`` and ``nodes_comm.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import xarray as xr

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "jobqueue")]

from netns_nodes import Nodes, link_bytes  # noqa: E402

from comm_bench.cases import MB, Case, CommBenchConfig, actor_counts  # noqa: E402
from comm_bench.nodes import NodesCluster  # noqa: E402
from comm_bench.results import machine_description  # noqa: E402

KIB = 1 << 10
#: tc's rates: a number and a unit in bits or bytes per second
RATE = re.compile(r"\d+(\.\d+)?([kmgt]?bit|[kmgt]?bps)", re.IGNORECASE)


def node_of(actor: int, nodes: int) -> int:
    """The node of actor ``actor`` (0-based): dealt round nodes 1..nodes."""
    return 1 + actor % nodes


def measure(args, log) -> list[dict]:
    workdir = Path(tempfile.mkdtemp(prefix="nodes-comm-"))
    nodes = Nodes.up(args.nodes, workdir, args.rate)
    nodes.pythonpath.append(str(HERE))  # the tasks are comm_bench's
    rows = []
    try:
        scheduler = nodes.start_scheduler()
        nodes.start_worker(1, "a00-receiver-node1", {})
        for i in range(args.max_actors):  # names sort receiver first, then actors in dealing order
            nodes.start_worker(node_of(i, args.nodes), f"a{i + 1:02d}-actor-node{node_of(i, args.nodes)}", {})
        nodes.wait_for_workers(1 + args.max_actors, timeout=180)
        cfg = CommBenchConfig(messages=args.messages, actor_counts=actor_counts(args.max_actors))
        with NodesCluster(cfg, scheduler, workers=1 + args.max_actors) as cluster:
            for st in args.sample_times:
                for a in cfg.actor_counts:
                    before = link_bytes(1)[1]
                    raw = cluster.run_raw(args.message_bytes, args.messages, a, st)["collection_time"]
                    between = link_bytes(1)[1]
                    case = Case("actors", "channel", args.message_bytes, a, st, args.messages)
                    channel = cluster.run_channel(case, f"nodes-{a}-{st}")["collection_time"]
                    raw_link, channel_link = between - before, link_bytes(1)[1] - between
                    rows.append(
                        {"sample_time": st, "actors": a, "raw_tcp": raw, "channel": channel,
                         "raw_tcp_link_bytes": raw_link, "channel_link_bytes": channel_link}
                    )  # fmt: skip
                    log(
                        f"ST {st:g} s {a:3d} actors on {min(a, args.nodes)} nodes: raw TCP {raw:7.3f} s, "
                        f"channel {channel:7.3f} s ({channel / raw:.2f}x)  load {os.getloadavg()[0]:.2f}"
                    )
    finally:
        nodes.stop()
    return rows


def save(rows: list[dict], out: Path, args, meta: dict) -> xr.Dataset:
    sts = sorted({r["sample_time"] for r in rows})
    counts = sorted({r["actors"] for r in rows})
    keys = ("raw_tcp", "channel", "raw_tcp_link_bytes", "channel_link_bytes")
    grid = {k: np.full((len(sts), len(counts)), np.nan) for k in keys}
    for r in rows:
        for k in grid:
            grid[k][sts.index(r["sample_time"]), counts.index(r["actors"])] = r[k]
    nbytes = args.messages * args.message_bytes
    dims = ("sample_time", "actors")

    def var(values, long_name: str, units: str):
        return (dims, values, {"long_name": long_name, "units": units})

    ds = xr.Dataset(
        {
            "raw_tcp_collection_time": var(grid["raw_tcp"], "raw TCP: first send to the N-th message held", "s"),
            "channel_collection_time": var(grid["channel"], "queue channel: first send to the N-th message held", "s"),
            "raw_tcp_throughput": var(nbytes / grid["raw_tcp"] / MB, "raw TCP: payload over collection time", "MB s-1"),
            "channel_throughput": var(nbytes / grid["channel"] / MB, "channel: payload over collection time", "MB s-1"),
            "time_ratio_to_raw_tcp": var(grid["channel"] / grid["raw_tcp"], "channel collection time / raw TCP's", "1"),
            "raw_tcp_link_bytes": var(grid["raw_tcp_link_bytes"], "raw TCP case: bytes into node 1 over its link", "B"),
            "channel_link_bytes": var(grid["channel_link_bytes"], "channel case: bytes into node 1 over its link", "B"),
        },
        coords={
            "sample_time": (
                "sample_time",
                sts,
                {"long_name": "actor's sampling sleep before each message", "units": "s"},
            ),
            "actors": ("actors", counts, {"long_name": "actors, dealt round the nodes", "units": "1"}),
        },
        attrs={"title": "collection time with the actors spread over network-namespace nodes (paper Fig. 5c)", **meta},
    )
    out.mkdir(parents=True, exist_ok=True)
    ds.to_netcdf(out / "nodes_comm.nc")
    (out / "nodes_comm.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    plot(ds, out / "nodes_comm.png")
    return ds


def plot(ds: xr.Dataset, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for st in ds.sample_time.values:
        sel = ds.sel(sample_time=st)
        ax.plot(ds.actors, sel.raw_tcp_collection_time, "--", marker="o", label=f"raw TCP, ST {st:g} s")
        ax.plot(ds.actors, sel.channel_collection_time, "-", marker="s", label=f"channel, ST {st:g} s")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"actors (over {ds.attrs['nodes']} nodes)")
    ax.set_ylabel(f"time to collect {ds.attrs['messages']} messages [s]")
    ax.set_title(f"{ds.attrs['message_bytes'] // KIB} KiB messages, link {ds.attrs['rate']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=4, help="nodes to spread the actors over (default 4, the paper's)")
    p.add_argument("--max-actors", type=int, default=32, help="actor sweep 1, 2, 4, ... up to this many")
    p.add_argument("--sample-times", default="0.001,0.01", help="comma-separated sampling sleeps, seconds")
    p.add_argument("--messages", type=int, default=4000, help="N, messages to collect per case")
    p.add_argument("--message-bytes", type=int, default=512 * KIB)
    p.add_argument("--rate", default=None, help="tc rate of every link, e.g. 1gbit (default: unlimited)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/nodes_comm"))
    a = p.parse_args(argv)
    for name in ("nodes", "max_actors", "messages", "message_bytes"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}")
    try:
        a.sample_times = [float(s) for s in a.sample_times.split(",")]
    except ValueError:
        p.error(f"--sample-times {a.sample_times!r}: give seconds separated by commas, e.g. 0.001,0.01")
    if any(st < 0 for st in a.sample_times):
        p.error(f"--sample-times {a.sample_times}: sampling sleeps cannot be negative")
    if a.rate is not None and not RATE.fullmatch(a.rate):
        p.error(f"--rate {a.rate!r}: give tc's form, a number and a unit such as 1gbit, 100mbit or 12500kbps")
    if os.geteuid() != 0:
        p.error("needs root: the nodes are network namespaces (jobqueue/netns-nodes.sh)")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = measure(args, lambda s: print(s, flush=True))
    machine = machine_description()
    meta = {
        "nodes": args.nodes,
        "rate": args.rate or "unlimited",
        "messages": args.messages,
        "message_bytes": args.message_bytes,
        "machine_cpu_cores": machine["cpu_cores"],
        "cpu_model": machine["cpu_model"],
        "load_avg_1m": os.getloadavg()[0],
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "command": " ".join(sys.argv),
    }
    save(rows, args.out, args, meta)
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
