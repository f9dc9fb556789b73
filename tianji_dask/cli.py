"""``tianji-dask``: the command line, a thin layer over :func:`tianji_dask.runtime.driver.train`.

Exit codes: 0 the run finished (target reached or a budget spent); 1 it failed
during the run; 2 bad input (nothing started, nothing written); 130 stopped by
Ctrl-C, 143 by SIGTERM (results written either way).
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig
    from tianji_dask.deploy.planner import Plan

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 too; keep its usage line, drop nothing
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


RUNS_HELP = "run directories, globs of them ('runs/CartPole-v1__dqn__*') or a sweep's directory"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tianji-dask", description="TianJi-style distributed deep RL on Dask.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add_command in (
        _add_train,
        _add_profile,
        _add_plan,
        _add_sweep,
        _add_eval,
        _add_job_script,
        _add_summary,
        _add_plot,
    ):
        add_command(sub)
    return p


def _add_train(sub: argparse._SubParsersAction[_Parser]) -> None:
    t = sub.add_parser(
        "train",
        help="train an agent from a config file",
        description="Train an agent. With no --scheduler, starts a LocalCluster on 127.0.0.1.",
    )
    t.add_argument("config", nargs="?", default=None, help="experiment YAML file, e.g. configs/cartpole_dqn.yaml")
    t.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its checkpoint (its config; --set only stop.* and run.*); "
        "metrics.nc and episodes.nc are extended",
    )
    t.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a config value (repeatable), e.g. --set algo.lr=1e-3",
    )
    t.add_argument(
        "--out",
        type=Path,
        default=None,
        help="run directory (must be new or empty); default runs/<env>__<algo>__<seed>__<time>",
    )
    _add_train_cluster_arguments(t)


def _add_train_cluster_arguments(t: argparse.ArgumentParser) -> None:
    """Where the run's hosts run, its plan, and the checks before it starts."""
    g = t.add_mutually_exclusive_group()
    g.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="use the Dask cluster at this scheduler address instead of a LocalCluster",
    )
    g.add_argument("--serial", action="store_true", help="run the serial reference in this process (no Dask)")
    g.add_argument(
        "--slurm",
        action="store_true",
        help="submit Slurm jobs through dask-jobqueue, sized by --plan (or by the config's "
        "topology); site settings come from your jobqueue.yaml (see jobqueue/)",
    )
    t.add_argument(
        "--plan",
        type=Path,
        default=None,
        metavar="PLAN.yaml",
        help="apply a plan from tianji-dask plan (topology, learner threads, batch); warns when it "
        "uses more cores than the run has, refuses one that needs more memory",
    )
    t.add_argument("--walltime", default=None, help="--slurm: job walltime, e.g. 01:00:00 (default: jobqueue.yaml)")
    t.add_argument(
        "--check",
        action="store_true",
        help="check the config, the arguments, the env and (for the run's own LocalCluster) the memory "
        "and the plan's fit, then exit: nothing is started or written (exit 0: the run would start)",
    )
    t.add_argument(
        "--tls",
        action="store_true",
        help="the run's LocalCluster speaks TLS only (certificates made for the run); with --scheduler "
        "tls://... or --slurm, Dask's own TLS settings (distributed.comm.tls.*) apply instead",
    )


def _add_profile(sub: argparse._SubParsersAction[_Parser]) -> None:
    pr = sub.add_parser(
        "profile",
        help="measure TR_A and TR_L of a config on a cluster (the planner's input)",
        description="Measure production (TR_A, k actors at once) and consumption (TR_L, learner "
        "threads x batch size) of a config; writes a NetCDF profile for tianji-dask plan.",
    )
    pr.add_argument("config")
    pr.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    pr.add_argument(
        "--gpu",
        action="store_true",
        help="also measure on the workers' GPU: a learner there, and one actor with its inference "
        "there at each env thread count (envs that step on threads)",
    )
    pr.add_argument(
        "--out",
        type=Path,
        default=None,
        help="profile file to write; must not exist (default runs/profiles/<config>-<N>cores.nc, N: "
        "this machine's cores; with --scheduler runs/profiles/<config>-<host>-<port>.nc)",
    )
    _add_profile_arguments(pr)


