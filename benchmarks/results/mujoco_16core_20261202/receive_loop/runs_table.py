"""Per run of mujoco_1m.py job folders: median env steps/s, env steps dropped as stale, the first
drop's time, the mean policy_lag of the last 5 rows and the median train_busy.

    python runs_table.py JOB_FOLDER...   (each holding runs/<stamp>/<env>-seed<N>/metrics.nc)
"""

import glob
import sys

import numpy as np
import xarray as xr

for pattern in sys.argv[1:]:
    for path in sorted(glob.glob(f"{pattern}/runs/*/*/metrics.nc")):
        ds = xr.open_dataset(path)
        seconds = ds["time"].values.astype(float)
        dropped = ds["stale_dropped"].values
        first = f"{seconds[np.argmax(dropped > 0)]:.1f}" if (dropped > 0).any() else None
        fps = ds["env_fps"].values
        print(
            path.split("/")[-2],
            pattern,
            f"fps_med {np.nanmedian(fps[fps > 0]):.0f}",
            f"dropped {int(np.nanmax(dropped))}",
            f"first {first}",
            f"lag_end {np.nanmean(ds['policy_lag'].values[-5:]):.2f}",
            f"busy_med {np.nanmedian(ds['train_busy'].values):.2f}",
        )
