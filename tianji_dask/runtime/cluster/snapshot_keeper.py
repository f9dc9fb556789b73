"""What a rebuilt group continues from, kept in the driver's memory: each group's newest learner
state and each buffer's replay (up to ``run.replay_snapshot_mb``)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tianji_dask.algos.registry import spec_for
from tianji_dask.roles.replay_state import ReplayState, merged

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig
    from tianji_dask.runtime.cluster.run_hosts import RunHosts

SNAPSHOT_TIMEOUT_S = 30.0

logger = logging.getLogger("tianji_dask.snapshots")


class SnapshotKeeper:
    """Asks the learners for snapshots (:meth:`take`) and keeps them as they arrive
    (:meth:`collect`), for the groups :class:`~tianji_dask.runtime.cluster.recovery.Recovery` rebuilds."""

    def __init__(self, cfg: ExperimentConfig, hosts: RunHosts, on_event: Callable[[str], None]):
        self.cfg = cfg
        self._hosts = hosts
        self._on_event = on_event
        self.learners: dict[int, tuple[bytes, dict]] = {}  # group -> its lead learner's (packed state, meta)
        # buffer id -> its replay's newest full state, and the buffer's incarnation it came from
        self.replays: dict[int, tuple[ReplayState, int]] = {}
        # (group, learner id) -> the snapshot asked for and not yet kept, and its buffer's incarnation
        self._pending: dict[tuple[int, int], tuple[Any, int]] = {}
        self._asked = 0.0
        self._too_big: set[int] = set()  # buffers whose replay outgrew run.replay_snapshot_mb (said once)

    def take(self) -> None:
        """Ask each group's learners for their newest state, and with it each buffer's replay (up
        to ``run.replay_snapshot_mb``; after the first copy a buffer sends only what it added
        since: :mod:`~tianji_dask.roles.replay_state`). Returns at once: :meth:`collect` keeps
        them as they arrive, so that a learner that cannot answer (a data-parallel rank stuck in
        a collective with a lost peer) does not hold up the supervision of the run. No new
        request while one is pending."""
        if self._pending:
            return
        hosts, t = self._hosts, self.cfg.topology
        max_bytes = int(self.cfg.run.replay_snapshot_mb * 1e6)
        with_replay = max_bytes > 0 and spec_for(self.cfg).keeps_replay
        for group in range(t.groups):
            for rank in range(t.learners):
                lid = group * t.learners + rank
                if rank > 0 and not with_replay:
                    continue  # only the lead's learner state is kept
                kept = self.replays.get(lid)
                replay = (kept[0].mark() if kept else None, max_bytes) if with_replay else None
                with contextlib.suppress(Exception):  # its worker was just lost: Recovery.recover comes next
                    self._pending[(group, lid)] = (
                        hosts.handles[("learner", lid)].group_snapshot(rank == 0, replay),
                        hosts.incarnations[("buffer", lid)],
                    )
        self._asked = time.monotonic()

    def collect(self) -> None:
        """Keep the snapshots that have arrived; never waits. One that has not come within
        ``SNAPSHOT_TIMEOUT_S`` is given up, and the older one stays."""
        expired = time.monotonic() - self._asked > SNAPSHOT_TIMEOUT_S
        max_bytes = int(self.cfg.run.replay_snapshot_mb * 1e6)
        for (group, lid), (fut, incarnation) in list(self._pending.items()):
            if not fut.done() and not expired:
                continue
            del self._pending[(group, lid)]
            if not fut.done():
                self._on_event(
                    f"learner snapshot of group {group}: none within {SNAPSHOT_TIMEOUT_S:g} s; the older one stays"
                )
                continue
            try:
                got = fut.result(timeout=SNAPSHOT_TIMEOUT_S)  # done: at once
            except Exception as exc:  # noqa: BLE001 - the run goes on; the older snapshot stays
                self._on_event(f"learner snapshot of group {group} failed: {exc!r}; the older one stays")
                continue
            if got["learner"] is not None:
                first = int(self.learners.get(group, ({}, {}))[1].get("updates", 0)) == 0
                self.learners[group] = got["learner"]
                updates = int(got["learner"][1].get("updates", 0))
                if first and updates > 0:  # the run's own bookkeeping, not news for its user
                    logger.debug("group %d: first learner snapshot kept, at update %d", group, updates)
            self._keep_replay(lid, got["replay"], got["replay_bytes"], incarnation, max_bytes)

    def forget_pending(self, group: int) -> None:
        """A group about to be rebuilt: what its old hosts may still send is not kept."""
        for key in [k for k in self._pending if k[0] == group]:
            del self._pending[key]

    def _keep_replay(self, lid: int, state: ReplayState | None, nbytes: int, incarnation: int, max_bytes: int) -> None:
        if state is None:
            if nbytes > max_bytes and lid not in self._too_big:
                self._too_big.add(lid)
                self._on_event(
                    f"replay of buffer {lid} holds {nbytes / 1e6:,.0f} MB, more than run.replay_snapshot_mb="
                    f"{self.cfg.run.replay_snapshot_mb:g}: no longer kept; if its worker is lost, its "
                    "re-created buffer starts empty"
                )
            if nbytes > max_bytes:
                self.replays.pop(lid, None)
            return
        kept = self.replays.get(lid)
        try:
            state = merged(kept[0], state) if kept is not None else state
        except ValueError as exc:  # not taken against what is kept: the next copy is a full one
            self._on_event(f"replay snapshot of buffer {lid}: {exc}; taking a full copy next time")
            self.replays.pop(lid, None)
            return
        if not state.full:
            self.replays.pop(lid, None)
            return
        self.replays[lid] = (state, incarnation)
