"""A sweep's grid: the values of each swept config key, from ``--grid`` texts or a YAML grid file,
and the name of the run each combination makes.

``--grid seed=0,1,2`` separates values by commas; commas inside brackets or braces belong to their
value (``--grid 'algo.hidden_sizes=[64,64],[32]'``), and a grid whose values hold commas of their
own separates them by semicolons instead (``--grid 'algo.hidden_sizes=[64,64];[32]'``). Each value
is read as YAML, as ``--set`` reads it. A grid file maps each key to a list of values
(``{seed: [0, 1], algo.hidden_sizes: [[64, 64], [32]]}``; nested sections work too).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tianji_dask.config import ConfigError
from tianji_dask.config.loading import parse_override

Axes = list[tuple[str, list[str]]]  # (key, its values as --set texts), in grid order

GRID_FORM = (
    "--grid key.path=V1,V2,... (values separated by commas; by semicolons where values hold commas: "
    "--grid 'algo.hidden_sizes=[64,64];[32]')"
)
GRID_FILE_FORM = (
    "a YAML mapping of key.path to a list of values, e.g. {seed: [0, 1], algo.hidden_sizes: [[64, 64], [32]]}"
)


def split_values(text: str, values: str) -> list[str]:
    """``"0,1"`` -> ``["0", "1"]``; ``"[64,64],[32]"`` and ``"[64,64];[32]"`` -> ``["[64,64]", "[32]"]``."""
    if ";" in values:
        return [v.strip() for v in values.split(";")]
    items, depth, start = [], 0, 0
    for i, c in enumerate(values):
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth < 0:
                break
        elif c == "," and depth == 0:
            items.append(values[start:i].strip())
            start = i + 1
    if depth != 0:
        raise ConfigError(f"--grid {text!r}: unbalanced brackets in the values; expected {GRID_FORM}")
    items.append(values[start:].strip())
    return items


def _check_key(key: str, where: str, form: str) -> None:
    try:
        parse_override(f"{key}=0")  # the key's form, as --set checks it
    except ConfigError:
        raise ConfigError(
            f"{where}: {key!r} is not a config key (key.path: letters, digits, _); expected {form}"
        ) from None


def _check_value(key: str, value: str, where: str, form: str) -> None:
    try:
        parse_override(f"{key}={value}")  # the value read as YAML, as --set reads it
    except ConfigError:
        raise ConfigError(f"{where}: the value {value!r} of {key} is not valid YAML; expected {form}") from None


def parse_grid(texts: Sequence[str], grid_file: str | Path | None = None) -> Axes:
    """The axes of ``--grid`` texts and a grid file together; a :class:`ConfigError` naming the
    form for a malformed entry, a key given twice, or no key at all."""
    axes: Axes = []

    def add(key: str, values: list[str], where: str) -> None:
        if key in dict(axes):
            raise ConfigError(f"{where}: {key} is given twice; give all its values once (one --grid or the grid file)")
        if len(set(values)) != len(values):
            raise ConfigError(f"{where}: a value of {key} is given twice")
        axes.append((key, values))

    for text in texts:
        key, sep, given = text.partition("=")
        key = key.strip()
        _check_key(key, f"--grid {text!r}", GRID_FORM)
        items = split_values(text, given) if sep else []
        if not sep or not items or not all(items):
            raise ConfigError(f"--grid {text!r}: expected {GRID_FORM}")
        for item in items:
            _check_value(key, item, f"--grid {text!r}", GRID_FORM)
        add(key, items, f"--grid {text!r}")
    if grid_file is not None:
        for key, values in read_grid_file(grid_file):
            add(key, values, f"--grid-file {grid_file}")
    if not axes:
        raise ConfigError("a sweep needs at least one --grid key.path=V1,V2,... (or --grid-file FILE)")
    return axes


def read_grid_file(path: str | Path) -> Axes:
    """A grid file's axes, each value as the ``--set`` text that gives it back."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--grid-file {path}: no such file; expected {GRID_FILE_FORM}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"--grid-file {path}: cannot be read ({exc}); expected {GRID_FILE_FORM}") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"--grid-file {path}: expected {GRID_FILE_FORM}, got {type(data).__name__}")
    axes: Axes = []
    for key, values in _leaves(data):
        if not isinstance(values, list) or not values:
            raise ConfigError(
                f"--grid-file {path}: {key} is {values!r}, not a list of values; expected {GRID_FILE_FORM}"
            )
        _check_key(key, f"--grid-file {path}", GRID_FILE_FORM)
        texts = [value_text(v) for v in values]
        for text in texts:
            _check_value(key, text, f"--grid-file {path}", GRID_FILE_FORM)
        axes.append((key, texts))
    return axes


def _leaves(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, dict):
            out.extend(_leaves(value, f"{prefix}{key}."))
        else:
            out.append((f"{prefix}{key}", value))
    return out


def value_text(value: Any) -> str:
    """The ``--set`` text of a YAML value: a string as it is where YAML reads it back unchanged,
    anything else (and other strings) as JSON, which YAML reads."""
    if isinstance(value, str):
        try:
            if yaml.safe_load(value) == value:
                return value
        except yaml.YAMLError:
            pass
    return json.dumps(value, separators=(",", ":"))


def run_name(combination: Sequence[tuple[str, str]]) -> str:
    """``seed=0__algo.hidden_sizes=64-64``: one path component, brackets, quotes and spaces
    dropped, other characters but ``._=-`` turned into ``-``."""
    name = "__".join(f"{k}={v}" for k, v in combination)
    name = "".join(c for c in name if c not in "[]{}'\" ")
    return "".join(c if c.isalnum() or c in "._=-" else "-" for c in name)
