"""Re-creating the hosts of lost workers, as the restart policy admits, and counting what was
lost with them.

Re-creating follows what was lost:

- an **actor** alone: a new actor host on the replacement worker, with a new seed and its
  predecessors' env steps (its exploration schedule and its share of production go on); its
  group's lead learner moves the parameter subscriber there and sends the latest version;
- a **buffer or learner** (they share a worker): the whole group is rebuilt, its surviving hosts
  stopped first: buffers, actors and learners on the plan's workers (the lost one replaced), the
  learners restored from the group's newest state in the driver's memory, each buffer with the
  replay kept there beside it (up to ``run.replay_snapshot_mb``; without one it starts empty),
  data-parallel ranks with a new rendezvous, the other groups' gossip moved to the new lead.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tianji_dask.config.deployment import deployment_settings
from tianji_dask.errors import HostLost
from tianji_dask.runtime.cluster.host_stopping import stop_group
from tianji_dask.runtime.cluster.restarts import (
    Key,
    LostWorker,
    RestartPolicy,
    first_line,
    lost_with,
    replay_lost,
)
from tianji_dask.runtime.cluster.workers import scheduler_workers

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig
    from tianji_dask.roles.replay_state import ReplayState
    from tianji_dask.runtime.cluster.host_builder import HostBuilder
    from tianji_dask.runtime.cluster.run_hosts import RunHosts
    from tianji_dask.runtime.cluster.snapshot_keeper import SnapshotKeeper
    from tianji_dask.runtime.cluster.supervisor import Supervisor

RANK_RESTART_S = 10.0
RECREATE_TRIES = 3  # a re-creation that failed while its workers are all still there is tried again


class Recovery:
    """Builds the run's hosts despite workers lost meanwhile (:meth:`build_all`) and re-creates
    those of the workers the :class:`~tianji_dask.runtime.cluster.supervisor.Supervisor` found lost
    (:meth:`recover`), the groups from what the
    :class:`~tianji_dask.runtime.cluster.snapshot_keeper.SnapshotKeeper` kept."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        builder: HostBuilder,
        supervisor: Supervisor,
        snapshots: SnapshotKeeper,
        *,
        hurry: threading.Event,
    ):
        self.cfg = cfg
        self.hosts: RunHosts = builder.hosts
        self._builder = builder
        self._supervisor = supervisor
        self._snapshots = snapshots
        self._on_event = self.hosts.on_event
        self._hurry = hurry
        self._policy = RestartPolicy(cfg.run.max_restarts, cfg.run.restart_window_s)
        self._startup_grace_s = deployment_settings().timeouts.host_startup

    def build_all(
        self, restore: bytes | None, prior: Callable[[Key, str], float], add_heartbeat: Callable[[dict], None]
    ) -> None:
        """:meth:`HostBuilder.build_all`; after a worker lost meanwhile, as the restart policy
        admits it: every host made so far is stopped and released, the lost worker's hosts move
        to the worker that takes its place, and all are built again (``add_heartbeat`` records
        the last heartbeats of the hosts stopped)."""
        hosts = self.hosts
        while True:
            try:
                self._builder.build_all(restore, prior)
                return
            except Exception as exc:
                lost = self._supervisor.lost_while_building(hosts.current_plan().host_workers())
                if not lost:
                    raise
                self._policy.admit(lost, time.time())  # too many: HostLost, the run fails
                what = f"{type(exc).__name__}: {first_line(exc)}" if not isinstance(exc, HostLost) else ""
                for group in range(self.cfg.topology.groups):
                    self._stop_group(group, add_heartbeat)
                for w in lost:
                    new = hosts.move_to_replacement(w.address, self._startup_grace_s)
                    self._on_event(
                        f"host lost while the hosts were created: {w.describe()}"
                        + (f" ({what})" if what else "")
                        + f"; re-creating them all, on {new} in its place"
                    )

    def recover(self, lost: list[LostWorker], totals: Callable[[str, int, str], float], add_heartbeat) -> dict:
        """Re-create the hosts of the lost workers (the module docstring says how); raises
        :class:`HostLost` when the restart policy does not admit it. ``totals(role, id,
        counter)``: a host's cumulative counter over its incarnations (the recorder's);
        ``add_heartbeat`` records the last heartbeats of hosts stopped for a rebuild. Returns the
        loss counts (``results.LOSS_KEYS``)."""
        hosts, last_heartbeat = self.hosts, self._supervisor.last_heartbeat
        self._policy.admit(lost, time.time())
        counts: collections.Counter[str] = collections.Counter()
        keys = [k for w in lost for k in w.hosts]
        for key in keys:
            if key[0] != "buffer":  # a buffer's loss is counted with its group's rebuild, below
                counts.update(lost_with(key[0], last_heartbeat(key).get("counters", {}), self.cfg.env.num_envs))
        groups = sorted({hosts.group_of(k) for k in keys if k[0] != "actor"})
        actors = sorted(k[1] for k in keys if k[0] == "actor" and hosts.group_of(k) not in groups)
        for w in lost:
            new = hosts.move_to_replacement(w.address, self._startup_grace_s)
            self._on_event(f"host lost: {w.describe()}; re-creating on {new}")

        def prior(key: Key, counter: str) -> float:
            return totals(key[0], key[1], counter)

        for group in groups:
            self._rebuild_group(group, keys, prior, add_heartbeat, counts)
        for actor_id in actors:
            counts["actor_restarts"] += 1
            self._unless_lost_again(
                f"actor {actor_id}",
                [("actor", actor_id)],
                functools.partial(self._builder.recreate_actor, actor_id, prior),
            )
        recreated = {k for g in groups for k in hosts.group_keys(g)} | {("actor", a) for a in actors}
        self._supervisor.hosts_recreated(recreated, hosts.current_plan().host_workers())
        return dict(counts)

    def _rebuild_group(
        self,
        group: int,
        lost_keys: list[Key],
        prior: Callable[[Key, str], float],
        add_heartbeat: Callable[[dict], None],
        counts: collections.Counter[str],
    ) -> None:
        """Stop what is left of ``group``, count what it lost and build it again: its learners
        from the newest snapshot, its buffers with the replay kept here."""
        t = self.cfg.topology
        self._snapshots.forget_pending(group)
        replays = self._stop_and_count(group, lost_keys, add_heartbeat, counts)
        if t.learners > 1:
            self._restart_surviving_ranks(group, self._startup_grace_s)
        restore = self._snapshots.learners.get(group)
        restored_updates = self._count_group_restarts(group, restore, counts)
        rebuilt = self._unless_lost_again(
            f"group {group}",
            self.hosts.group_keys(group),
            functools.partial(
                self._builder.build_group_again,
                group,
                restore[0] if restore is not None else None,
                prior,
                replays=replays,
            ),
            undo=functools.partial(self._stop_group, group, add_heartbeat),
        )
        if rebuilt:
            self._on_event(
                f"group {group}: its learner goes on from its snapshot at update {restored_updates:,}"
                if restore is not None
                else f"group {group}: its learner starts again from nothing (no snapshot was taken yet)"
            )
        if rebuilt and replays:
            restored = sum(r.transitions for r in replays.values())
            counts["restored_replay"] += restored
            self._on_event(f"group {group}: its buffers start with {restored:,} transitions of replay kept here")

    def _stop_and_count(
        self,
        group: int,
        lost_keys: list[Key],
        add_heartbeat: Callable[[dict], None],
        counts: collections.Counter[str],
    ) -> dict[int, ReplayState]:
        """Stop ``group``'s hosts, recording their last heartbeats; count what its actors stopped
        (not lost) and its buffers lost; the replay kept here for each of its learners."""
        t = self.cfg.topology
        last_hb = {k: self._supervisor.last_heartbeat(k) for k in self.hosts.group_keys(group)}
        for hb in stop_group(self.hosts, group):
            add_heartbeat(hb)
            last_hb[(hb["role"], hb["id"])] = hb
            if hb["role"] == "actor" and (hb["role"], hb["id"]) not in lost_keys:  # stopped, not lost
                counts.update(lost_with("actor", hb.get("counters", {}), self.cfg.env.num_envs))
        replays = {}
        for lid in range(group * t.learners, (group + 1) * t.learners):
            kept = self._snapshots.replays.get(lid)
            if kept is not None:
                replays[lid] = kept[0]
            counts.update(replay_lost(last_hb[("buffer", lid)], kept))
        return replays

    def _count_group_restarts(self, group: int, restore, counts: collections.Counter[str]) -> int:
        """Count a group's rebuild: its hosts' restarts and the updates its learner loses going
        back to the snapshot ``restore``; the updates it goes on from."""
        t = self.cfg.topology
        # the newest version the group published: its lead's last heartbeat, or an actor's if newer
        last_version = max(
            self._supervisor.last_heartbeat(k).get("counters", {}).get("param_version", -1)
            for k in self.hosts.group_keys(group)
            if k[0] != "buffer"
        )
        restored_updates = int(restore[1].get("updates", 0)) if restore is not None else 0
        counts["lost_updates"] += max(0, int(last_version) - restored_updates)
        counts["buffer_restarts"] += t.learners
        counts["learner_restarts"] += t.learners
        counts["actor_restarts"] += t.actors
        return restored_updates

    def _stop_group(self, group: int, add_heartbeat: Callable[[dict], None]) -> None:
        """Stop and release a group's hosts, recording their last heartbeats."""
        for hb in stop_group(self.hosts, group):
            add_heartbeat(hb)

    def _restart_surviving_ranks(self, group: int, timeout: float) -> None:
        """A data-parallel rank that lost its peer may be stuck in a collective, and
        torch.distributed's process group is one per process: the worker processes of the
        group's surviving ranks start again (their nannies restart them) before the new
        rendezvous."""
        hosts = self.hosts
        plan, present = hosts.current_plan(), set(scheduler_workers(hosts.client))
        survivors = sorted({p.worker for p in plan.learners if p.group == group and p.worker in present})
        if not survivors:
            return
        self._on_event(f"restarting the workers of group {group}'s surviving data-parallel ranks: {survivors}")
        with contextlib.suppress(Exception):  # a worker that does not come back is handled below
            # a short timeout: a rank stuck in a collective never closes gracefully, it is killed
            hosts.client.restart_workers(survivors, timeout=RANK_RESTART_S, raise_for_error=False)
        for address in survivors:
            hosts.move_to_replacement(address, timeout)

    def _unless_lost_again(
        self, what: str, keys: list[Key], recreate: Callable[[], None], undo: Callable[[], None] = lambda: None
    ) -> bool:
        """Run one re-creation of the hosts ``keys``; True if it finished. One that failed while
        their workers are all still there (the scheduler cancelled a host's task, a call to a
        host failed) is tried again, after ``undo`` released what the failed try made, up to
        ``RECREATE_TRIES`` in all: it is still one restart. If a worker it needs is lost
        meanwhile (or the tries run out), say so and go on: its hosts stay expected on the
        plan's workers, so the next :meth:`Supervisor.check_health` reports that worker lost
        (and the policy counts it) or, if the worker is there, they get the start-up grace to
        send a heartbeat."""
        for attempt in range(1, RECREATE_TRIES + 1):
            try:
                recreate()
                return True
            except Exception as exc:  # noqa: BLE001 - the run goes on; supervision decides what it means
                why = first_line(exc)
                needed = {self.hosts.current_plan().host_workers()[k] for k in keys}
                lost = needed - set(scheduler_workers(self.hosts.client))
                if attempt == RECREATE_TRIES or self._hurry.is_set() or lost:
                    self._on_event(f"re-creating {what} did not finish: {why}")
                    return False
                self._on_event(
                    f"re-creating {what} did not finish ({why}) while its workers are all there: "
                    f"trying again ({attempt + 1} of {RECREATE_TRIES})"
                )
                undo()
        return False
