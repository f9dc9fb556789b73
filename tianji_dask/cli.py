"""``tianji-dask``: the command line, a thin layer over :func:`tianji_dask.driver.train`.

Exit codes: 0 the run finished (target reached or a budget spent); 1 it failed
during the run; 2 bad input (nothing started, nothing written); 130 stopped by
Ctrl-C (results written).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 too; keep its usage line, drop nothing
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tianji-dask", description="TianJi-style distributed deep RL on Dask.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    t = sub.add_parser("train", help="train an agent from a config file",
                       description="Train an agent. With no --scheduler, starts a LocalCluster on 127.0.0.1.")
    t.add_argument("config", help="experiment YAML file, e.g. configs/cartpole_dqn.yaml")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config value (repeatable), e.g. --set algo.lr=1e-3")
    t.add_argument("--out", type=Path, default=None,
                   help="run directory (must be new or empty); default runs/<env>__<algo>__<seed>__<time>")
    g = t.add_mutually_exclusive_group()
    g.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="use the Dask cluster at this scheduler address instead of a LocalCluster")
    g.add_argument("--serial", action="store_true",
                   help="run the serial reference in this process (no Dask)")
    b = sub.add_parser("bench", help="run a benchmark (docs/benchmarks.md)",
                       description="Benchmarks of the system itself; each writes NetCDF, JSON and PNG results.")
    bsub = b.add_subparsers(dest="bench", required=True, parser_class=_Parser)
    from tianji_dask.bench.comm import add_arguments as add_comm_arguments

    c = bsub.add_parser("comm", help="the paper's virtual communication experiment (Fig. 5, equation 1)",
                        description="Actors push messages through the trajectory channel into one inbox until N "
                                    "arrived; raw TCP between plain processes is the anchor. Sweeps message size, "
                                    "actors x sample time, alternative transports and 100-byte messages.")
    add_comm_arguments(c)
    return p


def _bad_input(message: str) -> int:
    print(f"tianji-dask: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def cmd_train(args) -> int:
    from tianji_dask.config import ConfigError, load_config
    from tianji_dask.rundir import RunDirExists

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        return _bad_input(str(exc))
    if args.out is not None and args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        return _bad_input(f"--out {args.out} exists and is not an empty directory; "
                          f"choose a new directory (nothing was written)")

    import torch  # noqa: F401 - the driver saves the checkpoint with it; importing it at the end would delay shutdown by seconds

    from tianji_dask.driver import train
    from tianji_dask.progress import Progress

    client = None
    if args.scheduler:
        from distributed import Client

        try:
            client = Client(args.scheduler, timeout="10s")
        except (OSError, TimeoutError, ValueError) as exc:
            return _bad_input(f"cannot connect to the scheduler at {args.scheduler!r}: {exc}")

    progress = Progress(cfg.stop.target_return)
    try:
        run = train(cfg, client, out=args.out, serial=args.serial, on_row=progress.update,
                    on_event=progress.event)
    except (RunDirExists, ConfigError) as exc:
        progress.close()
        return _bad_input(str(exc))
    progress.event(f"run directory: {run.run_dir}")
    interrupted = False
    try:
        result = run.wait()
    except KeyboardInterrupt:
        interrupted = True
        progress.event("interrupted: stopping all hosts and writing results...")
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not break the cleanup
        run.stop("stopped")
        result = run.wait()
    finally:
        progress.close()
        if client is not None:
            client.close()
    _report(result)
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if result.ok else EXIT_FAILED


def _report(result) -> None:
    ttt = result.time_to_target_s
    ttt_text = "not reached" if math.isnan(ttt) else f"{ttt:.1f} s"
    print(f"{result.status}: {result.env_steps:,} env steps in {result.wall_s:.1f} s, "
          f"return(100) {result.return_mean_100:.1f}, time to target {ttt_text}", file=sys.stderr)
    print(f"results: {result.run_dir}", file=sys.stderr)
    if result.error:
        print(f"error: {result.error}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "train":
        return cmd_train(args)
    if args.command == "bench" and args.bench == "comm":
        from tianji_dask.bench.comm import main_from_args

        return main_from_args(args)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
