"""comm.png: the paper's Fig. 5, this machine's version, drawn from a comm.nc Dataset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .cases import KIB
from .results import BAR_RSS_MB


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
    with xr.open_dataset(out / "comm.nc", engine="netcdf4") as ds:
        ds.load()
    plot(ds, out / "comm.png", plot_title(ds))
    return out / "comm.png"
