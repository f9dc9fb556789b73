"""Shared helpers of the end-to-end tests: the reference config, the CLI, and one checker of a
run directory against docs/metrics.md (so a metric added to the code but not to the docs, or the
other way round, fails every run test)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import distributed  # noqa: F401 - imported before pytest's capture handler is on the root logger (below)
import numpy as np
import pytest

from tianji_dask.runtime.processes import fork_server

# Dask puts its stream handler on the "distributed" logger as it is first imported, unless the
# root logger has a handler already (pytest's, during a test): imported here, as in a user's
# process, its log output is what the tests of it see.

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "cartpole_dqn.yaml"
METRICS_DOC = ROOT / "docs" / "metrics.md"

# Short runs: no learning target, a small warm-up, seconds instead of minutes.
SHORT = ("stop.target_return=null", "stop.max_env_steps=null", "algo.learning_starts=500")


def documented_tables() -> dict[str, dict[str, tuple[tuple[str, ...], str]]]:
    """``{"metrics.nc": {name: (dims, units)}, "episodes.nc": {name: ((episode,), units)}}``
    read from the variable tables of docs/metrics.md."""
    text = METRICS_DOC.read_text(encoding="utf-8")
    out = {}
    for section, dim in (("metrics.nc", None), ("episodes.nc", "episode")):
        body = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## )", text, re.S | re.M).group(1)
        table = {}
        for line in body.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            m = re.fullmatch(r"`([a-z0-9_]+)`", cells[0]) if len(cells) >= 3 else None
            if not m:
                continue
            if dim is None:  # | name | dims | units | meaning |
                dims, units = tuple(d.strip() for d in cells[1].split(",")), cells[2]
            else:  # | name | units | meaning |
                dims, units = (dim,), cells[1]
            table[m.group(1)] = (dims, units)
        assert table, f"no variable table under '## {section}' in {METRICS_DOC}"
        out[section] = table
    return out


def check_run_dir(run_dir: Path, cfg, *, mode: str, checkpoint: bool = True) -> dict:
    """Assert a finished run directory holds what docs/metrics.md promises; return numbers.

    config.yaml reloads to ``cfg``; metrics.nc and episodes.nc carry every documented variable
    with its dims and units, ``long_name``/``units`` on every variable and coordinate, the
    documented attrs, ``mode`` and a finished status without error; the checkpoint loads and
    matches the network shape.
    """
    import xarray as xr

    from tianji_dask.config import load_config
    from tianji_dask.results.checkpoint import load_checkpoint
    from tianji_dask.runtime.driver import FINISHED

    run_dir = Path(run_dir)
    assert run_dir.is_dir(), run_dir
    expected_files = {"config.yaml", "metrics.nc", "episodes.nc"} | ({"checkpoint"} if checkpoint else set())
    assert expected_files <= {p.name for p in run_dir.iterdir()}, sorted(p.name for p in run_dir.iterdir())
    assert not [p.name for p in run_dir.iterdir() if ".tmp" in p.name], "temporary files left behind"

    assert load_config(run_dir / "config.yaml") == cfg  # the resolved config round-trips

    docs = documented_tables()
    with xr.open_dataset(run_dir / "metrics.nc", engine="netcdf4") as ds:
        ds.load()
    with xr.open_dataset(run_dir / "episodes.nc", engine="netcdf4") as eps:
        eps.load()
    for name, data, table in (("metrics.nc", ds, docs["metrics.nc"]), ("episodes.nc", eps, docs["episodes.nc"])):
        missing = sorted(set(table) - set(data.data_vars))
        assert not missing, f"{name} lacks documented variables {missing}"
        undocumented = sorted(set(data.data_vars) - set(table))
        assert not undocumented, f"{name} has variables not in docs/metrics.md: {undocumented}"
        for var, (dims, units) in table.items():
            assert data[var].dims == dims, (name, var, data[var].dims, dims)
            assert data[var].attrs.get("units") == units, (name, var, data[var].attrs)
        for var in [*data.data_vars, *data.coords]:
            assert data[var].attrs.get("long_name"), (name, var, data[var].attrs)
            assert "units" in data[var].attrs, (name, var, data[var].attrs)
        for attr in (
            "run_name",
            "config_json",
            "t0_unix",
            "git_commit",
            "created",
            "time_to_target_s",
            "target_return",
            "torch_version",
            "tianji_dask_version",
            "status",
            "error",
            "env_id",
            "seed",
        ):
            assert attr in data.attrs, (name, attr)
        assert data.attrs["mode"] == mode
        assert data.attrs["env_id"] == cfg.env.id and data.attrs["seed"] == cfg.seed, data.attrs
        assert data.attrs["status"] in FINISHED and data.attrs["error"] == "", (name, data.attrs["status"])
        assert json.loads(data.attrs["config_json"]) == json.loads(cfg.to_json())
    assert ds.sizes["time"] >= 2
    assert np.all(np.diff(ds["time"].values) > 0)
    assert np.all(np.diff(ds["env_steps"].values) >= 0)
    assert np.all(np.diff(ds["updates"].values) >= 0)
    fill = ds["replay_fill"].values
    assert np.all(fill[~np.isnan(fill)] <= 1.0)
    assert np.nanmax(ds["replay_size"].values) <= cfg.algo.buffer_size

    numbers = {
        "rows": int(ds.sizes["time"]),
        "env_steps": int(ds["env_steps"][-1]),
        "updates": int(ds["updates"][-1]),
        "episodes": int(eps.sizes["episode"]),
        "last": {
            k: float(ds[k][-1])
            for k in ("env_fps", "receive_fps", "train_fps", "replay_ratio", "replay_size", "loss", "q_mean")
        },
        # the final row's rates span only the time from the previous row to the hosts'
        # final heartbeats (a few ms when the stop follows a heartbeat): judge "the end"
        # by the last two rows
        "end_rates": {k: [float(v) for v in ds[k].values[-2:]] for k in ("env_fps", "receive_fps", "train_fps")},
    }
    if eps.sizes["episode"]:
        assert np.all(eps["length"].values >= 1)
        assert np.all(eps["actor"].values >= 0) and np.all(eps["actor"].values < cfg.topology.actors)
        assert int(ds["episodes"][-1]) == eps.sizes["episode"]

    if checkpoint:
        state, meta = load_checkpoint(run_dir / "checkpoint")
        assert {"online", "target", "optim_state"} <= set(state)
        assert meta["format_version"] == 1
        assert meta["env_id"] == cfg.env.id and meta["algo"] == cfg.algo.name
        assert meta["updates"] == numbers["updates"] > 0
        online = state["online"]
        widths = [t.shape[0] for k, t in online.items() if k.endswith(".bias")]
        assert widths[:-1] == list(cfg.algo.hidden_sizes)
        numbers["obs_dim"] = int(online["0.weight"].shape[1])
        numbers["n_actions"] = widths[-1]
    return numbers


def positive(x: float) -> bool:
    return not math.isnan(x) and x > 0


def running_at_the_end(numbers: dict) -> bool:
    """Every rate is known and >= 0 in the final row and > 0 in at least one of the last two."""
    return all(
        not math.isnan(v[-1]) and v[-1] >= 0 and any(positive(x) for x in v) for v in numbers["end_rates"].values()
    )


def cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``python -m tianji_dask.cli ARGS`` to completion; stdin closed, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "tianji_dask.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def called_here(main, *args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``main([ARGS])`` (a command's entry point) called in this process, in ``cwd`` if given,
    and reported as :func:`cli` reports a process: for the tests that read what a command prints,
    writes and returns, not how its process behaves (signals, process groups, what it imports),
    without a second interpreter's seconds of imports and its own fork server. File descriptors
    1 and 2 and ``sys.stdout``/``sys.stderr`` go to files for the call; the signal handlers a
    run installs and the working directory are put back."""
    import signal
    import tempfile

    from tianji_dask.runtime.processes.worker_signals import DRIVER_SIGNALS

    handlers = {sig: signal.getsignal(sig) for sig in DRIVER_SIGNALS}
    here = Path.cwd()
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                if cwd is not None:
                    os.chdir(cwd)
                try:
                    code = main([str(a) for a in args])
                except SystemExit as exc:  # argparse's refusals
                    code = exc.code if isinstance(exc.code, int) else 1
                finally:
                    out.flush()
                    err.flush()
        finally:
            os.chdir(here)
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(list(args), code, out.read(), err.read())


