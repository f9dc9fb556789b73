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


def incarnation_seed(seed: int, incarnation: int) -> int:
    """The seed of a host re-created for the ``incarnation``-th time (0: the first, ``seed``
    itself): a re-created actor must not replay its predecessor's episodes."""
    if incarnation == 0:
        return seed
    return int(np.random.SeedSequence([seed, incarnation]).generate_state(1)[0])


def group_seeds(root: int, group: int, n_actors: int) -> RoleSeeds:
    """Seeds of one training group. Group 0 gets :func:`role_seeds` of the root seed (the same
    as the serial reference); group g > 0 that of the g-th child of the root. All data-parallel
    learners of a group share its learner seed, so they start from identical parameters."""
    if group == 0:
        return role_seeds(root, n_actors)
    child = np.random.SeedSequence(root).spawn(group + 1)[group]
    return role_seeds(int(child.generate_state(1)[0]), n_actors)


def evaluation_seed(root: int) -> int:
    """The env and epsilon seed of every evaluation a run of root seed ``root`` makes while it
    trains: the same for all of them, so that they compare policies on the same episodes, and
    another than ``tianji-dask eval``'s own, so that a later evaluation plays other episodes."""
    return int(np.random.SeedSequence([root, 0xE7A1]).generate_state(1)[0])