def _add_plan(sub: argparse._SubParsersAction[_Parser]) -> None:
    pl = sub.add_parser(
        "plan",
        help="size groups, actors and learner threads for M cores (TianJi's strategy)",
        description="Compute the core allocation that maximises min(TR_A, TR_L) at the serial "
        "replay ratio; prints it and writes it as YAML for train --plan.",
    )
    pl.add_argument("config")
    pl.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    pl.add_argument("--cores", type=int, required=True, help="cores to plan for (M)")
    pl.add_argument("--nodes", type=int, default=1, help="nodes the cores are spread over (default 1)")
    pl.add_argument("--cores-per-node", type=int, default=None, help="cores of one node (groups never straddle nodes)")
    pl.add_argument("--memory-per-node", default=None, help="memory of one node, e.g. 64GiB (checked against replay)")
    pl.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="GPUs to plan for, in all (spread evenly over the nodes); a group may put its learner "
        "and its actors' inference on one of them (default 0: the CPU only)",
    )
    pl.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="profile to plan from; measured on a LocalCluster of this machine (and saved "
        "there) when the file does not exist (default: beside the plan, <plan>.profile.nc)",
    )
    pl.add_argument(
        "--out",
        type=Path,
        default=None,
        help="plan file to write; must not exist (default runs/plans/<config>-<cores>cores.yaml)",
    )
    _add_profile_arguments(pl)


def _add_sweep(sub: argparse._SubParsersAction[_Parser]) -> None:
    sw = sub.add_parser(
        "sweep",
        help="train every combination of a grid of config values, K runs at a time",
        description="One run per combination of the --grid values (each its own hosts and directory "
        "under the sweep's), --parallel at a time; a failed run is recorded and the others go on. "
        "Ctrl-C stops the running runs (results written) and starts no more; --resume DIR finishes "
        "what is left. At the end, a table of the runs per setting (seeds together).",
    )
    sw.add_argument("config", nargs="?", default=None, help="experiment YAML file (not with --resume)")
    sw.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY.PATH=V1,V2",
        help="values of one config key (repeatable; the runs are every combination), e.g. --grid seed=0,1,2; "
        "values that hold commas are separated by semicolons: --grid 'algo.hidden_sizes=[64,64];[32]'",
    )
    sw.add_argument(
        "--grid-file",
        type=Path,
        default=None,
        metavar="GRID.yaml",
        help="a YAML mapping of config keys to lists of values, e.g. "
        "{seed: [0, 1], algo.hidden_sizes: [[64, 64], [32]]}",
    )
    sw.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    sw.add_argument(
        "--parallel", type=int, default=None, help="runs at a time (default 1; with --resume, the sweep's own)"
    )
    sw.add_argument("--out", type=Path, default=None, help="the sweep's directory (new or empty)")
    sw.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="SWEEP_DIR",
        help="finish an interrupted sweep as its sweep.yaml describes: runs never started start, stopped or failed "
        "ones continue from their checkpoints, finished ones are left as they are",
    )
    sw.add_argument("--scheduler", default=None, metavar="ADDRESS", help="run on this Dask cluster's workers")
    sw.add_argument(
        "--slurm",
        action="store_true",
        help="submit --parallel allocations of the plan's Slurm jobs (dask-jobqueue, jobqueue.yaml), "
        "a run on each at a time",
    )
    sw.add_argument("--plan", type=Path, default=None, metavar="PLAN.yaml", help="--slurm: the jobs of this plan")
    sw.add_argument("--walltime", default=None, help="--slurm: job walltime, e.g. 01:00:00 (default: jobqueue.yaml)")


def _add_eval(sub: argparse._SubParsersAction[_Parser]) -> None:
    ev = sub.add_parser(
        "eval",
        help="play a trained run's policy without exploration and write eval.nc",
        description="Load RUN_DIR's checkpoint and config, play whole episodes with the policy's "
        "greedy (DQN) or most likely (PPO) actions on the env's own rewards, write RUN_DIR/eval.nc "
        "(or --out) and print the returns' mean, std, min and max. The checkpoint is the best one "
        "the run evaluated while it trained (checkpoint_best, run.eval_every_env_steps) where it has "
        "one, else its latest; --latest takes the latest. Relative --out and --video paths are "
        "relative to RUN_DIR, absolute ones as given; a file that exists is never overwritten: the "
        "next free name is written (eval-2.nc, eval-3.nc...) and printed.",
    )
    ev.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the directory a run wrote")
    ev.add_argument("--episodes", type=int, default=20, help="episodes to play (default 20)")
    ev.add_argument("--envs", type=int, default=None, help="parallel envs (default: min(episodes, the run's, 16))")
    ev.add_argument("--epsilon", type=float, default=0.001, help="DQN: random actions kept (default 0.001)")
    ev.add_argument("--seed", type=int, default=1_000_003, help="the envs' seed (default 1000003)")
    ev.add_argument("--device", default="cpu", help="where the policy runs: cpu, cuda or cuda:N (default cpu)")
    ev.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the NetCDF file to write, relative to RUN_DIR (default eval.nc; eval-2.nc if taken, ...)",
    )
    ev.add_argument(
        "--latest",
        action="store_true",
        help="play RUN_DIR/checkpoint, the run's latest, even where it kept a best one (checkpoint_best)",
    )
    ev.add_argument(
        "--video",
        type=Path,
        nargs="?",
        const=Path("eval.mp4"),
        default=None,
        metavar="PATH",
        help="also play one episode rendering its screen into PATH, relative to RUN_DIR (.mp4; default "
        "eval.mp4, eval-2.mp4 if taken, ...; pip install 'tianji-dask[video]')",
    )


