"""A sweep on Slurm (``tianji-dask sweep ... --slurm --parallel K``, :func:`slurm_sweep`): K
allocations of one plan's jobs, submitted together, each a :class:`PlannedSLURMCluster` with its
own scheduler, and one run on each at a time: K times the plan in all.

K clusters rather than one of K times the jobs: a run takes every worker of its client's cluster
that the plan tagged for it (``placement.py``), so runs sharing one scheduler would take the same
workers. Each allocation keeps its jobs for all the runs that take turns on it (their workers
start once), and one that ends mid-run is submitted again as ``train --slurm`` does
(``PlannedSLURMCluster.replace_ended_jobs``). All run configs share the plan: a grid that changes
the jobs (``topology.*``, the devices) is refused before anything is submitted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tianji_dask.config import ConfigError
from tianji_dask.config.deployment import deployment_settings
from tianji_dask.deploy.planner import Plan
from tianji_dask.deploy.slurm import plan_from_config, planned_processes
from tianji_dask.runtime.sweep.runner import Sweep, SweepRun, plan_sweep


def _jobs(plan: Plan) -> list[tuple]:
    return [(j.kind, j.group, j.cores, j.processes, j.memory_bytes, j.gpus) for j in plan.jobs]


def apply_plan(planned: Sweep, grid_keys: Sequence[str], plan: Plan | None) -> Plan:
    """The plan every run of ``planned`` runs on: ``plan`` applied to each run's config, or, with
    none, the first run's topology (``plan_from_config``), which every other run must share.
    Raises :class:`ConfigError` naming the key where the runs would need different jobs."""
    if plan is not None:
        clash = sorted(set(grid_keys) & set(plan.overrides()))
        if clash:
            raise ConfigError(
                f"--grid {', '.join(clash)}: the plan sets {'it' if len(clash) == 1 else 'them'} for every run "
                "of a planned Slurm sweep; drop that --grid, or sweep without --plan"
            )
        for r in planned.runs:
            r.cfg = plan.apply(r.cfg)
        return plan
    first = plan_from_config(planned.runs[0].cfg)
    for r in planned.runs[1:]:
        if _jobs(plan_from_config(r.cfg)) != _jobs(first):
            raise ConfigError(
                f"sweep run {r.name} needs other Slurm jobs than {planned.runs[0].name} (its topology or devices "
                "differ): a Slurm sweep holds one plan's jobs per slot; sweep those keys in sweeps of their own"
            )
    return first


class PlannedSlurmSlots:
    """``parallel`` allocations of ``plan`` (``with`` gives their clients, all workers up; leaving
    it closes the clients and cancels the jobs). ``site``: ``SLURMCluster`` keywords (``walltime``,
    ``log_directory``, ...), the rest from jobqueue.yaml."""

    def __init__(self, plan: Plan, parallel: int, *, on_line: Callable[[str], None] = print, **site):
        self.plan, self.parallel, self.on_line, self.site = plan, parallel, on_line, site
        self.clusters: list = []
        self.clients: list = []

    def __enter__(self) -> list:
        from distributed import Client

        from tianji_dask.deploy.slurm_cluster import PlannedSLURMCluster

        tag = f"{int(time.time()) % 100000}"
        try:
            for k in range(self.parallel):
                self.clusters.append(PlannedSLURMCluster(self.plan, run_tag=f"{tag}-s{k}", **self.site))
                self.clients.append(Client(self.clusters[-1]))
            n = planned_processes(self.plan)
            jobs = len(self.plan.jobs)
            self.on_line(f"submitted {self.parallel} x {jobs} Slurm jobs; waiting for {self.parallel} x {n} workers")
            timeout = deployment_settings().timeouts.slurm_workers
            for client in self.clients:
                client.wait_for_workers(n, timeout=timeout)
        except BaseException:
            self.__exit__()
            raise
        return list(self.clients)

    def __exit__(self, *exc) -> None:
        # newest first: each Client puts back Dask's scheduler setting it found as it started
        for client in reversed(self.clients):
            client.close()
        for cluster in reversed(self.clusters):
            cluster.close()  # cancels its jobs
        self.clients, self.clusters = [], []


def slurm_sweep(
    config: str | Path,
    grid: Sequence[str],
    *,
    parallel: int,
    plan: Plan | None = None,
    overrides: Sequence[str] = (),
    out: str | Path | None = None,
    on_line: Callable[[str], None] = print,
    on_runs: Callable[[list[SweepRun]], None] | None = None,
    grid_file: str | Path | None = None,
    **site,
) -> Sweep:
    """:func:`~tianji_dask.runtime.sweep.runner.sweep` on ``parallel`` Slurm allocations of ``plan``
    (default: the config's own topology). Every config is checked, and the plan with it, before
    any job is submitted; the jobs are cancelled when the last run has ended."""
    if parallel < 1:
        raise ConfigError(f"parallel={parallel}: at least one run at a time")
    planned = plan_sweep(config, grid, overrides, out, grid_file=grid_file)
    return run_on_slurm(planned, parallel=parallel, plan=plan, on_line=on_line, on_runs=on_runs, **site)


def run_on_slurm(
    planned: Sweep,
    *,
    parallel: int,
    plan: Plan | None = None,
    on_line: Callable[[str], None] = print,
    on_runs: Callable[[list[SweepRun]], None] | None = None,
    **site,
) -> Sweep:
    """The waiting runs of ``planned`` (:func:`~tianji_dask.runtime.sweep.runner.plan_sweep` or
    :func:`~tianji_dask.runtime.sweep.runner.resume_sweep`) on ``parallel`` Slurm allocations of ``plan``."""
    if parallel < 1:
        raise ConfigError(f"parallel={parallel}: at least one run at a time")
    if not planned.left:
        return planned
    waiting = Sweep(planned.out, planned.left, axes=planned.axes)
    plan = apply_plan(waiting, [key for key, _ in planned.axes], plan)
    with PlannedSlurmSlots(plan, parallel, on_line=on_line, **site) as clients:
        return planned.run(parallel, on_line=on_line, clients=clients, on_runs=on_runs)
