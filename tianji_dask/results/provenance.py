"""Where a result came from: the installed versions, the git commit of the code, and paths as
a committed result may name them."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

_VERSIONED = ("torch", "dask", "distributed", "gymnasium", "numpy", "xarray")


def provenance_attrs() -> dict[str, str]:
    """Versions of tianji_dask, its main dependencies and Python, plus the git commit."""
    a = {"tianji_dask_version": package_version("tianji-dask")}
    for pkg in _VERSIONED:
        a[f"{pkg}_version"] = package_version(pkg)
    a["python_version"] = platform.python_version()
    a["git_commit"] = git_commit()
    return a


def package_version(dist: str) -> str:
    """The installed version of the distribution ``dist``, ``"not installed"`` if absent."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def portable_path(path: str | os.PathLike) -> str:
    """``path`` relative to the working directory where it lies below it (a benchmark's run
    directories and interpreters inside the checkout), else as given: results committed to a
    repository name no one's home or scratch folder."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def git_commit(pkg_dir: Path | None = None) -> str:
    """``git rev-parse HEAD`` of the tianji_dask source tree (``pkg_dir``, default the installed
    package's), ``-dirty`` if a tracked file has changes. Untracked files do not count: a run's
    outputs (``runs/``, an ``eval.nc``, a video) left in the checkout are not code.

    ``"unknown"`` when the package is not a tracked file of a git checkout (e.g. installed from
    a wheel) or git is missing or fails.
    """
    pkg_dir = pkg_dir or Path(__file__).resolve().parents[1]  # the tianji_dask package

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(pkg_dir), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout

    try:
        # A site-packages copy inside some unrelated repository must not report that repository.
        git("ls-files", "--error-unmatch", "__init__.py")
        sha = git("rev-parse", "HEAD").strip()
        dirty = bool(git("status", "--porcelain", "--untracked-files=no").strip())
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "") if sha else "unknown"