def _add_job_script(sub: argparse._SubParsersAction[_Parser]) -> None:
    js = sub.add_parser("job-script", help="show the Slurm job scripts of a run without submitting them")
    js.add_argument("config")
    js.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    js.add_argument("--plan", type=Path, default=None, metavar="PLAN.yaml")
    js.add_argument("--walltime", default=None)


def _add_summary(sub: argparse._SubParsersAction[_Parser]) -> None:
    su = sub.add_parser(
        "summary",
        help="the summary table of runs: time to target per setting, over seeds",
        description="Open the runs (open_runs) and print ds.tianji.summary(): per group of settings "
        "(the config fields that differ, seeds pooled) the runs, those that reached the target, and "
        "the median, quartiles, min and max of their time to target. A table on a terminal, aligned "
        "text in a pipe.",
    )
    su.add_argument("runs", nargs="+", metavar="RUN", help=RUNS_HELP)
    su.add_argument("--target", type=float, default=None, help="time to this return (default: each run's target)")
    su.add_argument("--csv", action="store_true", help="print comma-separated values instead of a table")


def _add_plot(sub: argparse._SubParsersAction[_Parser]) -> None:
    pt = sub.add_parser(
        "plot",
        help="draw a metrics variable of runs against env steps or time into a PNG",
        description="One curve per run of a metrics.nc variable (ds.tianji.plot_variable), labelled by "
        "the settings that tell the runs apart; the axes carry the variables' names and units. Writes "
        "-o (never over an existing file) and prints its path.",
    )
    pt.add_argument("runs", nargs="+", metavar="RUN", help=RUNS_HELP)
    pt.add_argument("--y", default="return_mean_100", help="the variable drawn (default return_mean_100)")
    pt.add_argument("--x", default="env_steps", help="env_steps (default), time, or another metrics variable")
    pt.add_argument("-o", "--out", type=Path, required=True, help="the image to write, e.g. curve.png (must not exist)")


def _add_profile_arguments(p) -> None:
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement (default 3)")
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="profile on this Dask cluster (default: a LocalCluster with one worker per core)",
    )
    p.add_argument(
        "--batch-sizes",
        default=None,
        metavar="LIST",
        help="DQN: comma-separated batch sizes to measure (default: the config's); plan with an "
        "existing --profile: the batch sizes of it the plan may choose among (default: all)",
    )
    p.add_argument("--max-actors", type=int, default=None, help="largest actor count measured (default: workers)")
    p.add_argument(
        "--max-threads",
        type=int,
        default=None,
        help="largest learner thread count (default: cores - 1); 0 with a GPU: no learner on the CPU",
    )


