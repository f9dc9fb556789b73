"""Ape-X's initial priorities, computed by the actor that makes the transitions (Horgan et al.
2018): |R + discount * max_a Q(s', a) - Q(s, a)| with the actor's own Q-network, from the
Q-values it computed to act anyway, so a transition reaches the replay with a priority of its
own rather than the largest one seen.

An n-step transition leaves the actor's window at step t + n - 1 (:class:`NStepWindow`), when
Q(s_t, a_t) is known but max_a Q(s_{t+n}, a) is not yet: it comes with the next step's
inference, so the transition's priority is completed then (or, at a flush, by one more
inference on the current observations). A transition whose episode ended inside the window
gets no bootstrap term: exact when the episode terminated (discount 0), left without the
final observation's value when it was truncated.
"""

from __future__ import annotations

import numpy as np


class ActorPriorities:
    def __init__(self, n_step: int, num_envs: int):
        self.n = n_step
        self._q_taken = np.zeros((n_step, num_envs), np.float32)  # Q(s, a) of the window's steps
        self._ended = np.zeros((n_step, num_envs), bool)
        self._steps = 0
        self._pending: tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def record(self, q_taken: np.ndarray, dones: np.ndarray) -> None:
        """One vector step: Q(s, a) of the actions taken, and which envs' episodes ended."""
        i = self._steps % self.n
        self._q_taken[i], self._ended[i] = q_taken, dones
        self._steps += 1

    def emitted(self, out: dict[str, np.ndarray], priorities: np.ndarray, start: int) -> None:
        """The window just emitted ``out`` (one transition per env), stored at
        ``priorities[start:]``: set what is known now, keep the rest for :meth:`complete`."""
        q = self._q_taken[self._steps % self.n].copy()  # the window's oldest step
        ended = self._ended.any(axis=0)
        rewards, discounts = out["rewards"], out["discounts"]
        priorities[start : start + len(q)] = np.abs(rewards - q)
        self._pending = (start, rewards.copy(), discounts.copy(), q, np.flatnonzero(~ended))

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def complete(self, priorities: np.ndarray, next_values: np.ndarray) -> None:
        """Add the bootstrap term to the transitions emitted last: ``next_values`` is
        max_a Q(s, a) of every env's current observation."""
        if self._pending is None:
            return
        start, rewards, discounts, q, rows = self._pending
        priorities[start + rows] = np.abs(rewards[rows] + discounts[rows] * next_values[rows] - q[rows])
        self._pending = None
