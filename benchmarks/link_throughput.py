"""The paper's Fig. 5d on real links: throughput between two nodes against message size, the
project's queue channel against raw TCP over the same link, on a rate-limited link (1 Gbit/s, the
paper's Ethernet) and on an unlimited one.

The nodes are network namespaces joined by veth links to a bridge (``jobqueue/netns-nodes.sh``,
root only), each with one Dask worker listening on its own address: node 2 sends, node 1
receives. Raw TCP runs in those same two worker processes (``comm_bench.nodes``: ``sendall`` of each
message, the receiver reading into a preallocated buffer), right before the channel case of the
same size, which is the communication benchmark's (``comm_bench``: one ``QueueSender`` pushing
into one ``QueueInbox``, sample time 0). Throughput is message bytes over the receiver's time from
the first to the last message. With ``--repeats N`` each size runs that pair N times in turn and
reports the medians, and the channel's fraction as the ratio of the two medians (raw TCP's own
rate swings from run to run on an unlimited link); every run stays in the ``*_runs`` variables.

    sudo python benchmarks/link_throughput.py --out benchmarks/results/link_throughput
    sudo python benchmarks/link_throughput.py --rates 1gbit --sizes 524288 --messages 300   # quick

Writes ``link_throughput.nc`` (dims ``rate`` x ``size``, the runs with ``repeat`` too),
``link_throughput.json`` and ``link_throughput.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import xarray as xr

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "jobqueue")]

from netns_nodes import Nodes  # noqa: E402

from comm_bench.cases import DEFAULT_CAPACITY_MB, MB, Case, CommBenchConfig  # noqa: E402
from comm_bench.nodes import NodesCluster  # noqa: E402

KIB = 1 << 10
SIZES = (64 * KIB, 256 * KIB, 512 * KIB, 1024 * KIB, 4096 * KIB)
#: The channel case's seconds a message (comm_bench's names): which side binds the rate.
CHANNEL_SPENT = {
    "t_sd": "sender process CPU a message",
    "t_rv": "receiver process CPU a message",
    "credit_wait_time": "sender's wait for credit a message",
}


def measure(
    rate: str | None, sizes, messages: int, log, capacity_mb: float = DEFAULT_CAPACITY_MB, repeats: int = 1
) -> list[dict]:
    workdir = Path(tempfile.mkdtemp(prefix="link-throughput-"))
    nodes = Nodes.up(2, workdir, rate)
    nodes.pythonpath.append(str(HERE))  # the tasks are comm_bench's
    rows = []
    try:
        scheduler = nodes.start_scheduler()
        nodes.start_worker(1, "node1-receiver", {})
        nodes.start_worker(2, "node2-sender", {})
        nodes.wait_for_workers(2)
        cfg = CommBenchConfig(messages=messages, capacity_mb=capacity_mb)
        with NodesCluster(cfg, scheduler, workers=2) as cluster:
            for size in sizes:
                runs = []
                for k in range(repeats):
                    r = cluster.run_raw(size, messages)
                    raw = r["bytes"] / (r["t_n"] - r["t_first_byte"])
                    res = cluster.run_channel(Case("size", "channel", size, 1, 0.0, messages), f"link-{size}-{k}")
                    channel = messages * size / res["collection_time"]
                    spent = {key: res[key] for key in CHANNEL_SPENT}
                    runs.append({"raw_tcp": raw, "channel": channel, **spent})
                    log(
                        f"{rate or 'unlimited':>9} {size // KIB:6d} KiB: raw TCP {raw / MB:8.1f} MB/s, "
                        f"channel {channel / MB:8.1f} MB/s ({channel / raw:.2f}); a message: sender CPU "
                        f"{spent['t_sd'] * 1e6:.0f} us, receiver CPU {spent['t_rv'] * 1e6:.0f} us, "
                        f"credit wait {spent['credit_wait_time'] * 1e6:.0f} us"
                    )
                medians = {key: float(np.median([run[key] for run in runs])) for key in runs[0]}
                rows.append({"rate": rate or "unlimited", "size": size, **medians, "runs": runs})
                if repeats > 1:
                    log(
                        f"{rate or 'unlimited':>9} {size // KIB:6d} KiB, medians of {repeats}: raw TCP "
                        f"{medians['raw_tcp'] / MB:8.1f} MB/s, channel {medians['channel'] / MB:8.1f} MB/s "
                        f"({medians['channel'] / medians['raw_tcp']:.2f})"
                    )
    finally:
        nodes.stop()
    return rows


def save(rows: list[dict], out: Path, meta: dict) -> None:
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    sizes = sorted({r["size"] for r in rows})
    repeats = max(len(r["runs"]) for r in rows)
    grid = {k: np.full((len(rates), len(sizes)), np.nan) for k in ("raw_tcp", "channel", *CHANNEL_SPENT)}
    runs = {k: np.full((len(rates), len(sizes), repeats), np.nan) for k in ("raw_tcp", "channel")}
    for r in rows:
        i, j = rates.index(r["rate"]), sizes.index(r["size"])
        for k in grid:
            grid[k][i, j] = r[k]
        for k in runs:
            runs[k][i, j, : len(r["runs"])] = [run[k] for run in r["runs"]]
    dims = ("rate", "size")
    run_dims = ("rate", "size", "repeat")
    ds = xr.Dataset(
        {
            "raw_tcp_bytes_per_s": (dims, grid["raw_tcp"], {"long_name": "raw TCP throughput", "units": "B/s"}),
            "channel_bytes_per_s": (dims, grid["channel"], {"long_name": "queue channel throughput", "units": "B/s"}),
            **{
                f"channel_{k}": (dims, grid[k], {"long_name": long_name, "units": "s"})
                for k, long_name in CHANNEL_SPENT.items()
            },
            "fraction_of_raw_tcp": (
                dims,
                grid["channel"] / grid["raw_tcp"],
                {"long_name": "channel throughput / raw TCP throughput", "units": "1"},
            ),
            "raw_tcp_bytes_per_s_runs": (run_dims, runs["raw_tcp"], {"long_name": "raw TCP, each run", "units": "B/s"}),
            "channel_bytes_per_s_runs": (
                run_dims,
                runs["channel"],
                {"long_name": "queue channel, each run (the one after that repeat's raw TCP)", "units": "B/s"},
            ),
        },
        coords={
            "rate": ("rate", rates, {"long_name": "link rate limit (tc tbf)", "units": "1"}),
            "size": ("size", sizes, {"long_name": "message size", "units": "B"}),
            "repeat": ("repeat", np.arange(repeats), {"long_name": "raw TCP and channel pair, in run order"}),
        },
        attrs={"title": "throughput between two network-namespace nodes (paper Fig. 5d)", **meta},
    )
    out.mkdir(parents=True, exist_ok=True)
    ds.to_netcdf(out / "link_throughput.nc", engine="netcdf4")
    (out / "link_throughput.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, rate in enumerate(rates):
        ax.plot(np.array(sizes) / KIB, grid["raw_tcp"][i] / MB, "--", marker="o", label=f"raw TCP, {rate}")
        ax.plot(np.array(sizes) / KIB, grid["channel"][i] / MB, "-", marker="s", label=f"channel, {rate}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size [KiB]")
    ax.set_ylabel("throughput [MB/s]")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "link_throughput.png", dpi=120)


def _print(line: str) -> None:
    print(line, flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="1gbit,unlimited", help="comma-separated tc rates; 'unlimited' for none")
    p.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="comma-separated message bytes")
    p.add_argument("--messages", type=int, default=2000, help="messages per case")
    p.add_argument(
        "--capacity-mb",
        type=float,
        default=DEFAULT_CAPACITY_MB,
        help="the channel's credit window, MB (default: the default config's channel.capacity_mb)",
    )
    p.add_argument(
        "--repeats", type=int, default=1, help="raw TCP and channel pairs a size, in turn; medians reported (default 1)"
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/link_throughput"))
    a = p.parse_args()
    if a.capacity_mb <= 0:
        p.error(f"--capacity-mb must be positive, got {a.capacity_mb}")
    if a.repeats < 1:
        p.error(f"--repeats must be at least 1, got {a.repeats}")
    if os.geteuid() != 0:
        p.error("needs root: the nodes are network namespaces (jobqueue/netns-nodes.sh)")
    sizes = [int(s) for s in a.sizes.split(",")]
    rows = []
    for rate in a.rates.split(","):
        rows += measure(None if rate == "unlimited" else rate, sizes, a.messages, _print, a.capacity_mb, a.repeats)
    meta = {
        "messages": a.messages,
        "capacity_mb": a.capacity_mb,
        "repeats": a.repeats,
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "command": " ".join(sys.argv),
    }
    save(rows, a.out, meta)
    print(f"results: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
