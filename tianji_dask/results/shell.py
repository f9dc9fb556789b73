"""``tianji-dask summary`` and ``tianji-dask plot``: the analysis accessor's summary table and
curves from the shell, for run directories, globs of them or a sweep's directory.

Both open the runs with :func:`~tianji_dask.results.analysis.open_runs` and leave the numbers and
the drawing to its ``ds.tianji`` accessor: the table is ``ds.tianji.summary()``, the curves
``ds.tianji.plot_variable(y, x)``. Bad input raises :class:`ResultsInputError` before anything is
written; a plot never replaces a file.
"""

from __future__ import annotations

import csv
import difflib
import glob
import math
import numbers
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import pandas as pd
import xarray as xr

from tianji_dask.results.analysis import RunNotFound, open_runs


class ResultsInputError(ValueError):
    """Run paths, variables or an output file the commands cannot use; the message says the fix."""


def run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """Each argument as run directories: a run directory, a glob (expanded by the shell or
    quoted for this function), or a directory of runs (a sweep's): the runs in it. Files a glob
    matches are left out (a sweep's own files beside its runs); a path named outright is left to
    :func:`open_runs`, which says what is wrong with it."""
    found: list[Path] = []
    for item in paths:
        if glob.has_magic(str(item)):
            matches = [Path(m) for m in sorted(glob.glob(str(item)))]
            dirs = [m for m in matches if m.is_dir()]
            if not dirs:
                raise ResultsInputError(
                    f"{str(item)!r} matches no directory (relative to {Path.cwd()}); "
                    "give run directories, e.g. 'runs/CartPole-v1__dqn__*' or a sweep's directory"
                )
        else:
            dirs = [Path(item)]
        for d in dirs:
            inner = sorted(p for p in d.iterdir() if (p / "metrics.nc").is_file()) if _holds_runs(d) else []
            found.extend(inner or [d])
    return list(dict.fromkeys(found))


def _holds_runs(d: Path) -> bool:
    return d.is_dir() and not (d / "metrics.nc").exists()


def open_shell_runs(paths: Sequence[str | Path]) -> xr.Dataset:
    """:func:`run_dirs` opened with :func:`open_runs`; :class:`ResultsInputError` where none is a run."""
    if not paths:
        raise ResultsInputError("give at least one run directory, glob or sweep directory")
    try:
        return open_runs(run_dirs(paths))
    except RunNotFound as exc:
        raise ResultsInputError(str(exc).replace("open_runs('", "'")) from None


# ------------------------------------------------------------------------------ summary
def summary_table(paths: Sequence[str | Path], target: float | None = None) -> pd.DataFrame:
    """``ds.tianji.summary(target)`` of the runs, its settings (the index) as leading columns."""
    table = open_shell_runs(paths).tianji.summary(target)
    return table.reset_index() if any(name is not None for name in table.index.names) else table


def print_summary(
    paths: Sequence[str | Path], target: float | None = None, as_csv: bool = False, file: TextIO | None = None
) -> None:
    """The runs' summary table on ``file`` (stdout), as :func:`print_table` writes it."""
    print_table(summary_table(paths, target), as_csv=as_csv, file=file)


CSV_ONLY = ("min_s", "max_s")  # the spread the quartiles give already; an 80-column terminal has no room


def print_table(table: pd.DataFrame, as_csv: bool = False, file: TextIO | None = None) -> None:
    """A summary table (``ds.tianji.summary()``, its settings as leading columns or still the
    index) on ``file`` (stdout): a rich table on a terminal, aligned plain text elsewhere (a
    pipe, a log), or comma-separated values with ``as_csv``, the only form with :data:`CSV_ONLY`."""
    file = file if file is not None else sys.stdout
    if any(name is not None for name in table.index.names):
        table = table.reset_index()
    if as_csv:
        table.to_csv(file, index=False, quoting=csv.QUOTE_MINIMAL)
        return
    table = table.drop(columns=[c for c in CSV_ONLY if c in table.columns])
    header = [str(c) for c in table.columns]
    rows = [[_cell(v) for v in row] for row in table.itertuples(index=False)]
    numeric = [pd.api.types.is_numeric_dtype(table[c]) for c in table.columns]
    if file.isatty():
        from rich import box
        from rich.console import Console
        from rich.table import Table

        shown = Table(
            title=f"{int(table['runs'].sum())} runs",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            collapse_padding=True,
            pad_edge=False,
        )
        for name, right in zip(header, numeric, strict=True):
            shown.add_column(name, justify="right" if right else "left")
        for row in rows:
            shown.add_row(*row)
        Console(file=file).print(shown)
        return
    widths = [max(len(c) for c in column) for column in zip(header, *rows, strict=True)]
    for line in [header, *rows]:
        cells = [c.rjust(w) if right else c.ljust(w) for c, w, right in zip(line, widths, numeric, strict=True)]
        print("  ".join(cells).rstrip(), file=file)


def _cell(v: object) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        v = float(v)
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.2f}" if abs(v) >= 0.01 else f"{v:.3g}"
    return str(v)


# ------------------------------------------------------------------------------ plot
def write_plot(paths: Sequence[str | Path], y: str, x: str, out: str | Path) -> Path:
    """One curve of ``y`` against ``x`` per run (``ds.tianji.plot_variable``), axes labelled from
    the variables' names and units, written to ``out`` (PNG, or another format matplotlib
    writes, by its suffix), which must not exist yet. Returns ``out``."""
    out = Path(out)
    _check_out(out)
    ds = open_shell_runs(paths)
    plottable = ds.tianji.row_variables
    if y not in plottable:
        raise ResultsInputError(f"--y {y}: {_not_plottable(ds, y)}; the runs' metrics.nc has {', '.join(plottable)}")
    if x != "time" and x not in plottable:
        raise ResultsInputError(f"--x {x}: {_not_plottable(ds, x)}; give time or one of {', '.join(plottable)}")
    from matplotlib.figure import Figure  # no pyplot: no backend or global figure state to set

    figure = Figure(figsize=(7, 4), layout="constrained")
    ds.tianji.plot_variable(y, x=x, ax=figure.add_subplot())
    try:
        with open(out, "xb") as f:  # "x": never over a file that appeared meanwhile
            figure.savefig(f, format=out.suffix[1:].lower())
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return out


def _check_out(out: Path) -> None:
    from matplotlib.figure import Figure

    formats = Figure().canvas.get_supported_filetypes()
    if out.exists():
        raise ResultsInputError(
            f"-o {out}: the file exists and is never replaced; give a new file name (nothing was written)"
        )
    if not out.parent.is_dir():
        raise ResultsInputError(f"-o {out}: the directory {out.parent} does not exist; create it or give another")
    if out.suffix[1:].lower() not in formats:
        raise ResultsInputError(f"-o {out}: give a file name ending in .png (or .{', .'.join(sorted(formats))})")


def _not_plottable(ds: xr.Dataset, name: str) -> str:
    if name in ds.data_vars:
        other = [str(d) for d in ds[name].dims if d not in ("run", "row")]
        return f"{name} has a value per {', '.join(other)} (not one per metrics row)"
    close = difflib.get_close_matches(name, [str(v) for v in ds.data_vars], n=1)
    return f"{name} is not a variable of metrics.nc" + (f" (did you mean {close[0]}?)" if close else "")
