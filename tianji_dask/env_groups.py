"""An actor's envs in groups, each group stepping while the policy chooses the next one's actions.

ale-py's vector env steps in two calls: ``send(actions)`` starts its emulator threads and
``recv()`` waits for them. An actor of N envs in G groups chooses group 1's actions and sends
them, chooses group 2's while group 1 steps, and so on, then receives every group: the
emulators no longer stand idle while the policy runs. Group g holds the actor's envs
``[g N/G, (g+1) N/G)``, seeded as those envs of one vector env of N are, so the same actions
give the same observations whatever G. Vector envs without ``send``/``recv`` (gymnasium's
``SyncVectorEnv``) step in each group's turn, without overlap. With one group it is the vector
env itself, stepped as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import gymnasium as gym
import numpy as np

StepResult = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]
Choice = tuple[np.ndarray, ...]  # (actions, anything else chosen with them, e.g. log-probs, values)


class SendRecv(Protocol):
    """A vector env that steps in two calls, as ale-py's ``AtariVectorEnv``."""

    def send(self, actions: np.ndarray) -> None: ...

    def recv(self) -> StepResult: ...


def _filler(ref: Any, n: int) -> Any:
    """What a group whose infos lack a key contributes: nothing happened to its ``n`` envs."""
    if isinstance(ref, dict):
        return {k: _filler(v, n) for k, v in ref.items()}
    ref = np.asarray(ref)
    if ref.dtype == object:
        return np.full(n, None, dtype=object)
    return np.zeros((n, *ref.shape[1:]), dtype=ref.dtype)


def merge_infos(parts: Sequence[dict[str, Any]], sizes: Sequence[int]) -> dict[str, Any]:
    """One vector info dict of the groups' infos, each key's arrays in group order. A key that
    only some groups report (``final_obs`` when an episode ended there) gets zeros, ``None`` or
    ``False`` for the other groups' envs; ``env_id`` is renumbered to the actor's env indices."""
    keys = list(dict.fromkeys(k for p in parts for k in p))
    out: dict[str, Any] = {}
    for k in keys:
        ref = next(p[k] for p in parts if k in p)
        values = [p[k] if k in p else _filler(ref, n) for p, n in zip(parts, sizes)]
        if isinstance(ref, dict):
            out[k] = merge_infos(values, sizes)
        else:
            arrays = [np.asarray(v) for v in values]
            if k == "env_id":
                arrays = [a + start for a, start in zip(arrays, np.cumsum([0, *sizes[:-1]]))]
            out[k] = np.concatenate(arrays)
    return out


class EnvGroups:
    """``num_envs`` envs as vector envs of equal size: ``reset``, ``step`` and ``close`` as one
    vector env, and :meth:`step_with`, which interleaves choosing and stepping."""

    def __init__(self, envs: Sequence[gym.vector.VectorEnv]):
        if not envs or len({e.num_envs for e in envs}) != 1:
            raise ValueError(f"env groups must be vector envs of one size, got sizes {[e.num_envs for e in envs]}")
        self.envs = list(envs)
        self.group_size = envs[0].num_envs
        self.num_envs = self.group_size * len(envs)
        self.single_observation_space = envs[0].single_observation_space
        self.single_action_space = envs[0].single_action_space
        self._split = hasattr(envs[0], "send") and hasattr(envs[0], "recv") and len(envs) > 1

    def _slice(self, g: int) -> slice:
        return slice(g * self.group_size, (g + 1) * self.group_size)

    def reset(self, *, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        parts = [
            env.reset(seed=None if seed is None else seed + g * self.group_size) for g, env in enumerate(self.envs)
        ]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate([p[0] for p in parts]), merge_infos([p[1] for p in parts], [self.group_size] * len(parts))

    def step(self, actions: np.ndarray) -> StepResult:
        return self.step_with(lambda g, obs: (actions[self._slice(g)],), None)[1]

    def step_with(
        self, choose: Callable[[int, np.ndarray | None], Choice], obs: np.ndarray | None
    ) -> tuple[Choice, StepResult]:
        """``choose(g, obs[group g])`` -> ``(actions, *more)`` for each group in turn, each group
        sent to its emulators as soon as its actions are chosen; returns every group's choices
        and step results, concatenated in env order."""
        if len(self.envs) == 1:
            choice = choose(0, obs)
            return choice, self.envs[0].step(choice[0])
        choices: list[Choice] = []
        results: list[StepResult] = []
        for g, env in enumerate(self.envs):
            choice = choose(g, None if obs is None else obs[self._slice(g)])
            choices.append(choice)
            if self._split:
                cast(SendRecv, env).send(choice[0])
            else:
                results.append(env.step(choice[0]))
        if self._split:
            results = [cast(SendRecv, env).recv() for env in self.envs]
        merged_choice = tuple(np.concatenate(parts) for parts in zip(*choices))
        sizes = [self.group_size] * len(self.envs)
        merged = (
            np.concatenate([r[0] for r in results]),
            np.concatenate([r[1] for r in results]),
            np.concatenate([r[2] for r in results]),
            np.concatenate([r[3] for r in results]),
            merge_infos([r[4] for r in results], sizes),
        )
        return merged_choice, merged

    def close(self) -> None:
        for env in self.envs:
            env.close()
