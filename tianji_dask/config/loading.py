"""Reading an experiment config: YAML files, ``--set`` overrides, validation, machine checks.

:func:`load_config` is the whole path (file, overrides, schema, this machine); the steps are
public for callers that hold a dict already (:func:`apply_overrides`, :func:`validate_config`).
Every failure is a :class:`~tianji_dask.config.errors.ConfigError`: pydantic's
``ValidationError`` and YAML tracebacks never escape.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tianji_dask.config import machine
from tianji_dask.config.errors import ConfigError, error_lines, unknown_key_text
from tianji_dask.config.schema import ExperimentConfig, section_model

OVERRIDE_FORM = "--set key.path=value (for example --set algo.lr=1e-3)"


class _YamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that reads ``1e-3`` as a float and rejects duplicate keys.

    PyYAML follows YAML 1.1, where ``1e-3`` (no dot) is the *string* "1e-3"; and it keeps the last
    of two equal keys silently. Both are config footguns.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *base" may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable key: SafeLoader reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first on line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_YamlLoader)


def _yaml_error_text(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return f"{where}{problem}" + (f" ({context})" if context else "")


_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``"algo.lr=1e-3"`` into ``(["algo", "lr"], 0.001)``.

    The value is read as YAML (``null``, ``true``, ``[64, 64]``, ``{id: Acrobot-v1}`` work;
    ``1e-3`` is a float). A missing ``=``, an empty key or an empty path component raises
    :class:`ConfigError` showing the expected form ``--set key.path=value``.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep:
        raise ConfigError(f"--set {text!r}: no '=' found; expected {OVERRIDE_FORM}")
    if not key:
        raise ConfigError(f"--set {text!r}: empty key before '='; expected {OVERRIDE_FORM}")
    path = key.split(".")
    for part in path:
        if not part:
            raise ConfigError(f"--set {text!r}: empty component in key {key!r}; expected {OVERRIDE_FORM}")
        if not _KEY_RE.fullmatch(part):
            raise ConfigError(
                f"--set {text!r}: {part!r} is not a valid key name (letters, digits, _); expected {OVERRIDE_FORM}"
            )
    try:
        value = _yaml_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"--set {text!r}: the value {raw!r} is not valid YAML ({_yaml_error_text(exc)}); "
            f"quote strings and lists in the shell, e.g. --set 'algo.hidden_sizes=[64, 64]'"
        ) from None
    return path, value


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str | tuple[Sequence[str], Any]]) -> dict[str, Any]:
    """Return a copy of ``data`` with each override set, in order (later ones win).

    Each override is a ``"key.path=value"`` string (see :func:`parse_override`) or a parsed
    ``(path, value)`` pair. Keys are checked against the schema, not against ``data``, so a key
    the file leaves at its default can be set; an unknown key raises :class:`ConfigError` listing
    the valid keys at that level. Setting ``algo.name`` is allowed and selects the schema that
    later ``algo.*`` keys are checked against (the section's other keys are kept as they are).
    A whole section can be set at once: ``--set 'env={id: Acrobot-v1, num_envs: 4}'``.
    Values are not validated here; :func:`validate_config` does that.
    """
    result: dict[str, Any] = copy.deepcopy(dict(data))
    for item in overrides:
        if isinstance(item, str):
            path, value = parse_override(item)
            shown = f"--set {item}"
        else:
            path, value = list(item[0]), item[1]
            shown = f"--set {'.'.join(path)}={value!r}"
        node = result
        for depth, key in enumerate(path):
            parent, here = path[:depth], ".".join(path[: depth + 1])
            model = section_model(parent, result)
            if model is not None and key not in model.model_fields:
                given = (value,) if depth == len(path) - 1 else ()  # the value of a key, not of a section
                raise ConfigError(f"{shown}: unknown key {here!r}{unknown_key_text(parent, key, result, *given)}")
            if depth == len(path) - 1:
                node[key] = copy.deepcopy(value)
                break
            # model None: below an unknown algo name, where keys cannot be checked (validate_config
            # reports the name); "algo" itself is a section whatever its name.
            leaf = section_model(path[: depth + 1], result) is None
            if model is not None and here != "algo" and leaf:
                raise ConfigError(f"{shown}: {here} is a value, not a section; set it whole, e.g. --set {here}=<value>")
            if node.get(key) is None:  # an absent or empty (``stop:``) section
                node[key] = {}
            if not isinstance(node[key], dict):
                raise ConfigError(
                    f"{shown}: {here}={node[key]!r} in the config is not a section of keys; "
                    f"fix the file or set the section whole"
                )
            node = node[key]
    return result


def validate_config(data: Mapping[str, Any], source: str | None = None) -> ExperimentConfig:
    """Validate a raw config mapping into an :class:`ExperimentConfig`.

    Raises :class:`ConfigError` listing every problem found, one line each; ``source`` (e.g. the
    file name) goes into the header line. Does not build the env (see
    :func:`~tianji_dask.config.machine.check_env`).
    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"the top level of the config must be a mapping of sections "
            f"({', '.join(ExperimentConfig.model_fields)}), got {type(data).__name__}",
            header=f"invalid config {source}:" if source else None,
        )
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        lines = error_lines(exc, data)
        noun = "problem" if len(lines) == 1 else "problems"
        where = f" {source}" if source else ""
        raise ConfigError(lines, header=f"invalid config{where} ({len(lines)} {noun}):") from None


