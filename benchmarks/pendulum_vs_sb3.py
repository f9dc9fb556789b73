"""Pendulum-v1: tianji-dask's PPO (the Gaussian policy) against stable-baselines3's PPO, wall time to
a 100-episode mean return of ``--target`` (-200).

    python benchmarks/pendulum_vs_sb3.py --seeds 0 1 2 3 4 --out benchmarks/results/pendulum_vs_sb3
    python benchmarks/pendulum_vs_sb3.py --seeds 0 --target -800 --max-env-steps 40000 \\
        --out benchmarks/results/tmp/pendulum_vs_sb3_smoke          # a smoke run: proves the wiring

Per seed, both systems train until the target, ``--max-seconds`` or ``--max-env-steps``, one after
the other, the order alternating from seed to seed so both see the same machine conditions:

* tianji-dask: ``--config`` (configs/pendulum_ppo.yaml) through ``time_to_target.py`` in a process
  of its own (``vs_single.run_tianji``; its run directory under ``<out>/tianji-seed<N>/runs``),
  on its own LocalCluster; the clock starts just before the cluster is built (its start-up counts).
* stable-baselines3: ``benchmarks/peers/ppo_sb3.py`` with rl-baselines3-zoo's tuned
  Pendulum-v1 hyperparameters (hyperparams/ppo.yml, quoted there), run by ``--sb3-python``
  (default: ``$TIANJI_SB3_PYTHON``, else ``.venv-sb3/bin/python`` in the checkout), a virtual
  environment apart from the project's (python3 -m venv .venv-sb3; .venv-sb3/bin/pip install
  torch==2.13.0 stable-baselines3); its clock starts just before its envs and model are built.

Both stop at the first 100-episode window whose mean reaches the target. Writes into ``--out``,
after every run (a stopped benchmark keeps what it measured): ``pendulum_vs_sb3.json`` (every run,
each system's medians, and the ratio tianji-dask / stable-baselines3 of the median times and env
steps; a run that missed the target counts as longer than ``--max-seconds``, which makes a median
a lower bound and the ratio a bound, flagged ``*_at_least`` / ``*_at_most``) and
``pendulum_vs_sb3.nc`` (dims ``system`` x ``seed``). Prints the medians and the ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import xarray as xr
from vs_single import alternate, compare, run_meta, run_tianji, system_seed_grid

from tianji_dask.results.provenance import portable_path, provenance_attrs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SYSTEMS = ("tianji", "sb3")


def run_sb3(seed: int, args, log: Path) -> dict:
    cmd = [str(args.sb3_python), "-u", str(HERE / "peers" / "ppo_sb3.py"), "--env", "Pendulum-v1", "--seed", str(seed)]
    cmd += ["--target", str(args.target), "--max-seconds", str(args.max_seconds)]
    cmd += ["--max-env-steps", str(args.max_env_steps), "--threads", str(args.sb3_threads)]
    with log.open("w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("{")]
    if rc != 0 or not lines:
        return {"system": "sb3", "seed": seed, "error": f"exit {rc}, see {log}"}
    res = json.loads(lines[-1])
    curve = res["curve"]
    return {
        "system": "sb3",
        "seed": seed,
        "time_to_target_s": math.nan if res["seconds_to_target"] is None else res["seconds_to_target"],
        "env_steps_to_target": math.nan if res["env_steps_to_target"] is None else res["env_steps_to_target"],
        "wall_s": res["wall_s"],
        "env_steps": res["env_steps"],
        "env_steps_per_s": res["env_steps_per_s"],
        "return_mean_100": res["return_mean_100"],
        "torch_threads": res["torch_threads"],
        "curve": {"time": [c[0] for c in curve], "env_steps": [c[1] for c in curve], "return": [c[2] for c in curve]},
    }


def write(out: Path, rows: list[dict], meta: dict, seeds: list[int]) -> dict:
    summary = compare(rows, SYSTEMS, dict.fromkeys(SYSTEMS, meta["max_seconds"]))
    (out / "pendulum_vs_sb3.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "runs": rows}, indent=2, default=str)
    )
    variables = {
        "time_to_target_s": ("wall time to target (start-up included)", "s"),
        "env_steps_to_target": ("env steps at target", "1"),
        "env_steps_per_s": ("env steps per second over the run", "1/s"),
        "load_avg_1m": ("1-minute load average after the run", "1"),
    }
    ds = xr.Dataset(
        {
            k: (("system", "seed"), system_seed_grid(rows, SYSTEMS, seeds, k), {"long_name": n, "units": u})
            for k, (n, u) in variables.items()
        },
        coords={"system": list(SYSTEMS), "seed": seeds},
        attrs={k: json.dumps(v) if not isinstance(v, (int, float, str)) else v for k, v in meta.items()},
    )
    ds.to_netcdf(out / "pendulum_vs_sb3.nc", engine="netcdf4")
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--config", default="configs/pendulum_ppo.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="for tianji-dask only")
    p.add_argument("--target", type=float, default=-200.0)
    p.add_argument("--max-seconds", type=float, default=600.0)
    p.add_argument("--max-env-steps", type=int, default=1_000_000)
    p.add_argument(
        "--sb3-python",
        type=Path,
        default=Path(os.environ.get("TIANJI_SB3_PYTHON", ROOT / ".venv-sb3" / "bin" / "python")),
        help="stable-baselines3's interpreter (default: $TIANJI_SB3_PYTHON, else .venv-sb3/bin/python)",
    )
    p.add_argument("--sb3-threads", type=int, default=0, help="stable-baselines3's torch threads (0: torch's default)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/pendulum_vs_sb3"))
    args = p.parse_args(argv)
    if not (ROOT / args.config).is_file():
        p.error(f"--config {args.config}: no such file under {ROOT}")
    if not args.sb3_python.is_file():
        p.error(
            f"--sb3-python {args.sb3_python}: not found; make it with python3 -m venv .venv-sb3 && "
            ".venv-sb3/bin/pip install torch==2.13.0 stable-baselines3 (in the checkout), or point "
            "--sb3-python or TIANJI_SB3_PYTHON at an interpreter that has stable-baselines3"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    # vs_single's tianji-dask run (time_to_target.py in a process of its own) with the env-step budget
    tianji_args = argparse.Namespace(**vars(args))
    tianji_args.overrides = [f"stop.max_env_steps={args.max_env_steps}", *args.overrides]
    meta = {
        **run_meta(args),
        "max_env_steps": args.max_env_steps,
        "sb3_python": portable_path(args.sb3_python),
        **provenance_attrs(),
    }

    def run(system: str, seed: int) -> dict:
        if system == "sb3":
            return run_sb3(seed, args, args.out / f"sb3-seed{seed}.log")
        return run_tianji(seed, tianji_args, args.out / f"tianji-seed{seed}", args.out / f"tianji-seed{seed}.log")

    summary = alternate(args.seeds, SYSTEMS, run, lambda rows: write(args.out, rows, meta, args.seeds))
    for s in SYSTEMS:
        m = summary[s]
        bound = ">=" if m.get("median_time_to_target_at_least") else ""
        print(
            f"{s:>6}: median time to target {bound}{m.get('median_time_to_target_s', math.nan):.1f} s, "
            f"median env steps {m.get('median_env_steps_to_target', math.nan):,.0f}, "
            f"reached {m.get('reached', 0)}/{m.get('runs', 0)}"
        )
    if "ratio_time_to_target" in summary:
        bound = {"ratio_time_to_target_at_most": "at most ", "ratio_time_to_target_at_least": "at least "}
        word = "".join(w for k, w in bound.items() if summary[k])
        print(
            f"ratio tianji-dask / stable-baselines3: time {word}{summary['ratio_time_to_target']:.2f}, "
            f"env steps {summary['ratio_env_steps_to_target']:.2f}"
        )
    return 0 if all(summary[s].get("runs") for s in SYSTEMS) else 1


if __name__ == "__main__":
    sys.exit(main())
