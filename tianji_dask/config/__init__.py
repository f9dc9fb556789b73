"""Typed, validated experiment config: one pydantic model per concern, loaded from YAML.

An experiment is described by one YAML file (``configs/cartpole_dqn.yaml`` is the reference)
plus ``--set key.path=value`` overrides from the command line::

    config = load_config("configs/cartpole_dqn.yaml", ["algo.lr=1e-3", "topology.actors=4"])
    config.algo.target_replay_ratio        # derived values are properties
    text = config.model_dump_yaml()        # the resolved config; load_config reads it back

Every problem is reported as a :class:`ConfigError` whose message is ready for a user: one line
per problem, naming the dotted field, the value given and what is allowed.

The modules, each with one job:

* :mod:`~tianji_dask.config.schema`: the models (types, ranges, cross-field arithmetic); fast
  and machine-independent, so a config saved in a run directory always reloads;
* :mod:`~tianji_dask.config.errors`: :class:`ConfigError` and pydantic's errors as its lines;
* :mod:`~tianji_dask.config.loading`: YAML, ``--set`` overrides, :func:`load_config`;
* :mod:`~tianji_dask.config.machine`: checks against this machine (:func:`check_env` builds the
  env once, :func:`check_device` looks for the CUDA device); :func:`load_config` runs both by
  default and each can be switched off.

Deployment settings (where runs are written, timeouts, the dashboard address) are not
experiment settings: they live in the ``tianji`` namespace of the Dask config
(:mod:`tianji_dask.config.deployment`), Slurm resources in the user's ``jobqueue.yaml``.
"""

from tianji_dask.config.errors import ConfigError
from tianji_dask.config.loading import apply_overrides, load_config, validate_config
from tianji_dask.config.machine import check_device, check_env
from tianji_dask.config.schema import ExperimentConfig

__all__ = [
    "ConfigError",
    "ExperimentConfig",
    "apply_overrides",
    "check_device",
    "check_env",
    "load_config",
    "validate_config",
]
