"""Seeds for every host and env, all derived from the one root seed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RoleSeeds:
    actors: list[int]
    buffer: int
    learner: int


def role_seeds(root: int, n_actors: int) -> RoleSeeds:
    """Independent 32-bit seeds via ``SeedSequence.spawn``; actor i's envs use ``actors[i] + k``."""
    children = np.random.SeedSequence(root).spawn(n_actors + 2)
    as_int = [int(c.generate_state(1)[0]) for c in children]
    return RoleSeeds(actors=as_int[:n_actors], buffer=as_int[n_actors], learner=as_int[n_actors + 1])