def cli_here(*args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``tianji-dask ARGS`` called in this process (:func:`called_here`)."""
    from tianji_dask.cli import main

    return called_here(main, *args, cwd=cwd)


def doc_python_block(path: Path, after: str) -> str:
    """The first ```python block after the text ``after`` in ``path``, as it stands."""
    text = path.read_text(encoding="utf-8")
    assert after in text, f"{path.name} lost the text {after!r}"
    block = re.search(r"```python\n(.*?)```", text[text.index(after) :], re.S)
    assert block, f"no ```python block after {after!r} in {path.name}"
    return block.group(1)


#: the MuJoCo extra's install command, and a mark for tests that need it installed
MUJOCO_INSTALL = "pip install 'tianji-dask[mujoco]'"
needs_mujoco = pytest.mark.skipif(
    importlib.util.find_spec("mujoco") is None, reason=f"the mujoco extra is not installed ({MUJOCO_INSTALL})"
)


def script_module(path: Path):
    """A script under benchmarks/ loaded from its file as a module (not put in ``sys.modules``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def script_main(path: Path):
    """The ``main`` of a script under benchmarks/, for :func:`called_here`."""
    return script_module(path).main


def cli_in_background(cmd: list[str], cwd: Path) -> subprocess.Popen:
    """``cmd`` (a CLI process) in a session of its own, as a batch system starts a job: stdin
    closed, stdout dropped, stderr a text pipe; signal the whole job with ``os.killpg``."""
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def forked_local_cluster(**kwargs):
    """A ``distributed.LocalCluster`` of the caller's whose worker processes fork from this
    process's fork server, as a run's own cluster's do: the imports a run's hosts need are done
    once a test process instead of in every worker (seconds each). Spawned workers, as a user's
    notebook starts them, are what the notebooks' and the README's tests run on."""
    from distributed import LocalCluster

    from tianji_dask.runtime.processes.fork_server import start_fork_server
    from tianji_dask.runtime.processes.forked_workers import ForkedNanny

    start_fork_server()
    return LocalCluster(worker_class=ForkedNanny, **kwargs)


@contextlib.contextmanager
def run_cluster_client(n_workers: int):
    """A ``Client`` of a LocalCluster made as a run makes its own (``runtime.cluster.local_cluster``:
    the same worker processes, preloads and limits), for several runs of one module in turn: each
    run is given the client instead of starting and closing a cluster of its own, for the tests
    whose subject is what a run does, not its cluster's start and end."""
    from distributed import Client

    from tianji_dask.runtime.cluster.cluster import local_cluster

    with local_cluster(n_workers, dashboard=False) as cluster, Client(cluster) as client:
        yield client


def wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


FORK_SERVER = "multiprocessing.forkserver import main"  # in the fork server's command line

# Every run a test starts in this process forks its workers from this process's one fork server,
# and each run's learner imports torch._dynamo as it builds its optimizer: imported in the server,
# once a test process instead of once a run. (A run's own process keeps it out of the server: it
# would delay the cluster's start, where in the learner it overlaps the actors' build.)
fork_server.PRELOAD.insert(
    fork_server.PRELOAD.index("tianji_dask.runtime.processes.fork_server_frozen"), "torch._dynamo"
)


def worker_processes(root: int | None = None) -> list:
    """The live Dask worker processes under process ``root`` (default: this one): spawned ones
    (``spawn_main`` in their command line), and those forked from a fork server
    (``tianji_dask.runtime.processes.fork_server``), whose command line is the server's: its children. Not the
    fork server itself."""
    import os

    import psutil

    out = []
    for p in psutil.Process(root or os.getpid()).children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            line = " ".join(p.cmdline())
            if "spawn_main" in line or (FORK_SERVER in line and FORK_SERVER in " ".join(p.parent().cmdline())):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):  # gone meanwhile (parent() None)
            pass
    return out


