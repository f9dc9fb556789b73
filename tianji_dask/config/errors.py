"""Config errors a user can act on: :class:`ConfigError`, and pydantic's errors as its lines.

Each line names the dotted field, the value given and what is allowed (or the fix); an unknown
key gets the closest valid one and the list of valid keys at its level.
"""

from __future__ import annotations

import difflib
import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from tianji_dask.config.schema import ALGO_CONFIGS, PROBLEM, ExperimentConfig, section_model


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


# Names that stable-baselines3, CleanRL or RLlib give to settings this schema calls otherwise, as
# dotted keys here. An unknown key that is one of them is refused with its name here, never taken
# for it: one meaning per word. Only same-meaning names: SB3's PPO batch_size (a minibatch's size)
# is not algo.minibatches (their count), so it has none.
ALIASES: dict[str, str] = {
    "learning_rate": "algo.lr",  # SB3, CleanRL
    "discount": "algo.gamma",
    "net_arch": "algo.hidden_sizes",  # SB3's policy_kwargs
    "train_frequency": "algo.train_freq",  # CleanRL
    "target_network_frequency": "algo.target_update_interval",  # CleanRL
    "target_network_update_freq": "algo.target_update_interval",  # RLlib
    "num_steps_sampled_before_learning_starts": "algo.learning_starts",  # RLlib
    "start_e": "algo.exploration_initial_eps",  # CleanRL
    "end_e": "algo.exploration_final_eps",  # CleanRL
    "n_steps": "algo.rollout_steps",  # SB3's PPO: env steps per env in one rollout
    "num_steps": "algo.rollout_steps",  # CleanRL's PPO
    "n_epochs": "algo.epochs",  # SB3
    "update_epochs": "algo.epochs",  # CleanRL
    "num_epochs": "algo.epochs",  # RLlib
    "num_sgd_iter": "algo.epochs",  # RLlib (old API)
    "num_minibatches": "algo.minibatches",  # CleanRL
    "clip_range": "algo.clip_coef",  # SB3
    "clip_param": "algo.clip_coef",  # RLlib
    "entropy_coeff": "algo.ent_coef",  # RLlib
    "vf_loss_coeff": "algo.vf_coef",  # RLlib
    "grad_clip": "algo.max_grad_norm",  # RLlib
    "lambda": "algo.gae_lambda",  # RLlib
    "normalize_advantage": "algo.normalize_advantages",  # SB3
    "norm_adv": "algo.normalize_advantages",  # CleanRL
    "total_timesteps": "stop.max_env_steps",  # SB3, CleanRL
    "env_id": "env.id",  # CleanRL
}
_NO_VALUE = object()


def _has_key(dotted: str, data: Mapping[str, Any] | None) -> bool:
    """Whether the schema (with ``data``'s algo) has the dotted key."""
    *parent, leaf = dotted.split(".")
    model = section_model(parent, data)
    return model is not None and leaf in model.model_fields


def _set_value(value: Any) -> str:
    """``value`` as ``--set`` reads it back (YAML)."""
    if value is _NO_VALUE:
        return "..."
    if isinstance(value, str):
        return value
    return _show(value) if value is None or isinstance(value, bool) else json.dumps(value)


def _named_here(parent: Sequence[str], key: str, data: Mapping[str, Any] | None, value: Any) -> str | None:
    """What ``key`` (unknown under ``parent``) is called here, where it is another library's name
    for a key (:data:`ALIASES`) or a key of another section (CleanRL's flat ``gamma``)."""
    at = ".".join(parent)
    target = ALIASES.get(key)
    if target is None:
        here = [f"{s}.{key}" for s in ExperimentConfig.model_fields if _has_key(f"{s}.{key}", data)]
        target = here[0] if len(here) == 1 and here[0] != f"{at}.{key}" else None
        if target is None:
            return None
        said = f"{key!r} goes under {target.rpartition('.')[0]} here"
    elif not _has_key(target, data):
        return None
    else:
        name = target.removeprefix(f"{at}.") if at else target
        said = f"{key!r} is called {name!r} here"
    setting = f"{target}={_set_value(value)}"
    return f"{said}: --set {shlex.quote(setting) if ' ' in setting else setting}"


def unknown_key_text(parent: Sequence[str], key: str, data: Mapping[str, Any] | None, value: Any = _NO_VALUE) -> str:
    """' (did you mean ...?); valid keys at <parent>: ...' for an unknown key under parent;
    another library's name for a key says the name here instead (:data:`ALIASES`)."""
    model = section_model(parent, data)
    if model is None:
        return ""
    valid = list(model.model_fields)
    named = _named_here(parent, key, data, value)
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" ({named})" if named else f" (did you mean {close[0]!r}?)" if close else ""
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
            hint = unknown_key_text([str(p) for p in loc[:-1]], str(loc[-1]), data, value)
            lines.append(f"{path}={_show(value)}: unknown key{hint}")
        elif kind == "missing":
            lines.append(f"{path}: required but missing; add it to the config")
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            lines.append(f"{path}={_show(value)}: must be a section (a mapping of keys)")
        else:
            lines.append(f"{path}={_show(value)}: {err['msg'].removeprefix('Value error, ')}")
    return lines