def _bad_input(message: str) -> int:
    print(f"tianji-dask: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(signum)


def _on_driver_signals(handler) -> None:
    from tianji_dask.runtime.processes.worker_signals import DRIVER_SIGNALS

    for sig in DRIVER_SIGNALS:
        signal.signal(sig, handler)


class _SecondSignalStopsAtOnce:
    """The driver's SIGINT/SIGTERM handler while a run is on: the first raises KeyboardInterrupt
    (the run stops cleanly and writes its results); a second, whenever it comes after the first
    (even before the first's message is out), stops waiting for the hosts and gives the final
    checkpoint a few seconds; the results are still written and the workers still ended. Later
    ones change nothing. Deciding in the handler itself leaves no moment where a quick second
    signal would find the first's handler and abandon the run."""

    def __init__(self, run, progress) -> None:
        self.run, self.progress = run, progress
        self.signals = 0

    def __call__(self, signum: int, frame) -> None:
        self.signals += 1
        if self.signals == 1:
            raise KeyboardInterrupt(signum)
        if self.signals == 2:
            self.progress.event(
                f"{signal.Signals(signum).name} again: no more waiting for the hosts, "
                "a few seconds for the final checkpoint..."
            )
            self.run.stop("stopped", now=True)


def cmd_train(args) -> int:
    refusal = _train_arguments_problem(args)
    if refusal:
        return _bad_input(refusal)
    started_fork_server = False
    if not (args.scheduler or args.slurm or args.serial or args.check):
        from tianji_dask.runtime.processes.fork_server import start_fork_server

        # the run's own LocalCluster forks its workers from it: its seconds of imports overlap
        # the checks' and the driver's own
        started_fork_server = start_fork_server()
    try:
        return _train(args)
    finally:
        if started_fork_server:
            from tianji_dask.runtime.processes.fork_server import end_fork_server

            end_fork_server()  # one still importing (bad input, a run stopped as it started) would outlive us


def _train(args) -> int:
    from tianji_dask.config import ConfigError
    from tianji_dask.deploy.planner import PlanError
    from tianji_dask.deploy.preflight import SchedulerUnreachable

    try:
        cfg, plan, resume_point = _checked_train(args)
    except (ConfigError, PlanError, SchedulerUnreachable) as exc:
        return _bad_input(str(exc))
    if args.out is not None and args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        return _bad_input(
            f"--out {args.out} exists and is not an empty directory; choose a new directory (nothing was written)"
        )
    if args.check:
        return _check_only(cfg, plan, args)
    client_and_cluster = _train_client(cfg, plan, args)
    if isinstance(client_and_cluster, int):
        return client_and_cluster
    client, cluster = client_and_cluster
    return _train_with_progress(cfg, resume_point, client, cluster, args, plan)


def _train_arguments_problem(args) -> str | None:
    """What is wrong with ``train``'s arguments taken together, before anything is read."""
    if args.tls and (args.scheduler or args.slurm or args.serial):
        other = "--scheduler" if args.scheduler else "--slurm" if args.slurm else "--serial"
        return (
            f"--tls makes the run's own LocalCluster speak TLS; with {other} it does not apply"
            + ("" if args.serial else " (Dask's own TLS settings, distributed.comm.tls.*, do)")
            + "; drop --tls"
        )
    if args.resume is not None:
        also = [f for f, given in (("--out", args.out), ("--plan", args.plan), ("--serial", args.serial)) if given]
        if also:
            return f"--resume continues the run in its own directory with its own topology; drop {' and '.join(also)}"
    elif args.config is None:
        return "give a config file (tianji-dask train configs/cartpole_dqn.yaml) or --resume RUN_DIR"
    return None


def _checked_train(args):
    """``(cfg, plan, resume point)`` once the run's own checks and the deployment's that need no
    cluster have passed; raises ConfigError, PlanError or SchedulerUnreachable."""
    from tianji_dask.deploy.preflight import check_scheduler_listens, planned
    from tianji_dask.runtime.checks import check_devices, run_config

    cfg, resume_point = run_config(args.config, args.overrides, resume=args.resume)
    cfg, plan = planned(cfg, args.plan)
    check_devices(cfg, on_this_machine=not (args.scheduler or args.slurm))  # after the plan, which may set them
    if args.scheduler:
        check_scheduler_listens(args.scheduler)
    return cfg, plan, resume_point


def _train_client(cfg: ExperimentConfig, plan, args) -> tuple[Any, Any] | int:
    """``(client, cluster)`` for --slurm (the plan's jobs, their workers up) or --scheduler, each
    None for the run's own LocalCluster or the serial reference; or the exit code of a refusal."""
    from tianji_dask.deploy.planner import PlanError

    client = cluster = None
    if args.slurm:
        try:
            client, cluster = _slurm_client(cfg, plan, args)
        except PlanError as exc:
            return _bad_input(str(exc))
        except Exception as exc:  # noqa: BLE001 - jobs that never started: say what Slurm said
            print(f"tianji-dask: error: the Slurm jobs did not start: {exc}", file=sys.stderr)
            return EXIT_FAILED
    if args.scheduler:
        from distributed import Client

        try:
            client = Client(args.scheduler, timeout=_connect_timeout())
        except (OSError, TimeoutError, ValueError) as exc:
            return _bad_input(f"cannot connect to the scheduler at {args.scheduler!r}: {exc}")
    if plan is not None and not (args.slurm or args.serial):  # Slurm jobs are sized by the plan itself
        refusal = _check_plan_fits(plan, client, args)
        if refusal:
            if client is not None:
                client.close()
            return _bad_input(refusal)
    return client, cluster


def _train_with_progress(cfg: ExperimentConfig, resume_point, client, cluster, args, plan: Plan | None = None) -> int:
    """Start the run with its progress on stderr and the driver's signal handling, wait for its
    end, close what the CLI started; the exit code."""
    from tianji_dask.algos.registry import spec_for
    from tianji_dask.config import ConfigError
    from tianji_dask.progress import Progress
    from tianji_dask.results.rundir import RunDirExists
    from tianji_dask.runtime.driver import Run, train
    from tianji_dask.runtime.startup_timeline import process_started_at

    started_at = process_started_at()
    progress = Progress(cfg.stop, off_policy=spec_for(cfg).off_policy)
    on = {"on_row": progress.update, "on_event": progress.event, "tls": args.tls}
    try:
        if resume_point is not None:
            run = Run(cfg, client=client, resume=resume_point, started_at=started_at, **on)
        else:
            predicted = plan.predictions() if plan is not None else None
            run = train(cfg, client, out=args.out, serial=args.serial, started_at=started_at, plan=predicted, **on)
    except (RunDirExists, ConfigError) as exc:
        progress.close()
        return _bad_input(str(exc))
    _on_driver_signals(_SecondSignalStopsAtOnce(run, progress))
    interrupted = None
    try:
        progress.event(f"run directory: {run.run_dir}")
        result = run.wait()
    except KeyboardInterrupt as exc:
        interrupted = exc.args[0] if exc.args else signal.SIGINT
        progress.event(
            f"{signal.Signals(interrupted).name}: stopping all hosts and writing results (again to stop at once)..."
        )
        run.stop("stopped")
        result = run.wait()
    finally:
        progress.close()
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()  # cancels the jobs
    _report(result)
    if interrupted is not None:
        return 128 + int(interrupted)
    return EXIT_OK if result.ok else EXIT_FAILED


def _check_only(cfg: ExperimentConfig, plan, args) -> int:
    """``train --check``: what the run would check as it starts, and nothing started. The env is
    made once; replay memory and the plan's fit are checked against this machine where the run's
    own LocalCluster would run (a --scheduler's or Slurm's workers are not asked)."""
    from tianji_dask.config import ConfigError
    from tianji_dask.runtime.checks import check_before_start

    own_cluster = not (args.scheduler or args.slurm)
    try:
        check_before_start(cfg, on_this_machine=own_cluster, serial=args.serial)
    except ConfigError as exc:
        return _bad_input(str(exc))
    if plan is not None and own_cluster and not args.serial:
        refusal = _check_plan_fits(plan, None, args)
        if refusal:
            return _bad_input(refusal)
    where = "serial" if args.serial else "Slurm" if args.slurm else args.scheduler or "a LocalCluster"
    what = "continues " + str(args.resume) if args.resume is not None else "would start"
    t = cfg.topology
    groups = f"{t.groups} group(s) of " if t.groups > 1 else ""
    jobs = f" in {len(plan.jobs)} job(s) of the plan" if plan is not None and args.slurm else ""
    print(
        f"tianji-dask: check: ok: {cfg.algo.name} on {cfg.env.id}, {groups}{t.actors} actor(s) and "
        f"{t.learners} learner(s), learner on {cfg.learner.device}, on {where}{jobs}: "
        f"the run {what}; nothing was started or written",
        file=sys.stderr,
    )
    return EXIT_OK


def _check_plan_fits(plan, client, args) -> str | None:
    """Warn on stderr when the plan wants more cores than the run has; the refusal when it wants
    more memory. ``client``: the --scheduler's, or None for the run's own LocalCluster."""
    from tianji_dask.deploy.preflight import plan_fit

    warning, refusal = plan_fit(plan, client, scheduler=args.scheduler, plan_path=args.plan, config_path=args.config)
    if warning:
        print(f"tianji-dask: warning: {warning}", file=sys.stderr)
    return refusal


def _slurm_client(cfg: ExperimentConfig, plan, args):
    """Submit the plan's jobs and wait for all their workers; returns (client, cluster)."""
    import time

    from distributed import Client

    from tianji_dask.config.deployment import deployment_settings
    from tianji_dask.deploy.slurm import plan_from_config, planned_processes
    from tianji_dask.deploy.slurm_cluster import PlannedSLURMCluster

    plan = plan or plan_from_config(cfg)
    kw = {"walltime": args.walltime} if args.walltime else {}
    cluster = PlannedSLURMCluster(plan, run_tag=f"{int(time.time()) % 100000}", **kw)
    client = Client(cluster)
    n = planned_processes(plan)
    print(
        f"tianji-dask: submitted {len(plan.jobs)} Slurm jobs; waiting for {n} workers "
        f"(dashboard {client.dashboard_link})",
        file=sys.stderr,
    )
    try:
        client.wait_for_workers(n, timeout=deployment_settings().timeouts.slurm_workers)
    except BaseException:
        client.close()
        cluster.close()
        raise
    return client, cluster


def _connect_timeout() -> float:
    from tianji_dask.config.deployment import deployment_settings

    return deployment_settings().scheduler.connect_timeout


def _profile_client(args, cfg: ExperimentConfig):
    from distributed import Client

    from tianji_dask.runtime.cluster.cluster import local_cluster

    if args.scheduler:
        return Client(args.scheduler, timeout=_connect_timeout()), None
    import os

    n = max(2, len(os.sched_getaffinity(0)))
    cluster = local_cluster(n)
    return Client(cluster), cluster


def _check_profile_arguments(args) -> None:
    from tianji_dask.deploy.preflight import check_scheduler_listens

    if args.seconds <= 0:
        raise ValueError(f"--seconds must be positive, got {args.seconds}")
    for name in ("max_actors", "max_threads"):
        v = getattr(args, name)
        if v is not None and v < 1 and not (name == "max_threads" and v == 0 and args.gpu):
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {v}")
    _batch_sizes(args.batch_sizes)
    if args.scheduler:
        check_scheduler_listens(args.scheduler)


def _batch_sizes(text):
    if text is None:
        return None
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise ValueError(f"--batch-sizes takes comma-separated positive integers, got {text!r}")
    return out


def _measure(cfg: ExperimentConfig, args, path: Path) -> None:
    from tianji_dask.deploy import profiling

    client, cluster = _profile_client(args, cfg)
    try:
        ds = profiling.profile(
            cfg,
            client,
            seconds=args.seconds,
            max_actors=args.max_actors,
            max_threads=args.max_threads,
            batch_sizes=_batch_sizes(args.batch_sizes),
            gpu=args.gpu,
            log=lambda s: print(s, file=sys.stderr, flush=True),
        )
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    profiling.save(ds, path)
    print(profiling.describe(ds))
    print(f"profile: {path}", file=sys.stderr)


def cmd_profile(args) -> int:
    from tianji_dask.config import ConfigError, load_config
    from tianji_dask.deploy.profiling import ProfileError, default_profile_path

    try:
        # the profile chooses the devices it measures on, whatever the config names
        cfg = load_config(args.config, args.overrides, check_device=False)
        _check_profile_arguments(args)
        out = args.out or default_profile_path(args.config, args.scheduler)
        _refuse_existing(out, "a profile")
    except (ConfigError, ValueError) as exc:
        return _bad_input(str(exc))
    try:
        _measure(cfg, args, out)
    except ProfileError as exc:
        return _bad_input(str(exc))
    return EXIT_OK


def _refuse_existing(path: Path, what: str) -> None:
    """Measurements and plans already written are never replaced."""
    if path.exists():
        raise ValueError(
            f"{path} exists; it holds {what} already written. Give another --out, "
            f"or delete it first (nothing was measured or written)"
        )


def cmd_plan(args) -> int:
    from dask.utils import parse_bytes

    from tianji_dask.config import ConfigError, load_config
    from tianji_dask.deploy.planner import (
        PlanError,
        Profile,
        Resources,
        default_plan_path,
        make_plan,
        plan_table,
        profile_beside,
        save_plan,
    )
    from tianji_dask.deploy.profiling import ProfileError
    from tianji_dask.progress import plain_console

    args.gpu = args.gpus > 0
    try:
        cfg = load_config(args.config, args.overrides, check_device=False)  # the plan sets the devices
        _check_profile_arguments(args)
        mem = parse_bytes(args.memory_per_node) if args.memory_per_node else None
        res = Resources(
            cores=args.cores,
            nodes=args.nodes,
            cores_per_node=args.cores_per_node,
            memory_per_node=mem,
            gpus=args.gpus,
        )
        out = args.out or default_plan_path(args.config, args.cores, args.gpus)
        _refuse_existing(out, "a plan")
    except (ConfigError, PlanError, ValueError) as exc:
        return _bad_input(str(exc))
    path = args.profile or profile_beside(out)
    try:
        if path.exists():
            print(f"tianji-dask: planning from the profile {path}", file=sys.stderr)
        else:
            print(f"tianji-dask: no profile at {path}: measuring one on this machine", file=sys.stderr)
            _measure(cfg, args, path)
        profile = Profile.load(path, cfg)
        if args.batch_sizes:  # a profile measured before: the plan chooses among these only
            profile = profile.with_batch_sizes(_batch_sizes(args.batch_sizes))
        plan = make_plan(cfg, profile, res)
    except (PlanError, ProfileError) as exc:
        return _bad_input(str(exc))
    console = plain_console(stderr=False)
    console.print(plan_table(plan))
    for line in plan.explanation:
        console.print(f"  {line}")
    console.print("  predicted: " + ", ".join(f"{k} {v:,.0f}" for k, v in plan.predicted.items()))
    save_plan(plan, out)
    console.print(f"plan: {out}  (tianji-dask train {args.config} --plan {out})")
    return EXIT_OK


def cmd_sweep(args) -> int:
    from tianji_dask.config import ConfigError
    from tianji_dask.runtime.sweep.runner import plan_sweep, resume_sweep

    if args.slurm and args.scheduler:
        return _bad_input(
            "--slurm submits the sweep's own Slurm jobs; --scheduler runs on a cluster of yours: give one"
        )
    if (args.plan or args.walltime) and not args.slurm:
        return _bad_input("--plan and --walltime size the Slurm jobs of a sweep: add --slurm")
    if args.resume is not None:
        given = [
            name
            for name, value in (
                ("CONFIG", args.config),
                ("--grid", args.grid),
                ("--grid-file", args.grid_file),
                ("--set", args.overrides),
                ("--out", args.out),
            )
            if value
        ]
        if given:
            return _bad_input(
                f"--resume {args.resume} runs the sweep its sweep.yaml describes; drop {', '.join(given)} "
                "(or start a new sweep without --resume)"
            )
    elif args.config is None:
        return _bad_input("a sweep needs a config file: tianji-dask sweep CONFIG --grid key.path=V1,V2,...")
    try:
        if args.resume is not None:
            planned = resume_sweep(args.resume)
        else:
            planned = plan_sweep(args.config, args.grid, args.overrides, args.out, grid_file=args.grid_file)
        parallel = args.parallel if args.parallel is not None else planned.parallel if args.resume else 1
        if parallel < 1:
            raise ConfigError(f"--parallel: parallel={parallel}: at least one run at a time")
    except ConfigError as exc:
        return _bad_input(str(exc))
    if args.resume is not None:
        _resume_plan(planned)
        if not planned.left:
            return _sweep_outcome(planned)
    return _run_sweep(args, planned, parallel)


def _resume_plan(planned) -> None:
    done = [r for r in planned.runs if r.finished]
    going_on = [r.name for r in planned.runs if not r.finished and r.continues]
    new = [r.name for r in planned.runs if not r.finished and not r.continues]
    print(
        f"sweep --resume {planned.out}: {len(done)} of {len(planned.runs)} runs finished, left as they are", flush=True
    )
    if going_on:
        print(f"  continuing from their checkpoints: {', '.join(going_on)}", flush=True)
    if new:
        print(f"  starting: {', '.join(new)}", flush=True)


def _run_sweep(args, planned, parallel: int) -> int:
    from tianji_dask.config import ConfigError
    from tianji_dask.deploy.planner import PlanError, load_plan
    from tianji_dask.runtime.sweep.progress import SweepProgress

    view = SweepProgress()
    client = None
    interrupted = None
    try:
        if args.slurm:
            from tianji_dask.deploy.slurm_sweep import run_on_slurm

            site = {"walltime": args.walltime} if args.walltime else {}
            plan = load_plan(args.plan) if args.plan else None
            run_on_slurm(planned, parallel=parallel, plan=plan, on_line=view.line, on_runs=view.update, **site)
        else:
            if args.scheduler:
                from distributed import Client

                client = Client(args.scheduler, timeout=10)
            planned.run(parallel, client, on_line=view.line, on_runs=view.update)
    except (ConfigError, PlanError) as exc:
        view.close()
        return _bad_input(str(exc))
    except OSError as exc:  # the scheduler could not be reached
        view.close()
        return _bad_input(f"--scheduler {args.scheduler}: {exc}")
    except KeyboardInterrupt as exc:
        interrupted = exc.args[0] if exc.args else signal.SIGINT
    except Exception as exc:
        if not args.slurm:
            raise
        view.close()
        print(f"tianji-dask: error: the Slurm jobs did not start: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        view.close()
        if client is not None:
            client.close()
    return _sweep_outcome(planned, interrupted)


def _sweep_outcome(done, interrupted: int | None = None) -> int:
    from tianji_dask.results.shell import print_table

    if any((r.run_dir / "metrics.nc").exists() for r in done.runs):
        print_table(done.open().tianji.summary())
        sys.stdout.flush()
    left = done.left
    finished = len(done.runs) - len(left)
    print(f"sweep: {finished} of {len(done.runs)} runs finished; results in {done.out}", flush=True)
    ended = [f"{r.name} ({r.status})" for r in left if r.status != "waiting"]
    if ended:
        print(f"sweep: stopped or failed: {', '.join(ended)}", flush=True)
    if left:
        print(f"sweep: to finish the {len(left)} left: tianji-dask sweep --resume {done.out}", flush=True)
    if interrupted is not None:
        return 128 + int(interrupted)
    return EXIT_FAILED if left else EXIT_OK


def cmd_eval(args) -> int:
    from tianji_dask.config import ConfigError
    from tianji_dask.results.evaluation import evaluate

    def said(k: int, ret: float, length: int) -> None:
        print(f"episode {k}/{args.episodes}: return {ret:.1f}, length {length}", flush=True)

    try:
        result = evaluate(
            args.run_dir,
            episodes=args.episodes,
            envs=args.envs,
            epsilon=args.epsilon,
            seed=args.seed,
            device=args.device,
            out=args.out,
            video=args.video,
            which="latest" if args.latest else None,
            on_episode=said,
        )
    except ConfigError as exc:
        return _bad_input(str(exc))
    print(result.summary())
    which = "the best evaluated while it trained" if result.checkpoint != "checkpoint" else "the latest"
    print(f"played {args.run_dir / result.checkpoint}, {which}")
    if result.video is not None:
        print(f"video: {result.video_frames} frames, one per step of its episode, in {result.video}")
    print(f"wrote {result.path}")
    return EXIT_OK


def cmd_job_script(args) -> int:
    from tianji_dask.config import ConfigError, load_config
    from tianji_dask.deploy.planner import PlanError, load_plan
    from tianji_dask.deploy.slurm import job_scripts, plan_from_config

    try:
        cfg = load_config(args.config, args.overrides, check_device=False)  # the jobs' nodes have the devices
        plan = load_plan(args.plan) if args.plan else None
        if plan is not None:
            cfg = plan.apply(cfg)
    except (ConfigError, PlanError) as exc:
        return _bad_input(str(exc))
    plan = plan or plan_from_config(cfg)
    kw = {"walltime": args.walltime} if args.walltime else {}
    for name, script in job_scripts(plan, **kw):
        print(f"# ---- {name}\n{script}")
    return EXIT_OK


def _report(result) -> None:
    from tianji_dask.progress import summary_line

    print(summary_line(result), file=sys.stderr)
    print(f"results: {result.run_dir}", file=sys.stderr)
    if result.error:
        print(f"error: {result.error}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    # SIGTERM (kill, scancel, a batch system's time limit) ends a command like Ctrl-C does; a
    # run's worker processes ignore both (tianji_dask.runtime.processes.worker_signals): the driver stops them.
    # SIGINT too, even where it came ignored (a job a script started with `&`): `kill -INT` stops it
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    # `kill -USR1 PID`: every thread's stack on stderr, for a command that seems stuck; it goes on
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        return _main(argv)
    except KeyboardInterrupt as exc:  # before a run started, or outside train: nothing to save
        signum = exc.args[0] if exc.args else signal.SIGINT
        print(f"tianji-dask: {signal.Signals(signum).name}: stopped", file=sys.stderr)
        return 128 + int(signum)


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "train":
        return cmd_train(args)
    if args.command == "profile":
        return cmd_profile(args)
    if args.command == "plan":
        return cmd_plan(args)
    if args.command == "job-script":
        return cmd_job_script(args)
    if args.command == "eval":
        return cmd_eval(args)
    if args.command == "sweep":
        return cmd_sweep(args)
    if args.command in ("summary", "plot"):
        return _results_command(args)
    return EXIT_BAD_INPUT


def _results_command(args) -> int:
    from tianji_dask.results import shell

    try:
        if args.command == "summary":
            shell.print_summary(args.runs, target=args.target, as_csv=args.csv)
        else:
            print(shell.write_plot(args.runs, y=args.y, x=args.x, out=args.out))
    except shell.ResultsInputError as exc:
        return _bad_input(str(exc))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
