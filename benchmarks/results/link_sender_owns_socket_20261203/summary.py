"""summary.py: each lease's trees at 512 KiB, one connection, unlimited link, from the committed
link_throughput.nc files: per tree the runs' fractions (ratio of the medians of a run's three
pairs), the median of those, the median of every pair's fraction, and the channel's median rate;
then tree S pooled over all leases."""

import statistics
from collections import defaultdict
from pathlib import Path

import xarray as xr

HERE = Path(__file__).resolve().parent


def main() -> None:
    pooled: dict[str, list] = defaultdict(list)
    for lease in sorted(HERE.glob("lease?")):
        runs: dict[str, list] = defaultdict(list)
        for path in sorted(lease.glob("link_*_r*/link_throughput.nc")):
            tree = path.parent.name.split("_")[1]
            with xr.open_dataset(path) as ds:
                raw = ds.raw_tcp_bytes_per_s_runs.values.ravel()
                channel = ds.channel_bytes_per_s_runs.values.ravel()
                runs[tree].append((float(ds.fraction_of_raw_tcp.values.item()), list(channel / raw), list(channel)))
        print(f"== {lease.name}")
        for tree, rows in runs.items():
            fractions = [f for f, _, _ in rows]
            pairs = [p for _, ps, _ in rows for p in ps]
            rates = [r for _, _, rs in rows for r in rs]
            pooled[tree] += rows
            listed = " ".join(f"{f:.2f}" for f in fractions)
            print(
                f"  {tree:3s} runs {listed}  median {statistics.median(fractions):.2f}; {len(pairs)} pairs, "
                f"median {statistics.median(pairs):.2f}; channel median {statistics.median(rates) / 1e6:,.0f} MB/s"
            )
    rows = pooled["S"]
    fractions = [f for f, _, _ in rows]
    pairs = [p for _, ps, _ in rows for p in ps]
    quartiles = " ".join(f"{q:.2f}" for q in statistics.quantiles(pairs, n=4))
    print(
        f"S, all leases: {len(fractions)} runs, median {statistics.median(fractions):.3f}; {len(pairs)} pairs, "
        f"median {statistics.median(pairs):.3f}, quartiles {quartiles}"
    )


if __name__ == "__main__":
    main()
