"""summary.py: each lease's trees at 512 KiB, one connection, unlimited link, from the committed
link_throughput.nc files (the runs' fractions of raw TCP, each the ratio of a run's medians, and
every pair's fraction), then each tree pooled over the leases. A Fig. 5d run (``fig5d*``, every
size) counts as a run of W, its 512 KiB point taken: leases F2 and F3 ran W's path at that size."""

import statistics
from collections import defaultdict
from pathlib import Path

import xarray as xr

HERE = Path(__file__).resolve().parent


def line(tree: str, fractions: list[float], pairs: list[float]) -> str:
    quartiles = " ".join(f"{q:.2f}" for q in statistics.quantiles(pairs, n=4))
    return (
        f"  {tree}: runs {' '.join(f'{f:.2f}' for f in fractions)}, median {statistics.median(fractions):.3f}; "
        f"{len(pairs)} pairs, median {statistics.median(pairs):.3f}, quartiles {quartiles}"
    )


def main() -> None:
    pooled: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
    for lease in sorted(p for p in HERE.glob("lease*") if p.name != "lease"):
        print(f"== {lease.name}")
        runs: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
        paths = sorted(lease.glob("link_*_r*/link_throughput.nc")) + sorted(lease.glob("fig5d*/link_throughput.nc"))
        for path in paths:
            name = path.parent.name
            tree = "W" if name.startswith("fig5d") else name.split("_")[1]
            with xr.open_dataset(path) as ds:
                if "fig5d_gbit" in name:
                    continue
                at = ds.sel(rate="unlimited", size=524288)
                pairs = at.channel_bytes_per_s_runs.values / at.raw_tcp_bytes_per_s_runs.values
                for into in (runs[tree], pooled[tree]):
                    into[0].append(float(at.fraction_of_raw_tcp.values))
                    into[1].extend(float(p) for p in pairs)
        for tree, (fractions, pairs) in runs.items():
            print(line(tree, fractions, pairs))
    print("== pooled")
    for tree, (fractions, pairs) in pooled.items():
        print(line(tree, fractions, pairs))


if __name__ == "__main__":
    main()
