"""A run's distributed mode: its hosts on a Dask cluster (``cluster.RunCluster``), supervised from
the run's thread, with the run loop's duties, re-creation of lost hosts, and the final checkpoint
at its end."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tianji_dask.errors import HostLost
from tianji_dask.results.resumable import ResumePoint
from tianji_dask.runtime.cluster.run_hosts import StartAbandoned
from tianji_dask.runtime.run_loop import RunLoop
from tianji_dask.runtime.startup_timeline import StartupTimeline

if TYPE_CHECKING:
    from tianji_dask.runtime.cluster.cluster import RunCluster

SUPERVISE_S = 0.05  # the pause between two passes of the driver's loop: rows, snapshots, lost hosts, stop


class DistributedMode:
    """``on_cluster_up(run_cluster)`` is called once the run's cluster is up, before its hosts start."""

    def __init__(
        self,
        loop: RunLoop,
        *,
        client,
        run_id: str,
        security,
        spaces,
        resume: ResumePoint | None,
        on_event: Callable[[str], None],
        on_cluster_up: Callable[[RunCluster], None],
        startup: StartupTimeline,
    ):
        self.loop = loop
        self._client = client
        self._run_id = run_id
        self._security = security
        self._spaces = spaces
        self._resume = resume
        self._on_event = on_event
        self._on_cluster_up = on_cluster_up
        self.startup = startup

    def run(self) -> None:
        """The run, from its cluster's start to its end. Asked to stop while it starts (its
        LocalCluster, its hosts), it gives the start up at once: what started is ended, no
        checkpoint is written (no learner trained), the results say ``stopped``."""
        from tianji_dask.runtime.processes.fork_server import start_fork_server

        if self._client is None:
            start_fork_server()  # the run's LocalCluster forks from it: its seconds of imports overlap ours
        try:
            self._run()
        except StartAbandoned as exc:
            self.loop.last_row()
            self._on_event(f"stopped while the run started ({exc}): nothing trained, no checkpoint written")

    def _run(self) -> None:
        from tianji_dask.runtime.cluster.cluster import RunCluster

        loop, recorder = self.loop, self.loop.recorder
        requested = loop.stopping.requested
        with RunCluster(
            loop.cfg,
            self._client,
            self._run_id,
            self._on_event,
            hurry=loop.stopping.hurry,
            stop=requested,
            security=self._security,
        ) as run_cluster:
            self.startup.mark("cluster_up", time.time())
            self._on_cluster_up(run_cluster)
            if requested.is_set():
                raise StartAbandoned("the run was asked to stop before its hosts were created")
            run_cluster.supervisor.subscribe(self._heartbeat)
            self._start_hosts(run_cluster)
            assert run_cluster.hosts is not None
            self.startup.expect_hosts([f"{role} {i}" for role, i in run_cluster.hosts.handles])
            recorder.set_attrs(
                {"scheduler_address": run_cluster.scheduler_address, "worker_addresses": run_cluster.worker_addresses}
            )
            loop.checkpoints.snapshot = run_cluster.learner_snapshot
            try:
                self._supervise(run_cluster)
            finally:
                loop.checkpoints.snapshot = None
                run_cluster.stop_hosts()
                for hb in run_cluster.final_heartbeats():
                    self._heartbeat(hb)
                recorder.set_attrs(self.startup.attrs())
                loop.last_row()
            if loop.cfg.run.checkpoint:
                stopped = loop.stopping.reason == "stopped"
                loop.checkpoints.save_final(
                    run_cluster.learner_checkpoint, hurry=loop.stopping.hurry.is_set(), stopped=stopped
                )
        loop.last_evaluations(hurry=loop.stopping.hurry.is_set())  # the cluster closed: its cores free

    def _heartbeat(self, hb: dict) -> None:
        self.loop.recorder.add(hb)
        self.startup.add(hb)

    def _start_hosts(self, run_cluster: RunCluster) -> None:
        """The run's hosts; those of a continued run from its checkpoint and its actors' counts."""
        recorder = self.loop.recorder
        totals, add = recorder.tally.host_total, recorder.add
        if self._resume is None:
            run_cluster.start_hosts(self._spaces, totals=totals, add_heartbeat=add)
            return
        steps = self._resume.actor_env_steps()
        run_cluster.start_hosts(
            self._spaces,
            restore=self._resume.state,
            prior=lambda key, counter: steps.get(key[1], 0) if (key[0], counter) == ("actor", "env_steps") else 0,
            totals=totals,
            add_heartbeat=add,
        )
        self._on_event(
            f"continuing {recorder.run_name} from {recorder.tally.env_steps:,} env steps, "
            f"learner at update {self._resume.meta.get('updates', 0):,}"
        )

    def _supervise(self, run_cluster: RunCluster) -> None:
        """Until the run stops: the loop's duties, the learners' snapshots (where lost learners
        are re-created), and lost hosts re-created or the run ended with :class:`HostLost`."""
        loop, recorder = self.loop, self.loop.recorder
        next_row = time.time()
        r = loop.cfg.run
        keep_snapshots = r.max_restarts > 0 and r.snapshot_interval > 0
        next_snapshot = time.time() + r.snapshot_interval
        while not loop.should_stop():
            next_row = loop.tick(next_row)
            if keep_snapshots:
                run_cluster.snapshots.collect()
                if time.time() >= next_snapshot:
                    run_cluster.snapshots.take()
                    next_snapshot = time.time() + r.snapshot_interval
            try:
                lost = run_cluster.supervisor.check_health()
                if lost and loop.stopping.requested.is_set():
                    # stopping anyway: what was lost is not re-created (nor counted against
                    # run.max_restarts); the final checkpoint says if the learner's was
                    break
                if lost:
                    losses = run_cluster.recovery.recover(lost, recorder.tally.host_total, recorder.add)
                    recorder.record_losses(**losses)
            except HostLost as exc:  # say it now: stopping the other hosts takes a while
                self._on_event(f"host lost: {str(exc).splitlines()[0]}; stopping the run")
                raise
            time.sleep(SUPERVISE_S)
