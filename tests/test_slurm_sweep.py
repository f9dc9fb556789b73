"""``tianji-dask sweep --slurm``: four seeds two at a time, each on an allocation of the plan's jobs
of its own, against the real local Slurm (jobqueue/local-slurm.sh). Skipped without one; failed
without one when TIANJI_REQUIRE_SLURM=1 (CI)."""

from __future__ import annotations

import dataclasses
import time

import pytest
import xarray as xr
from conftest import CONFIG
from slurm_support import two_core_plan
from test_slurm_run import site, squeue, wait_empty

from tianji_dask.config import load_config
from tianji_dask.deploy.planner import Job

pytestmark = [pytest.mark.slurm, pytest.mark.integration]


def one_core_group_plan(cfg):
    """The two-core plan's learner and actor in one job of one core: two such allocations fit the
    local Slurm's node of two cores at once (Slurm counts the cores, nothing enforces them)."""
    plan = two_core_plan(cfg)
    group = Job("group", 0, cores=1, processes=2, memory_bytes=sum(j.memory_bytes for j in plan.jobs), node=0)
    return dataclasses.replace(plan, jobs=[group], cores_total=1, cores_used=1)


@pytest.mark.timeout(300)
def test_four_seeds_two_at_a_time_on_two_allocations_of_the_plan(slurm_conf, jobqueue_defaults, tmp_path):
    from tianji_dask.deploy.slurm_sweep import slurm_sweep

    assert wait_empty() == [], "jobs left over from an earlier test"
    sets = ["stop.target_return=60", "stop.max_env_steps=80000", "stop.max_seconds=150", "run.eval_every_env_steps=0"]
    plan = one_core_group_plan(load_config(CONFIG, sets))
    lines: list[str] = []
    began = time.monotonic()
    done = slurm_sweep(
        CONFIG,
        ["seed=0,1,2,3"],
        parallel=2,
        plan=plan,
        overrides=sets,
        out=tmp_path / "sweep",
        on_line=lines.append,
        **site(tmp_path),
    )
    print(f"sweep of 4 runs on 2 Slurm allocations: {time.monotonic() - began:.1f} s")
    assert {r.name: r.status for r in done.runs} == dict.fromkeys(
        ["seed=0", "seed=1", "seed=2", "seed=3"], "target_reached"
    ), lines
    assert "submitted 2 x 1 Slurm jobs; waiting for 2 x 2 workers" in lines
    assert sum("started in" in line for line in lines) == 4
    # each run on its slot's allocation: one scheduler per slot, both slots used
    scheduler = {}
    for r in done.runs:
        with xr.open_dataset(r.run_dir / "metrics.nc") as ds:
            scheduler[r.name] = (r.slot, ds.attrs["scheduler_address"], ds.attrs["mode"])
    assert {slot for slot, _, _ in scheduler.values()} == {0, 1}, scheduler
    by_slot = {slot: {address for s, address, _ in scheduler.values() if s == slot} for slot in (0, 1)}
    assert all(len(addresses) == 1 for addresses in by_slot.values()) and by_slot[0] != by_slot[1], scheduler
    jobs_logged = {p.name.rsplit("-", 1)[0] for p in (tmp_path / "logs").glob("*.err")}
    assert {name[-len("s0-g0-group") :] for name in jobs_logged} == {"s0-g0-group", "s1-g0-group"}, jobs_logged
    stacked = done.open()
    assert stacked.sizes["run"] == 4 and sorted(stacked["seed"].values.tolist()) == [0, 1, 2, 3]
    assert wait_empty() == [] and squeue() == []  # the allocations were cancelled with the sweep
