"""``algo.name`` -> the algorithm's spec (:class:`~tianji_dask.algos.spec.AlgorithmSpec`).

The names are the specs' own, and the config schema's ``AlgoConfig`` union holds a section of the
same name for each (``tests/test_algorithm_specs.py`` holds the two lists equal)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tianji_dask.algos.dqn.spec import DQNSpec
from tianji_dask.algos.ppo.spec import PPOSpec
from tianji_dask.algos.spec import AlgorithmSpec

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig

ALGORITHMS: dict[str, AlgorithmSpec] = {spec.name: spec for spec in (DQNSpec(), PPOSpec())}


def spec_for(cfg: ExperimentConfig) -> AlgorithmSpec:
    """The spec of ``cfg.algo.name`` (the config schema only admits registered names)."""
    return ALGORITHMS[cfg.algo.name]
