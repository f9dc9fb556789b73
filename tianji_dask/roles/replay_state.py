"""A replay memory's contents as plain arrays: kept in the driver beside its group's learner
snapshot, and put into the new buffer when the old one is lost with its worker.

A replay memory is one or two rings (:class:`Ring`): a ring of ``capacity`` rows, filled by
``total`` row writes so far, write ``t`` at row ``t % capacity``. Its state is

* the rows of each ring: the filled part only (rows ``0 .. min(total, capacity) - 1``, in ring
  order), or, asked for what changed since an earlier state (:class:`ReplayMark`: the memory's
  ``token`` and each ring's ``total`` then), only the rows written since, in write order: a few
  seconds of new transitions instead of the whole memory;
* ``values``, sent whole every time: counters and whatever changes anywhere in the memory
  (a prioritized replay's priorities).

:func:`merged` applies such a delta to the full state it was taken against. Every memory has a
``token`` of its own, which a restored memory takes over from the state it was restored from
(its contents are that state's): a mark of another memory's token gets the full state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Ring:
    """Rows of one ring. ``since is None``: ``arrays`` hold every filled row, in ring order.
    Otherwise the rows that writes ``since .. total - 1`` wrote, in that order (a delta)."""

    capacity: int
    total: int
    since: int | None
    arrays: dict[str, np.ndarray]

    @property
    def rows(self) -> int:
        """Rows the ring holds (once merged, for a delta)."""
        return min(self.total, self.capacity)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


@dataclass(frozen=True)
class ReplayMark:
    """What the driver holds of a memory: its token and each ring's ``total``."""

    token: str
    totals: dict[str, int]


@dataclass
class ReplayState:
    """``kind``: which memory made it (``uniform``, ``frames``, ``prioritized-...``), checked on
    restore; ``rings`` by name; ``values``: the rest, always whole."""

    kind: str
    token: str
    rings: dict[str, Ring]
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def full(self) -> bool:
        return all(r.since is None for r in self.rings.values())

    @property
    def transitions(self) -> int:
        """Transitions held (of the full state)."""
        return self.rings["transitions"].rows

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays it carries (a delta's: only the rows written since)."""
        values = sum(v.nbytes for v in self.values.values() if isinstance(v, np.ndarray))
        return sum(r.nbytes for r in self.rings.values()) + values

    def mark(self) -> ReplayMark:
        return ReplayMark(self.token, {name: r.total for name, r in self.rings.items()})


def rows_since(capacity: int, total: int, since: int | None) -> tuple[np.ndarray, int | None]:
    """The ring rows to copy and the ``since`` they answer: those written since ``since`` (in
    write order) if fewer than ``capacity`` writes came since, else every filled row and None."""
    if since is not None and 0 <= total - since < capacity:
        return (since + np.arange(total - since, dtype=np.int64)) % capacity, since
    return np.arange(min(total, capacity), dtype=np.int64), None


def take_ring(get: Callable[[np.ndarray], dict[str, np.ndarray]], capacity: int, total: int, since: int | None) -> Ring:
    """A ring's rows (:func:`rows_since`); ``get(rows)`` returns copies of them, field by field."""
    rows, answered = rows_since(capacity, total, since)
    return Ring(capacity, total, answered, get(rows))


def take_arrays(arrays: dict[str, np.ndarray], capacity: int, total: int, since: int | None) -> Ring:
    """:func:`take_ring` of numpy arrays indexed by ring row (one copy each: the indexing's)."""
    return take_ring(lambda rows: {k: a[rows] for k, a in arrays.items()}, capacity, total, since)


def mark_for(state_token: str, mark: ReplayMark | None, ring: str) -> int | None:
    """The ``since`` of ``ring`` that ``mark`` asks for, if it is a mark of this memory."""
    if mark is None or mark.token != state_token:
        return None
    return mark.totals.get(ring)


def merged(base: ReplayState, new: ReplayState) -> ReplayState:
    """``new`` applied to ``base`` (a full state): ``new`` itself if it is full, else ``base``'s
    rings with the delta's rows written in (in place where they are already full-sized) and
    ``new``'s values. Raises ValueError if ``new`` was not taken against ``base``."""
    if new.full:
        return new
    if not base.full or base.token != new.token or base.kind != new.kind or set(base.rings) != set(new.rings):
        raise ValueError("a replay delta applied to a state it was not taken against")
    rings = {}
    for name, ring in new.rings.items():
        old = base.rings[name]
        if ring.since is None:
            rings[name] = ring
            continue
        if ring.since != old.total or ring.capacity != old.capacity or set(ring.arrays) != set(old.arrays):
            raise ValueError(f"a replay delta of ring {name!r} applied to a state it was not taken against")
        n = ring.rows
        rows = (ring.since + np.arange(ring.total - ring.since, dtype=np.int64)) % ring.capacity
        arrays = {}
        for k, a in old.arrays.items():
            if len(a) < n:  # still filling: the ring grows by the rows written since
                grown = np.empty((n, *a.shape[1:]), a.dtype)
                grown[: len(a)] = a
                a = grown
            a[rows] = ring.arrays[k]
            arrays[k] = a
        rings[name] = Ring(ring.capacity, ring.total, None, arrays)
    return ReplayState(new.kind, new.token, rings, dict(new.values))


def put_ring(ring: Ring, put: Callable[[np.ndarray, dict[str, np.ndarray]], None], capacity: int) -> None:
    """Write a full ``ring``'s rows back: ``put(rows, arrays)``."""
    if ring.since is not None:
        raise ValueError("a replay delta cannot be restored on its own: merge it into its full state first")
    if ring.capacity != capacity:
        raise ValueError(f"replay state of a ring of {ring.capacity} rows restored into one of {capacity}")
    put(np.arange(ring.rows, dtype=np.int64), ring.arrays)
