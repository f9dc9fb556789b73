"""Slurm batch jobs sized by a :class:`~tianji_dask.deploy.planner.Plan`: their names, dask-jobqueue
keywords and scripts, and the check that a node can hold them. The cluster that submits them is
:class:`~tianji_dask.deploy.slurm_cluster.PlannedSLURMCluster`.

Each group of the plan becomes two batch jobs: a learner job (one process per learner,
``learner_threads`` cores each, or one core and ``--gres=gpu:1`` for a learner on the GPU; it also
hosts the group's buffer, so its memory includes the replay memory) and an actors job (one
single-core process per actor). A group whose actor infers on the learner's GPU is one job
(learner and actor processes, ``--gres=gpu:1``), and so is every group of a plan for several
nodes: Slurm places jobs, and two jobs of one group could land on two nodes. Their workers carry Dask resources
(``tianji_learner`` and/or ``tianji_actor``, and ``tianji_group_<g>``) by which the run
places its hosts. Site settings (queue, account, interface, walltime, prologue, log directory)
come from the user's dask-jobqueue configuration (``jobqueue.yaml``: see jobqueue/jobqueue.yaml),
never from the experiment config; keyword arguments override it, as in ``SLURMCluster(...)``.
Nothing here imports dask-jobqueue at module import: importing it writes a template
``jobqueue.yaml`` into the user's Dask config directory.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import TYPE_CHECKING

from tianji_dask.algos.registry import spec_for
from tianji_dask.deploy.planner import Job, Plan, PlanError

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig

SCHEDULER_PLACEHOLDER = "tcp://<scheduler-address>:8786"


def plan_from_config(cfg: ExperimentConfig) -> Plan:
    """The config's own topology as a plan (no profile): for ``train --slurm`` without ``--plan``."""
    from tianji_dask.deploy.planner import ACTOR_PROCESS_BYTES, LEARNER_PROCESS_BYTES

    t = cfg.topology
    threads = t.learner_torch_threads
    learner_gpus = t.learners if cfg.learner.device != "cpu" else 0
    actor_gpus = int(cfg.actor.device != "cpu")  # the actors of a job share one GPU
    jobs = []
    for g in range(t.groups):
        jobs.append(
            Job("learner", g, t.learners * threads, t.learners, t.learners * LEARNER_PROCESS_BYTES, 0, learner_gpus)
        )
        jobs.append(Job("actors", g, t.actors, t.actors, t.actors * ACTOR_PROCESS_BYTES, 0, actor_gpus))
    a = cfg.algo
    return Plan(
        algo=a.name,
        env_id=cfg.env.id,
        groups=t.groups,
        actors=t.actors,
        learner_threads=threads,
        **spec_for(cfg).plan_fields(cfg),
        cores_total=sum(j.cores for j in jobs),
        cores_used=sum(j.cores for j in jobs),
        replay_ratio=a.target_replay_ratio,
        predicted={},
        bottleneck="unknown",
        explanation=["the config's topology as it is (no profile)"],
        jobs=jobs,
        learners=t.learners,
        learner_device=cfg.learner.device,
        actor_device=cfg.actor.device,
        env_threads=cfg.env.atari_threads if cfg.env.stepping_threads else None,
        gpus_used=t.groups * (learner_gpus + actor_gpus),
    )


def job_name(run_tag: str, job: Job) -> str:
    return f"tianji-{run_tag}-g{job.group}-{job.kind}"


def job_options(job: Job, **site) -> dict:
    """dask-jobqueue job keywords for one planned job; ``site`` keywords (queue, walltime...)
    pass through, and anything not given comes from the dask-jobqueue configuration."""
    import dask

    extra = list(site.pop("worker_extra_args", None) or dask.config.get("jobqueue.slurm.worker-extra-args", None) or [])
    resources = ",".join(f"{k}={v}" for k, v in job.resources.items())
    options = {
        **site,
        "cores": job.cores,
        "processes": job.processes,
        "memory": f"{job.memory_bytes}B",
        "worker_extra_args": [*extra, "--resources", resources],
    }
    if job.gpus:
        directives = site.get("job_extra_directives") or dask.config.get("jobqueue.slurm.job-extra-directives", None)
        options["job_extra_directives"] = [*(directives or []), f"--gres=gpu:{job.gpus}"]
    return options


def planned_worker_spec(plan: Plan, run_tag: str, job_cls, site: dict) -> dict[str, dict]:
    """The plan's jobs as a ``SpecCluster`` worker spec, in plan order: job name ->
    ``{"cls": job_cls, "options": job keywords, "group": worker name suffixes}``."""
    spec = {}
    for job in plan.jobs:
        name = job_name(run_tag, job)
        entry: dict = {"cls": job_cls, "options": {**job_options(job, **site), "job_name": name}}
        if job.processes > 1:
            # dask-worker --nworkers names its workers <name>-0, <name>-1, ...; SpecCluster maps
            # them back to their job through these suffixes.
            entry["group"] = [f"-{i}" for i in range(job.processes)]
        spec[name] = entry
    return spec


def job_scripts(plan: Plan, run_tag: str = "run", **site) -> list[tuple[str, str]]:
    """(job name, script) for every job of the plan, without a scheduler or a submission."""
    from dask_jobqueue.slurm import SLURMJob

    spec = planned_worker_spec(plan, run_tag, SLURMJob, site)
    return [
        (name, entry["cls"](SCHEDULER_PLACEHOLDER, name=name, **entry["options"]).job_script())
        for name, entry in spec.items()
    ]


def partition_limits(queue: str | None = None) -> tuple[int, int] | None:
    """(CPUs, memory in bytes) of the largest node of ``queue`` (the default partition if None),
    from ``sinfo``; None when sinfo is not available."""
    if shutil.which("sinfo") is None:
        return None
    cmd = ["sinfo", "--noheader", "--format=%P %c %m"]
    if queue:
        cmd += ["--partition", queue]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    best = None
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 3 or (queue is None and not parts[0].endswith("*")):
            continue
        cpus, mem = int(parts[1].rstrip("+")), int(parts[2].rstrip("+")) * 2**20
        best = max(best or (0, 0), (cpus, mem))
    return best


def check_fits(plan: Plan, queue: str | None = None) -> None:
    """Refuse, before anything is submitted, a plan whose jobs no node of the partition can hold."""
    limits = partition_limits(queue)
    if limits is None:
        return
    cpus, mem = limits
    where = f"partition {queue}" if queue else "the default partition"
    for job in plan.jobs:
        if job.cores > cpus or job.memory_bytes > mem:
            raise PlanError(
                f"group {job.group}'s {job.kind} job needs {job.cores} cores and "
                f"{job.memory_bytes / 2**30:.2f} GiB, but the largest node of {where} has {cpus} CPUs and "
                f"{mem / 2**30:.2f} GiB (sinfo): nothing was submitted. Plan for this cluster with "
                f"tianji-dask plan CONFIG --cores M --cores-per-node {cpus}"
            )


def planned_processes(plan: Plan) -> int:
    return sum(j.processes for j in plan.jobs)
