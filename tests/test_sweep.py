"""``tianji-dask sweep``: a grid of runs, K at a time, each in its own directory; bad grids are
refused before anything is written; a run killed mid-way is recorded failed and the others reach
their target; ``open_runs`` stacks them."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import subprocess
import sys
import threading

import pytest
import xarray as xr
from conftest import ROOT, cli_here, wait_until
from rich.console import Console

from tianji_dask.results.analysis import open_runs
from tianji_dask.results.shell import print_table
from tianji_dask.runtime.driver import FINISHED
from tianji_dask.runtime.sweep.progress import SweepProgress
from tianji_dask.runtime.sweep.runner import plan_sweep

CONFIG = "configs/cartpole_dqn.yaml"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([], "a sweep needs at least one --grid"),
        (["--grid", "algo.hidden_sizes=[64,64"], "unbalanced brackets in the values; expected --grid key.path=V1,V2"),
        (["--grid", "algo.hidden_sizes=[64,64;[32]"], "the value '[64,64' of algo.hidden_sizes is not valid YAML"),
        (["--grid", "seed=0,0"], "a value of seed is given twice"),
        (
            ["--grid", "env.id=Cart/Pole,Cart-Pole"],
            "env.id=Cart/Pole and env.id=Cart-Pole would share the directory env.id=Cart-Pole",
        ),
        (["--grid", "seed=0,1", "--parallel", "0"], "parallel=0"),
        (["--grid-file", "missing.yaml"], "--grid-file missing.yaml: no such file; expected a YAML mapping"),
        (["--grid", "seed"], "expected --grid key.path=V1,V2"),
        (["--grid", "seed=0,,1"], "expected --grid key.path=V1,V2"),
        (["--grid", "seed=0", "--grid", "seed=1"], "seed is given twice"),
        (["--grid", "algo.nope=1,2"], "sweep run algo.nope=1: "),
        (["--grid", "seed=0,1", "--slurm", "--scheduler", "tcp://127.0.0.1:1"], "give one"),
        (["--grid", "seed=0,1", "--walltime", "00:10:00"], "size the Slurm jobs of a sweep: add --slurm"),
        (["--grid", "topology.actors=1,2", "--slurm"], "needs other Slurm jobs than topology.actors=1"),
    ],
)
def test_a_bad_sweep_is_refused_before_anything_is_written(tmp_path, args, said):
    r = cli_here("sweep", CONFIG, *args, "--out", tmp_path / "sweep")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert said in r.stderr and not (tmp_path / "sweep").exists()


def test_a_sweep_never_writes_into_a_directory_with_files(tmp_path):
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "notes.txt").write_text("mine")
    r = cli_here("sweep", CONFIG, "--grid", "seed=0,1", "--out", tmp_path / "sweep")
    assert r.returncode == 2 and "exists and is not empty" in r.stderr
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["notes.txt"]


def test_the_grid_is_every_combination_each_in_its_own_directory(tmp_path):
    planned = plan_sweep(CONFIG, ["seed=0,1", "algo.lr=1e-4,3e-4"], ["stop.max_env_steps=1000"], tmp_path / "s")
    assert [r.name for r in planned.runs] == [
        "seed=0__algo.lr=1e-4",
        "seed=0__algo.lr=3e-4",
        "seed=1__algo.lr=1e-4",
        "seed=1__algo.lr=3e-4",
    ]
    assert [(r.cfg.seed, r.cfg.algo.lr, r.cfg.stop.max_env_steps) for r in planned.runs][1] == (0, 3e-4, 1000)
    assert len({r.run_dir for r in planned.runs}) == 4 and not (tmp_path / "s").exists()


@pytest.mark.integration
@pytest.mark.timeout(280)
def test_list_values_in_the_grid_by_semicolons_brackets_or_a_grid_file(tmp_path):
    by_semicolons = plan_sweep(CONFIG, ["algo.hidden_sizes=[64,64];[32]", "seed=0,1"], out=tmp_path / "a")
    by_brackets = plan_sweep(CONFIG, ["algo.hidden_sizes=[64,64],[32]", "seed=0,1"], out=tmp_path / "b")
    (tmp_path / "grid.yaml").write_text("algo:\n  hidden_sizes: [[64, 64], [32]]\nseed: [0, 1]\n")
    from_file = plan_sweep(CONFIG, [], out=tmp_path / "c", grid_file=tmp_path / "grid.yaml")
    for planned in (by_semicolons, by_brackets, from_file):
        assert [r.name for r in planned.runs] == [
            "algo.hidden_sizes=64-64__seed=0",
            "algo.hidden_sizes=64-64__seed=1",
            "algo.hidden_sizes=32__seed=0",
            "algo.hidden_sizes=32__seed=1",
        ]
        assert [(r.cfg.algo.hidden_sizes, r.cfg.seed) for r in planned.runs] == [
            ([64, 64], 0),
            ([64, 64], 1),
            ([32], 0),
            ([32], 1),
        ]


@pytest.mark.parametrize(
    ("grid_file", "said"),
    [
        ("seed: 3\n", "--grid-file GRID: seed is 3, not a list of values; expected a YAML mapping of key.path"),
        ("- seed\n", "--grid-file GRID: expected a YAML mapping of key.path to a list of values"),
        ("seed: [0, 1]\n", "--grid-file GRID: seed is given twice"),
        ("algo.nope: [1, 2]\n", "sweep run seed=0__algo.nope=1: "),
        ("seed: [0, 1\n", "--grid-file GRID: cannot be read"),
    ],
)
def test_a_bad_grid_file_is_refused_naming_the_form(tmp_path, grid_file, said):
    (tmp_path / "grid.yaml").write_text(grid_file)
    r = cli_here("sweep", CONFIG, "--grid", "seed=0", "--grid-file", tmp_path / "grid.yaml", "--out", tmp_path / "s")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert said.replace("GRID", str(tmp_path / "grid.yaml")) in r.stderr and not (tmp_path / "s").exists()


def test_four_seeds_two_at_a_time_one_killed_the_others_reach_their_target(tmp_path):
    from distributed import Client

    sets = ["stop.target_return=60", "stop.max_env_steps=80000", "stop.max_seconds=150", "run.max_restarts=0"]
    planned = plan_sweep(CONFIG, ["seed=0,1,2,3"], sets, tmp_path / "sweep")
    lines: list[str] = []
    runner = threading.Thread(target=planned.run, kwargs={"parallel": 2, "on_line": lines.append})
    runner.start()
    victim = planned.runs[1]
    assert wait_until(lambda: victim.handle is not None and victim.handle.scheduler_address, 120)
    assert wait_until(lambda: victim.handle.recorder.tally.env_steps > 0, 120)  # mid-way: it is stepping
    with Client(victim.handle.scheduler_address, timeout=10) as client:
        pids = list(client.run(os.getpid).values())
    assert pids
    for pid in pids:  # its workers killed: with run.max_restarts=0 the run fails
        os.kill(pid, signal.SIGKILL)
    runner.join(240)
    assert not runner.is_alive()
    statuses = {r.name: r.status for r in planned.runs}
    assert statuses == {
        "seed=0": "target_reached",
        "seed=1": "failed",
        "seed=2": "target_reached",
        "seed=3": "target_reached",
    }, (
        statuses,
        lines,
    )
    assert sum(line.startswith("[") and "started" in line for line in lines) == 4
    ds = planned.open()
    assert ds.sizes["run"] == 4 and sorted(ds["status"].values.tolist()).count("failed") == 1
    assert sorted(ds["seed"].values.tolist()) == [0, 1, 2, 3]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_dask_stays_quiet_until_the_last_of_two_clusters_has_closed():
    """B1: two runs' LocalClusters in one process; the first to close must not turn Dask's INFO
    log back on for the other, whose shutdown would print some thirty INFO lines."""
    from tianji_dask.runtime.cluster.cluster import local_cluster

    handlers = [h for h in logging.getLogger("distributed").handlers if isinstance(h, logging.StreamHandler)]
    assert handlers, "Dask's logging config installs a stream handler on 'distributed'"
    levels = [h.level for h in handlers]
    printed = io.StringIO()
    streams = [h.setStream(printed) for h in handlers]
    try:
        first = local_cluster(1, dashboard=False, preload_roles=False)
        second = local_cluster(1, dashboard=False, preload_roles=False)
        first.close()
        second.close()
    finally:
        for h, stream in zip(handlers, streams):
            h.setStream(stream)
    assert " - INFO - " not in printed.getvalue(), printed.getvalue()
    assert [h.level for h in handlers] == levels  # the last to close put back what the first found


def test_the_live_view_on_a_terminal_and_in_a_log():
    """While runs go: in a log one line per running run, prefixed by its name, with its env
    steps, return(100) and the ETA by its nearest stop budget; on a terminal a table of them."""
    planned = plan_sweep(CONFIG, ["seed=0,1"], ["stop.max_env_steps=10000"], "unused")
    running, starting = planned.runs
    running.status, running.row = "running", {"time": 5.0, "env_steps": 2500, "return_mean_100": 31.3}
    starting.status = "running"  # no metrics row yet

    log = io.StringIO()
    view = SweepProgress(Console(file=log, width=120), every_s=0.0)
    view.update(planned.runs)
    view.close()
    assert log.getvalue().splitlines() == [
        "[1/2] seed=0: 2,500 env steps, return(100) 31.3/300, 25% of max_env_steps, ETA 0:15",
        "[2/2] seed=1: starting",
    ]

    screen = io.StringIO()
    view = SweepProgress(Console(file=screen, width=120, force_terminal=True, color_system=None))
    view.update(planned.runs)
    view.close()
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    assert re.search(r"\[1/2\] seed=0 +2,500 +31.3/300 +25% of max_env_steps .* 0:15", shown), shown
    assert re.search(r"\[2/2\] seed=1 +- +- +starting", shown) and "2 running, 0 ended, 0 waiting" in shown, shown


class _InterruptedFlush(io.StringIO):
    """A log whose first flush is interrupted, as a Ctrl-C lands after a line was written."""

    interrupted = False

    def flush(self) -> None:
        if not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt


def test_a_line_interrupted_as_it_is_written_is_not_written_again_with_the_next():
    """A sweep's Ctrl-C lands anywhere, also between a line's write and its flush: the next line
    must not bring the first back (the sweep test sends its signal on seeing that line)."""
    log = _InterruptedFlush()
    view = SweepProgress(Console(file=log, width=120))
    with pytest.raises(KeyboardInterrupt):
        view.line("[1/4] seed=0: max_seconds after 1,264 env steps")
    view.line("interrupted: stopping 1 running run(s)")
    assert log.getvalue().splitlines() == [
        "[1/4] seed=0: max_seconds after 1,264 env steps",
        "interrupted: stopping 1 running run(s)",
    ]


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["--resume", "{tmp}/nowhere"], "--resume {tmp}/nowhere: no such directory; give the directory a sweep wrote"),
        (["--resume", "{tmp}"], "--resume {tmp}: not a sweep's directory (no sweep.yaml)"),
        (["--resume", "{tmp}/damaged"], "sweep.yaml cannot be read"),
        (["--resume", "{tmp}/sweep", "--grid", "seed=0"], "runs the sweep its sweep.yaml describes; drop --grid"),
        ([CONFIG, "--resume", "{tmp}/sweep", "--out", "x"], "drop CONFIG, --out"),
        (["--resume", "{tmp}/sweep"], "seed=1 holds notes.txt but no results (metrics.nc); move it away"),
    ],
)
def test_a_bad_resume_is_refused_with_the_fix(tmp_path, given, said):
    plan_sweep(CONFIG, ["seed=0,1"], out=tmp_path / "sweep").write_manifest(parallel=2)
    (tmp_path / "sweep" / "seed=1").mkdir()
    (tmp_path / "sweep" / "seed=1" / "notes.txt").write_text("mine")
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "sweep.yaml").write_text("grid: [\n")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    r = cli_here("sweep", *(a.format(tmp=tmp_path) for a in given))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert said.format(tmp=tmp_path) in r.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_sweep_still_running_elsewhere_is_not_resumed(tmp_path):
    from tianji_dask.runtime.sweep.manifest import held

    plan_sweep(CONFIG, ["seed=0,1"], out=tmp_path / "sweep").write_manifest(parallel=2)
    with held(tmp_path / "sweep"):  # as a sweep's process holds it while its runs go
        r = cli_here("sweep", "--resume", tmp_path / "sweep")
    assert r.returncode == 2 and "is still running in another process" in r.stderr, r.stderr
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["sweep.yaml"]


def _files(run_dir):
    return {p.relative_to(run_dir): (p.stat().st_mtime_ns, p.stat().st_size) for p in run_dir.rglob("*") if p.is_file()}


def _status(run_dir):
    import xarray as xr

    with xr.open_dataset(run_dir / "metrics.nc", engine="netcdf4") as ds:
        return ds.attrs["status"], ds.attrs.get("continued_at_s")


@pytest.mark.integration
@pytest.mark.timeout(300)
def _as_a_scripts_background_job() -> None:
    """SIGINT ignored, as a non-interactive shell starts ``cmd &`` (and as a test runner's
    worker may pass it on): ``kill -INT`` must stop the sweep all the same."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_an_interrupted_sweep_resumes_exactly_the_runs_left(tmp_path):
    """The real thing: ``tianji-dask sweep`` of four short runs two at a time, SIGINT once the
    first has ended; ``sweep --resume`` then continues the stopped ones from their checkpoints,
    starts those never started and leaves the finished one's files alone. Neither prints a Dask
    INFO line; both end with the table of ``open_runs(SWEEP_DIR/'*').tianji.summary()``."""
    out = tmp_path / "sweep"
    env = {**os.environ, "COLUMNS": "160"}
    first = subprocess.Popen(
        [sys.executable, "-m", "tianji_dask.cli", "sweep", CONFIG, "--grid", "stop.max_seconds=3,10,4,5"]
        + ["--parallel", "2", "--set", "stop.target_return=null", "--out", str(out)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        preexec_fn=_as_a_scripts_background_job,
    )
    said = []
    assert first.stdout is not None
    for line in first.stdout:
        said.append(line)
        if line.startswith("[1/4] stop.max_seconds=3: max_seconds after"):
            first.send_signal(signal.SIGINT)
            # a sweep that has not ended 20 s after the signal prints every thread's stack
            # (SIGUSR1, faulthandler) into its output, which the assertion below shows
            threading.Timer(20, lambda: first.poll() is None and first.send_signal(signal.SIGUSR1)).start()
    assert first.wait(60) == 130, "".join(said)
    said_first = "".join(said)
    runs = {name: out / f"stop.max_seconds={name}" for name in ("3", "10", "4", "5")}
    assert _status(runs["3"])[0] == "max_seconds" and _status(runs["10"])[0] == "stopped", said_first
    assert not runs["5"].exists(), said_first  # its turn never came
    left = {n for n, d in runs.items() if not (d / "metrics.nc").exists() or _status(d)[0] not in FINISHED}
    assert f"to finish the {len(left)} left: tianji-dask sweep --resume {out}" in said_first
    before = {n: _files(d) for n, d in runs.items() if d.exists()}
    manifest = (out / "sweep.yaml").read_bytes()

    second = subprocess.run(
        [sys.executable, "-m", "tianji_dask.cli", "sweep", "--resume", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
        stdin=subprocess.DEVNULL,
    )
    said_second = second.stdout + second.stderr
    assert second.returncode == 0, said_second
    went = {
        m.group(1)
        for m in re.finditer(r"\] stop.max_seconds=(\d+): (?:started|continued from [\d,]+ env steps) in", said_second)
    }
    assert went == left, said_second
    for name, run_dir in runs.items():
        status, continued = _status(run_dir)
        assert status in FINISHED, (name, status, said_second)
        if name not in left:
            assert _files(run_dir) == before[name]  # never touched
        elif "metrics.nc" in {str(p) for p in before.get(name, {})}:
            assert continued, name  # continued from its checkpoint, not started over
    assert (out / "sweep.yaml").read_bytes() == manifest
    for text in (said_first, said_second):
        assert " - INFO - " not in text and "distributed.scheduler" not in text, text
    progress = r"\] stop.max_seconds=10: [\d,]+ env steps, return\(100\) \S+, \d+% of max_seconds, ETA \d+:\d\d"
    assert re.search(progress, said_first + said_second), said_first + said_second

    table = io.StringIO()
    print_table(open_runs(out / "*").tianji.summary(), file=table)
    assert table.getvalue() in second.stdout, (table.getvalue(), second.stdout)
    assert f"sweep: {4 - len(left)} of 4 runs finished" in said_first and "sweep: 4 of 4 runs finished" in second.stdout
    print(said_first, said_second, sep="\n---- sweep --resume\n")


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_run_stopped_as_it_started_starts_again_when_the_sweep_resumes(tmp_path):
    """Ctrl-C while a run's cluster starts leaves it stopped with no checkpoint (nothing trained):
    ``sweep --resume`` starts it again in its own directory instead of refusing to continue it."""
    from tianji_dask.runtime.driver import train
    from tianji_dask.runtime.sweep.runner import resume_sweep

    planned = plan_sweep(CONFIG, ["seed=0"], ["stop.max_env_steps=2000", "stop.target_return=null"], tmp_path / "s")
    planned.write_manifest(parallel=1)
    (only,) = planned.runs
    run = train(only.cfg, out=only.run_dir)
    run.stop()  # at once: before its learner's first update
    assert run.wait(timeout=120).status == "stopped"
    assert not (only.run_dir / "checkpoint").exists()

    resumed = resume_sweep(tmp_path / "s")
    assert [r.continues for r in resumed.runs] == [False]
    done = resumed.run(1)
    (again,) = done.runs
    assert again.status == "max_env_steps", again.error
    with xr.open_dataset(again.run_dir / "metrics.nc", engine="netcdf4") as ds:
        assert ds.attrs["status"] == "max_env_steps" and int(ds["env_steps"].values[-1]) >= 2000
    assert (again.run_dir / "checkpoint").is_dir()
