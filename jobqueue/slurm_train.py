"""Train on Slurm jobs sized by a plan: the Python API behind ``tianji-dask train CONFIG --slurm``.

    python jobqueue/slurm_train.py configs/cartpole_dqn.yaml --plan plan.yaml --walltime 01:00:00

Site settings (queue, account, interface, log directory...) come from your dask-jobqueue
configuration (jobqueue/jobqueue.yaml is a template; point DASK_CONFIG at its folder or copy it
to ~/.config/dask/). Without --plan the config's own topology sizes the jobs.
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("--plan", default=None, help="plan from tianji-dask plan (default: the config's topology)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    p.add_argument("--walltime", default=None, help="job walltime (default: jobqueue.yaml)")
    p.add_argument("--out", default=None, help="run directory")
    args = p.parse_args(argv)

    from distributed import Client

    from tianji_dask.config import load_config
    from tianji_dask.config.deployment import deployment_settings
    from tianji_dask.deploy.planner import load_plan
    from tianji_dask.deploy.slurm import plan_from_config, planned_processes
    from tianji_dask.deploy.slurm_cluster import PlannedSLURMCluster
    from tianji_dask.runtime.driver import train

    cfg = load_config(args.config, args.overrides)
    plan = load_plan(args.plan) if args.plan else plan_from_config(cfg)
    cfg = plan.apply(cfg)
    kw = {"walltime": args.walltime} if args.walltime else {}
    with PlannedSLURMCluster(plan, **kw) as cluster, Client(cluster) as client:
        print(f"{len(plan.jobs)} jobs submitted; dashboard {client.dashboard_link}", file=sys.stderr)
        client.wait_for_workers(planned_processes(plan), timeout=deployment_settings().timeouts.slurm_workers)
        run = train(cfg, client, out=args.out, on_event=lambda s: print(s, file=sys.stderr))
        result = run.wait()
    print(f"{result.status}: time to target {result.time_to_target_s:.1f} s; results in {result.run_dir}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
