"""Config errors a user can act on: :class:`ConfigError`, and pydantic's errors as its lines.

Each line names the dotted field, the value given and what is allowed (or the fix); an unknown
key gets the closest valid one and the list of valid keys at its level.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from tianji_dask.config.schema import ALGO_CONFIGS, PROBLEM, section_model


class ConfigError(ValueError):
    """A bad experiment config or deployment setting; ``str(error)`` is ready to show to a user.

    ``problems`` holds one line per problem, each naming the dotted field, the value given and
    what is allowed; the message is an optional header line followed by those lines.
    """

    def __init__(self, problems: str | Sequence[str], header: str | None = None) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        self.header = header
        lines = ([header] if header else []) + [f"  {p}" if header else p for p in self.problems]
        super().__init__("\n".join(lines))


def _show(value: Any) -> str:
    """A value as the user wrote it in YAML: true/false/null, quoted strings, numbers."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value)


def _dotted(loc: Sequence[str | int]) -> str:
    """A pydantic error location as the user's key path: ``algo.hidden_sizes[1]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def unknown_key_text(parent: Sequence[str], key: str, data: Mapping[str, Any] | None) -> str:
    """' (did you mean ...?); valid keys at <parent>: ...' for an unknown key under parent."""
    model = section_model(parent, data)
    if model is None:
        return ""
    valid = list(model.model_fields)
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{hint}; valid keys at {'.'.join(parent) or 'the top level'}: {', '.join(valid)}"


def error_lines(exc: ValidationError, data: Mapping[str, Any] | None) -> list[str]:
    """One line per problem in ``exc``, raised validating the raw config ``data``."""
    lines: list[str] = []
    for err in exc.errors(include_url=False):
        loc = list(err["loc"])
        # The discriminated algo union puts the tag in the location: algo.dqn.lr.
        if len(loc) > 1 and loc[0] == "algo" and loc[1] in ALGO_CONFIGS:
            del loc[1]
        path, kind, value = _dotted(loc), err["type"], err.get("input")
        if kind == PROBLEM:  # raised by the schema's validators, already names its fields
            lines.extend(err["msg"].splitlines())
        elif kind == "extra_forbidden":
            hint = unknown_key_text([str(p) for p in loc[:-1]], str(loc[-1]), data)
            lines.append(f"{path}={_show(value)}: unknown key{hint}")
        elif kind == "missing":
            lines.append(f"{path}: required but missing; add it to the config")
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            lines.append(f"{path}={_show(value)}: must be a section (a mapping of keys)")
        else:
            lines.append(f"{path}={_show(value)}: {err['msg'].removeprefix('Value error, ')}")
    return lines
