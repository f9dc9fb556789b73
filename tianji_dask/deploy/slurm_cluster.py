"""``PlannedSLURMCluster``: a dask-jobqueue ``SLURMCluster`` whose jobs are a plan's.

dask-jobqueue's clusters scale one job template. This one builds, in its constructor, a
``SpecCluster`` worker spec with one entry per planned job (``tianji_dask.deploy.slurm``:
``planned_worker_spec``), each from the job keywords the cluster resolved (keyword arguments,
then the user's ``jobqueue.yaml``) with the job's own cores, processes, memory and Dask
resources. ``scale`` and ``new_worker_spec`` hand out the plan's jobs instead of copies of the
template.

A job that ends while the run goes on (``scancel``, preemption, its walltime) is submitted again,
of the same size, name and tags, by :meth:`PlannedSLURMCluster.replace_ended_jobs`, which the
run's driver calls when it loses workers (``worker_replacement.WorkerReplacement.find``).
"""

from __future__ import annotations

import getpass
import shutil
import subprocess

import dask
from dask_jobqueue import SLURMCluster
from dask_jobqueue.slurm import SLURMJob
from distributed.core import Status
from distributed.deploy.cluster import Cluster
from distributed.deploy.spec import ProcessInterface

from tianji_dask.deploy.planner import Plan, PlanError
from tianji_dask.deploy.slurm import check_fits, planned_worker_spec


class SlurmSubmitError(RuntimeError):
    """sbatch refused a planned job; nothing of the plan is left queued or running."""


class PlannedSLURMJob(SLURMJob):
    """A ``SLURMJob`` whose status ends where ``SpecCluster.close`` asserts it does for every job
    it created: ``failed`` when sbatch refused the job, ``closed`` once it is cancelled.
    dask-jobqueue's ``Job`` leaves a refused job ``created`` and a cancelled one ``running``."""

    async def start(self) -> None:
        try:
            await super().start()
        except Exception:
            self.status = Status.failed
            raise

    async def close(self) -> None:
        await super().close()  # scancel
        await ProcessInterface.close(self)  # status closed; finished() returns


class PlannedSLURMCluster(SLURMCluster):
    """The plan's jobs, submitted when the cluster is made; one ``run_tag`` names them
    (``tianji-<run_tag>-g<group>-<kind>``). ``kwargs`` are ``SLURMCluster``'s (``walltime``,
    ``log_directory``, ...); what is not given comes from jobqueue.yaml. The cluster's own job
    template (``job_script()``) is the plan's first job.

    Raises ``PlanError`` before anything starts when sbatch is missing or a job is larger than
    the partition's largest node, and ``SlurmSubmitError`` (after cancelling the jobs already
    submitted) when sbatch refuses one.
    """

    job_cls = PlannedSLURMJob

    def __init__(self, plan: Plan, run_tag: str = "run", **kwargs):
        if shutil.which("sbatch") is None:
            raise PlanError(
                "Slurm's sbatch is not on PATH, so no job can be submitted from here; run on a "
                "Slurm login node, or try a local Slurm: jobqueue/local-slurm.sh start DIR"
            )
        check_fits(plan, kwargs.get("queue") or dask.config.get("jobqueue.slurm.queue", None))
        self.planned_spec: dict[str, dict] = {}  # SpecCluster closes through scale(0) if it fails to start
        first = plan.jobs[0]
        template = {"cores": first.cores, "processes": first.processes, "memory": f"{first.memory_bytes}B"}
        super().__init__(**{**template, **kwargs})
        # new_spec holds the job keywords JobQueueCluster resolved for its template: kwargs,
        # jobqueue.yaml's interface, the protocol, the security; every planned job shares them.
        self.planned_spec = planned_worker_spec(plan, run_tag, self.job_cls, self.new_spec["options"])
        self.worker_spec.update(self.planned_spec)
        try:
            self.sync(self._reach_spec)
        except Exception as exc:
            self.close()
            raise SlurmSubmitError(
                f"Slurm refused a job of the plan ({exc}); the jobs already submitted "
                "were cancelled. Check the plan with tianji-dask job-script"
            ) from exc

    async def _reach_spec(self) -> None:
        await self  # a SpecCluster awaited starts a job for each worker_spec entry without one (sbatch)

    def replace_ended_jobs(self) -> list[str]:
        """Submit again every job of the cluster that Slurm no longer lists (cancelled, preempted,
        past its walltime, failed), with its name, size and tags; returns their names. Jobs still
        pending or running, and jobs this cluster cancelled itself (``scale``), are left alone."""
        ids = {name: str(job.job_id) for name, job in self.workers.items() if getattr(job, "job_id", None)}
        if not ids:
            return []
        r = subprocess.run(
            ["squeue", "-h", "-o", "%i", "-u", getpass.getuser()], capture_output=True, text=True, timeout=15
        )
        if r.returncode != 0:
            raise RuntimeError(f"squeue failed ({r.returncode}): {r.stderr.strip()}")
        listed = set(r.stdout.split())
        ended = sorted(name for name, job_id in ids.items() if job_id not in listed)
        for name in ended:
            del self.workers[name]  # the job is gone: nothing to cancel
        if ended:
            self.sync(self._correct_state)  # a job for every worker_spec entry without one (sbatch)
        return ended

    def _update_worker_status(self, op, msg):
        # SpecCluster cancels the job of a worker that left, by the worker's name, a
        # lost-worker-timeout later: by then that name may be a replacement job's. Jobs that end
        # are replaced by replace_ended_jobs instead, and scale() cancels the ones it drops.
        Cluster._update_worker_status(self, op, msg)

    def scale(self, n=None, jobs=0, memory=None, cores=None):  # type: ignore[override]  # adds jobs= before memory=
        """Run the plan's first ``jobs`` jobs, in plan order, and cancel the others; ``n`` asks
        for the fewest first jobs that hold ``n`` workers. All of the plan is
        ``jobs=len(cluster.planned_spec)``; ``scale(0)`` cancels every job. A job started again
        keeps its name."""
        if memory is not None or cores is not None:
            raise ValueError("a planned cluster scales by its plan's jobs (jobs=) or workers (n=), not memory or cores")
        if n is not None:
            jobs = self._jobs_holding(n)
        if not 0 <= jobs <= len(self.planned_spec):
            raise ValueError(f"the plan has {len(self.planned_spec)} jobs, so the cluster cannot run {jobs}")
        keep = list(self.planned_spec)[:jobs]
        for name in [name for name in self.worker_spec if name not in keep]:
            del self.worker_spec[name]
        return super().scale(jobs=jobs)

    def new_worker_spec(self) -> dict:
        """The plan's first job not in ``worker_spec``: what ``SpecCluster.scale`` adds next."""
        for name, entry in self.planned_spec.items():
            if name not in self.worker_spec:
                return {name: entry}
        raise ValueError(f"all {len(self.planned_spec)} jobs of the plan are in the cluster; it cannot grow past them")

    def _jobs_holding(self, workers: int) -> int:
        held = 0
        for count, entry in enumerate(self.planned_spec.values()):
            if held >= workers:
                return count
            held += entry["options"]["processes"]
        if held >= workers:
            return len(self.planned_spec)
        raise ValueError(f"the plan's jobs hold {held} workers, fewer than the {workers} asked for")