@contextlib.contextmanager
def ending(run, timeout: float = 60):
    """Yields ``run``; on the way out, whatever happened inside, a run still going is stopped
    and waited for (a failed assertion must not leave its cluster behind)."""
    try:
        yield run
    finally:
        if not run.done:
            run.stop()
            run.wait(timeout=timeout)


def ppo_train_batch(learner, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A PPO training batch for a CartPole-sized learner: random observations and actions with the
    learner's own log-probabilities, random advantages, returns a simple function of the obs."""
    import torch

    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    actions = rng.integers(0, 2, n).astype(np.int64)
    device = next(learner.net.parameters()).device
    with torch.no_grad():
        logp, _, _ = learner.net.evaluate(torch.from_numpy(obs).to(device), torch.from_numpy(actions).to(device))
    return {
        "obs": obs,
        "actions": actions,
        "logp": logp.cpu().numpy(),
        "advantages": rng.normal(size=n).astype(np.float32),
        "returns": (obs[:, 0] * 2 + 1).astype(np.float32),
    }


# Tests that share this machine's one local Slurm or its network namespaces (fixed names and
# addresses) must not overlap: ``./dev test`` runs the suite in two processes (pytest-xdist), and
# each of these tests holds an exclusive lock on a file both processes see while it runs.
# (xdist's own ``--dist loadgroup`` does not group with this pytest: the nodeid suffix it relies
# on is not applied.)
def _uses_the_system(item: pytest.Item) -> bool:
    return (
        item.get_closest_marker("slurm") is not None
        or item.path.name == "test_netns.py"
        or (item.path.name == "test_notebooks.py" and "02_slurm" in item.name)
    )


def _module_rank(items: list[pytest.Item]) -> int:
    """Where a module's tests go in the run: those that train to a target first, then those that
    use the machine's Slurm or network namespaces (one at a time: together, so that they
    rarely wait for each other), then the other integration and slow ones, the quick ones last."""
    marks = {m.name for item in items for m in item.iter_markers()}
    if "learning" in marks:
        return 0
    if any(_uses_the_system(item) for item in items):
        return 1
    if marks & {"integration", "slow"}:
        return 2
    return 3


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long modules run first, each module's tests together and in their order: pytest-xdist
    hands the first tests out in large batches and the last ones one or two at a time, so a long
    test left for the end would keep one process busy while the other has nothing to run."""
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)
    ranked = sorted(modules.values(), key=_module_rank)  # stable: files in their usual order
    items[:] = [item for module in ranked for item in module]


@pytest.fixture(autouse=True)
def _one_system_test_at_a_time(request, tmp_path_factory):
    if not _uses_the_system(request.node):
        yield
        return
    import fcntl

    # the base temporary directory's parent is the same for every xdist worker of the session
    lock = tmp_path_factory.getbasetemp().parent / "tianji-system-tests.lock"
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _dask_scheduler_setting_left_as_found():
    """A default ``Client`` sets Dask's ``scheduler`` setting as it starts and puts it back as it
    closes; one never closed, or closed out of the order they were made in, leaves
    ``"dask.distributed"`` behind with no client, and every later ``compute`` in the process
    (``to_netcdf`` included) fails with "no Client active". The test that did it fails here."""
    import dask

    before = dask.config.get("scheduler", None)
    yield
    after = dask.config.get("scheduler", None)
    assert after == before, f"Dask's scheduler setting was {before!r} before this test and is {after!r} after it"


class _Helpers:
    ROOT = ROOT
    CONFIG = CONFIG
    SHORT = SHORT
    check_run_dir = staticmethod(check_run_dir)
    documented_tables = staticmethod(documented_tables)
    positive = staticmethod(positive)
    running_at_the_end = staticmethod(running_at_the_end)
    cli = staticmethod(cli)
    cli_here = staticmethod(cli_here)
    called_here = staticmethod(called_here)
    script_main = staticmethod(script_main)
    cli_in_background = staticmethod(cli_in_background)
    forked_local_cluster = staticmethod(forked_local_cluster)
    run_cluster_client = staticmethod(run_cluster_client)
    wait_until = staticmethod(wait_until)
    ending = staticmethod(ending)
    worker_processes = staticmethod(worker_processes)
    ppo_train_batch = staticmethod(ppo_train_batch)


@pytest.fixture(scope="session")
def h() -> type[_Helpers]:
    """The end-to-end helpers: ``h.CONFIG``, ``h.SHORT``, ``h.check_run_dir(...)``, ``h.cli(...)``."""
    return _Helpers


# ------------------------------------------------------------------ Slurm (tests/slurm_support.py)
@pytest.fixture
def one_torch_thread():
    """The test's roles run with one torch thread, as in a host's worker
    (``tianji_dask.runtime.processes.worker_preload``): with OpenMP's default threads per core, a CNN actor
    stepped here competes with its own emulator threads, and on a loaded 2-core machine it
    slowed down by orders of magnitude."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def slurm_conf() -> str:
    """Path of the local Slurm's slurm.conf (also in ``os.environ["SLURM_CONF"]``, which
    sbatch and the jobs inherit); skips or fails as ``require_slurm()`` does."""
    from slurm_support import require_slurm

    return require_slurm()["SLURM_CONF"]


@pytest.fixture
def jobqueue_defaults():
    """Run the test with dask-jobqueue's own defaults for ``jobqueue.slurm``, so that a user's
    jobqueue.yaml (queue, account, interface, ...) cannot leak into tests on the local Slurm."""
    import dask
    import yaml
    from slurm_support import import_dask_jobqueue

    dask_jobqueue = import_dask_jobqueue()
    pkg = Path(dask_jobqueue.__file__).with_name("jobqueue.yaml")
    defaults = yaml.safe_load(pkg.read_text(encoding="utf-8"))["jobqueue"]["slurm"]
    with dask.config.set({"jobqueue.slurm": defaults}):
        yield
