"""Run directories: the run name, a fresh directory per run, and the resolved config in it.

Layout (see ``docs/metrics.md``)::

    runs/<env>__<algo>__<seed>__<YYYYmmdd-HHMMSS>/
        config.yaml      resolved run config
        metrics.nc       time series (MetricsRecorder.dataset)
        episodes.nc      one record per episode
        checkpoint/      tensors.pt + checkpoint.json

A run never writes into a directory that already holds something: an explicit ``--out`` that is
not empty is refused, and default names get a ``-2``, ``-3``... suffix.
"""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path

from tianji_dask.config.deployment import deployment_settings
from tianji_dask.results.atomic import atomic_write

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class RunDirExists(ValueError):
    """The requested run directory already holds files."""


def run_name(env_id: str, algo: str, seed: int, when: _dt.datetime | None = None) -> str:
    """``"<env>__<algo>__<seed>__<YYYYmmdd-HHMMSS>"``, safe as one path component.

    Characters other than letters, digits, ``.``, ``_`` and ``-`` become ``-``
    (``"ALE/Pong-v5"`` -> ``"ALE-Pong-v5"``). ``when`` defaults to now (local time).
    """
    when = when or _dt.datetime.now()
    return f"{_safe(env_id)}__{_safe(algo)}__{int(seed)}__{when:%Y%m%d-%H%M%S}"


def prepare_run_dir(out: Path | None, *, root: Path | None = None, name: str) -> Path:
    """Create and return (absolute) the directory a run writes into.

    ``out`` None: ``root/name``, or ``root/name-2``, ``-3``... if taken; ``root`` None is the
    ``tianji.runs-dir`` setting (:mod:`tianji_dask.config.deployment`). ``out`` given: created if
    missing, used if empty, else :class:`RunDirExists`: nothing already written is overwritten.
    """
    if out is None:
        root = deployment_settings().runs_dir if root is None else Path(root)
        root.mkdir(parents=True, exist_ok=True)
        base = _safe(name)
        for i in range(1, 10_000):
            path = root / (base if i == 1 else f"{base}-{i}")
            try:
                path.mkdir()  # exist_ok=False: two runs starting in the same second get different dirs
            except FileExistsError:
                continue
            return path.absolute()
        raise RunDirExists(f"{root} already holds 10000 runs named {base}; pass --out")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RunDirExists(f"--out {out} exists and is a file, not a directory; pick another --out or remove it")
    if out.is_dir():
        entries = sorted(p.name for p in out.iterdir())
        if entries:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise RunDirExists(
                f"run directory {out} is not empty ({len(entries)} entries: {shown}); "
                "pick another --out or remove it. A run never overwrites earlier results."
            )
    out.mkdir(parents=True, exist_ok=True)
    return out.absolute()


def run_dir_problem(run_dir: Path) -> str | None:
    """What keeps ``run_dir`` from being a directory a run wrote (None: it is one), said with the fix."""
    fix = "give the directory a run wrote (runs/<env>__<algo>__<seed>__<time>, it holds config.yaml)"
    if run_dir.is_file():
        if (run_dir.parent / "config.yaml").is_file():
            return f"a file, not a directory; give the run directory it is in, {run_dir.parent}"
        return f"a file, not a run directory; {fix}"
    if not run_dir.is_dir():
        return f"no such directory; {fix}"
    if not (run_dir / "config.yaml").is_file():
        return f"not a run directory (no config.yaml); {fix}"
    return None


def write_config(run_dir: Path, config_yaml: str) -> None:
    """Write the resolved config to ``run_dir/config.yaml`` (atomically)."""
    path = Path(run_dir) / "config.yaml"
    text = config_yaml if config_yaml.endswith("\n") else config_yaml + "\n"
    with atomic_write(path) as tmp, open(tmp, "x", encoding="utf-8") as f:
        f.write(text)


def _safe(part: str) -> str:
    return _UNSAFE.sub("-", str(part))
