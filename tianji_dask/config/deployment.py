"""Deployment defaults: the ``tianji`` namespace of the Dask config, read and checked.

Where runs are written and how long the parts of a run wait for each other depend on the
machine or cluster, not on the experiment, so they are Dask settings, never experiment config.
Their defaults and meaning are in ``tianji_dask/tianji.yaml``; Dask's usual sources override
them (``~/.config/dask/*.yaml``, ``DASK_TIANJI__...`` environment variables, ``dask.config.set``).
Importing this module registers the defaults, as dask-jobqueue does for ``jobqueue``, and puts a
commented copy of the file in Dask's user config directory for reference.

Read the settings with :func:`deployment_settings`::

    settings = deployment_settings()   # ConfigError, naming key and value, when one is wrong
    settings.timeouts.data_parallel    # seconds, a float
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import dask.config
import yaml
from dask.utils import parse_timedelta
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from tianji_dask.config.errors import ConfigError

__all__ = ["DEFAULTS_FILE", "DeploymentSettings", "deployment_settings"]

DEFAULTS_FILE = Path(__file__).parents[1] / "tianji.yaml"
NAMESPACE = "tianji"


def _register_defaults() -> None:
    defaults = yaml.safe_load(DEFAULTS_FILE.read_text(encoding="utf-8"))
    dask.config.update_defaults(defaults)
    dask.config.ensure_file(source=str(DEFAULTS_FILE), comment=True)


_register_defaults()


def _seconds(value: Any) -> float:
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return float(parse_timedelta(value, default="seconds"))
        except (ValueError, KeyError):
            pass
    raise ValueError("must be a duration such as 30s, 2m (minutes) or 90 (seconds)")


Seconds = Annotated[float, BeforeValidator(_seconds), Field(gt=0)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalClusterSettings(_Section):
    dashboard_address: str
    cuda_mps: Literal["auto", "on", "off"]


class SchedulerSettings(_Section):
    connect_timeout: Seconds


class Timeouts(_Section):
    host_startup: Seconds
    first_params: Seconds
    data_parallel: Seconds
    slurm_workers: Seconds


class DeploymentSettings(_Section):
    """The ``tianji`` namespace, typed; ``tianji.yaml`` says what each setting does."""

    runs_dir: Path
    local_cluster: LocalClusterSettings
    scheduler: SchedulerSettings
    timeouts: Timeouts


def deployment_settings() -> DeploymentSettings:
    """The ``tianji`` namespace of this process's Dask config, checked.

    Raises :class:`~tianji_dask.config.ConfigError` with one line per wrong, unknown or missing
    key, each naming the key, the value and the environment variable that would set it.
    """
    raw = dask.config.get(NAMESPACE)
    try:
        return DeploymentSettings.model_validate(_underscored(raw))
    except ValidationError as exc:
        lines = [_error_line(err) for err in exc.errors(include_url=False)]
        raise ConfigError(
            lines,
            header=f"invalid Dask config, {NAMESPACE} namespace (the defaults and what they mean: {DEFAULTS_FILE}):",
        ) from None


def _underscored(value: Any) -> Any:
    """Keys as the model's field names: Dask treats ``runs-dir`` and ``runs_dir`` as one key."""
    if isinstance(value, Mapping):
        return {str(k).replace("-", "_"): _underscored(v) for k, v in value.items()}
    return value


def _error_line(err: Any) -> str:
    loc = [str(part) for part in err["loc"]]
    key = ".".join([NAMESPACE, *loc]).replace("_", "-")
    variable = "DASK_" + "__".join(part.upper().replace("-", "_") for part in key.split("."))
    if err["type"] == "missing":
        return f"{key}: missing ({variable}); a section set whole must hold all of its keys"
    if err["type"] == "extra_forbidden":
        return f"{key}: unknown key{_closest_key(loc)} ({variable})"
    message = err["msg"].removeprefix("Value error, ")
    return f"{key}={err.get('input')!r}: {message} ({variable})"


def _closest_key(loc: list[str]) -> str:
    model: type[BaseModel] = DeploymentSettings
    for part in loc[:-1]:
        field = model.model_fields.get(part)
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return ""
        model = field.annotation
    valid = [name.replace("_", "-") for name in model.model_fields]
    close = difflib.get_close_matches(loc[-1].replace("_", "-"), valid, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f"; valid keys here: {', '.join(valid)}"
