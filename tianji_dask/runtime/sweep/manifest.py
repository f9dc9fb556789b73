"""A sweep's manifest, ``<sweep dir>/sweep.yaml``: what ``tianji-dask sweep --resume DIR`` needs
to plan the same runs again. Written as the sweep starts, never rewritten.

It holds the config file's own content (so that editing or moving the file after the sweep
started changes nothing of the runs still to come), the path it was read from (for the reader),
the grid (each key's values as ``--set`` texts), the ``--set`` overrides, ``parallel`` and the
run names in grid order.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tianji_dask.config import ConfigError
from tianji_dask.results.atomic import atomic_write
from tianji_dask.runtime.sweep.grid import Axes

MANIFEST = "sweep.yaml"
HEADER = "# a tianji-dask sweep: `tianji-dask sweep --resume DIR` runs the runs it has not finished\n"


@dataclass
class Manifest:
    config: dict[str, Any]  # the config file's content
    config_path: str
    axes: Axes
    overrides: list[str]
    parallel: int
    runs: list[str]


def write_manifest(out: Path, manifest: Manifest) -> None:
    """``out/sweep.yaml``, atomically; an existing one is kept (a resumed sweep's)."""
    path = out / MANIFEST
    if path.exists():
        return
    data = {
        "config_path": manifest.config_path,
        "grid": {key: list(values) for key, values in manifest.axes},
        "overrides": list(manifest.overrides),
        "parallel": manifest.parallel,
        "runs": list(manifest.runs),
        "config": manifest.config,
    }
    with atomic_write(path) as tmp:
        tmp.write_text(HEADER + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def read_manifest(out: str | Path) -> Manifest:
    """The manifest of the sweep in ``out``; a :class:`ConfigError` naming the fix for a
    directory that is not a sweep's or a manifest that cannot be read."""
    out = Path(out)
    given = "give the directory a sweep wrote (its last line says `results in DIR`)"
    if not out.is_dir():
        raise ConfigError(f"--resume {out}: no such directory; {given}")
    path = out / MANIFEST
    if not path.is_file():
        raise ConfigError(f"--resume {out}: not a sweep's directory (no {MANIFEST}); {given}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        manifest = Manifest(
            config=_typed(data["config"], dict),
            config_path=_typed(data["config_path"], str),
            axes=[(str(k), [str(v) for v in _typed(vs, list)]) for k, vs in _typed(data["grid"], dict).items()],
            overrides=[str(o) for o in _typed(data["overrides"], list)],
            parallel=_typed(data["parallel"], int),
            runs=[str(r) for r in _typed(data["runs"], list)],
        )
    except (OSError, UnicodeDecodeError, yaml.YAMLError, TypeError, KeyError) as exc:
        why = f"lacks {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise ConfigError(f"--resume {out}: {path} cannot be read ({why}); {given}") from None
    return manifest


def _typed(value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"{value!r} is not a {kind.__name__}")
    return value


@contextlib.contextmanager
def held(out: Path) -> Iterator[None]:
    """The sweep in ``out`` held by this process while its runs go (an exclusive ``flock`` on its
    manifest): a second sweep process on the same directory (``--resume`` while the first still
    stops its runs) is refused with a :class:`ConfigError` instead of running a run twice."""
    with open(out / MANIFEST, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"the sweep in {out} is still running in another process; wait for it to end "
                "(Ctrl-C there stops it) before --resume"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
