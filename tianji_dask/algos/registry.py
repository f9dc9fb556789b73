"""``algo.name`` -> the algorithm's spec (:class:`~tianji_dask.algos.spec.AlgorithmSpec`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tianji_dask.algos.dqn.spec import DQNSpec
from tianji_dask.algos.ppo.spec import PPOSpec
from tianji_dask.algos.spec import AlgorithmSpec

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig

ALGORITHMS: dict[str, AlgorithmSpec] = {
    "dqn": DQNSpec(),
    "ppo": PPOSpec(),
}


def spec_for(cfg: ExperimentConfig) -> AlgorithmSpec:
    """The spec of ``cfg.algo.name`` (the config schema only admits registered names)."""
    return ALGORITHMS[cfg.algo.name]