def default_config_path() -> Path:
    """The packaged default config (CartPole DQN), a copy of ``configs/cartpole_dqn.yaml``."""
    return Path(__file__).parents[1] / "defaults" / "cartpole_dqn.yaml"


def _not_a_config_file(path: Path) -> str:
    """Why ``path`` (a directory, or nothing) is not a config, and the configs it may have meant."""
    if path.is_dir():
        if (path / "config.yaml").is_file() and (path / "metrics.nc").is_file():
            return (
                f"{path} is a run directory, not a config file; to continue the run: "
                f"tianji-dask train --resume {path}; to start a new one from its config: {path / 'config.yaml'}"
            )
        near = _configs_in(path)
        listed = f"give one of its configs: {', '.join(map(str, near))}" if near else "give a CONFIG.yaml file"
        return f"{path} is a directory, not a config file; {listed}"
    where = path.parent if path.parent.is_dir() else Path("configs")
    near = _configs_in(where)
    if not near:
        return (
            f"config file not found: {path} (resolved to {path.absolute()}); the packaged default is "
            f"{default_config_path()}"
        )
    stems = [p.stem for p in near]
    meant = [p for p in near if p.stem.startswith(path.stem)] or [
        near[stems.index(s)] for s in difflib.get_close_matches(path.stem, stems, n=1, cutoff=0.5)
    ]
    listed = ", ".join(map(str, near))
    if meant:
        return f"{path} is not a config file (no such file); did you mean {meant[0]}? (configs: {listed})"
    return f"{path} is not a config file (no such file); give one of the configs: {listed}"


def _configs_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.y*ml") if p.suffix in (".yaml", ".yml") and p.is_file())


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into a dict; every failure is a :class:`ConfigError`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(_not_a_config_file(path))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    try:
        data = _yaml_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML at {_yaml_error_text(exc)}") from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else "a list" if isinstance(data, list) else f"the single value {data!r}"
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections "
            f"({', '.join(ExperimentConfig.model_fields)}), got {got}"
        )
    return data


def load_config(
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    check_env: bool = True,
    check_device: bool = True,
) -> ExperimentConfig:
    """Read a YAML config, apply ``--set`` overrides, validate, and check it against this machine.

    Steps: :func:`read_config_file`, :func:`apply_overrides`, :func:`validate_config`, then
    (unless switched off) :func:`~tianji_dask.config.machine.check_env` (builds the env once) and
    :func:`~tianji_dask.config.machine.check_device`.
    Raises :class:`ConfigError` for any problem; nothing else escapes for bad input.
    """
    data = apply_overrides(read_config_file(path), overrides)
    source = str(path) + "".join(f" --set {o}" for o in overrides)
    config = validate_config(data, source=source)
    if check_env:
        machine.check_env(config)
    if check_device:
        machine.check_device(config)
    return config
