"""tianji_dask's packages are floors: a module imports only from its own floor and the ones
below it, lazily or not (every ``import`` of the package's modules, parsed). docs/architecture.md
shows the floors."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "tianji_dask"
FLOORS = [  # bottom first: the top-level modules and packages of each, and runtime's own packages
    {"errors", "seeding", "channels", "envs"},
    {"config", "devices"},
    {"roles"},
    {"algos"},
    {"results", "progress"},
    {"runtime.hosts", "runtime.processes"},  # what runs on the workers, and how their processes start
    {"runtime.cluster"},  # the run's cluster and its life
    {"runtime"},  # the driver's side of a run
    {"runtime.sweep"},
    {"deploy"},
    {"cli", "notebook", "__init__"},
]


def floor_of(module: str) -> int:
    """The floor of the longest name on a floor that ``module`` (``tianji_dask.x.y...``) starts with."""
    parts = module.split(".")[1:] or ["__init__"]
    for n in range(len(parts), 0, -1):
        found = [i for i, names in enumerate(FLOORS) if ".".join(parts[:n]) in names]
        if found:
            return found[0]
    raise AssertionError(f"{module} is on no floor")


def imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tianji_dask":
            out += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "tianji_dask"]
    return out


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def packages_and_modules(folder: Path) -> set[str]:
    return {
        p.stem if p.is_file() else p.name for p in folder.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }


def test_every_module_is_on_a_floor():
    named = set().union(*FLOORS)
    tops = packages_and_modules(PACKAGE)
    assert tops == {n for n in named if "." not in n}, tops ^ {n for n in named if "." not in n}
    runtime_packages = {p.name for p in (PACKAGE / "runtime").iterdir() if (p / "__init__.py").exists()}
    assert {f"runtime.{p}" for p in runtime_packages} == {n for n in named if n.startswith("runtime.")}


def test_no_module_imports_from_a_floor_above_its_own():
    up = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = floor_of(module_of(path))
        for target in imports(path):
            if floor_of(target) > here:
                up.append((path.relative_to(ROOT).as_posix(), target))
    assert not up, f"imports from a floor above: {up}"


BOOKKEEPING = ("run_loop.py", "checkpoint_writer.py", "result_writer.py", "training_evaluation.py")


@pytest.mark.parametrize("module", BOOKKEEPING)
def test_the_runs_bookkeeping_knows_no_cluster(module):
    """The run's loop and writers are driven by the modes (serial, distributed) and know neither
    the cluster nor the hosts: what they need from them (the learner's final state) is passed in."""
    below = ("tianji_dask.runtime.cluster", "tianji_dask.runtime.hosts", "tianji_dask.runtime.processes")
    taken = [t for t in imports(PACKAGE / "runtime" / module) if t.startswith(below)]
    assert not taken, f"runtime/{module} imports {taken}"


def test_at_most_twelve_modules_beside_the_packages():
    modules = [p.name for p in PACKAGE.glob("*.py")]
    assert len(modules) <= 12, modules


@pytest.mark.slow
def test_the_public_api_is_the_packages_and_loads_on_first_use():
    """``from tianji_dask import train, load_config, open_runs, ...``: importing the package
    imports none of them (nor torch), each name is the function its module defines."""
    code = (
        "import sys, tianji_dask\n"
        "assert 'torch' not in sys.modules and 'tianji_dask.runtime' not in sys.modules, sorted(sys.modules)\n"
        "from tianji_dask import *\n"
        "print(' '.join(f'{n}={getattr(tianji_dask, n).__module__}' for n in tianji_dask.__all__))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    where = dict(pair.split("=") for pair in r.stdout.split())
    assert where["train"] == "tianji_dask.runtime.driver" and where["open_runs"] == "tianji_dask.results.analysis"
    assert where["load_config"].startswith("tianji_dask.config") and where["start"] == "tianji_dask.notebook"


def test_roles_and_algorithms_see_the_channels_through_the_ports_alone():
    """``roles/`` and ``algos/`` import nothing of ``channels/`` but ``channels.ports``: the
    transports can change without them."""
    beyond = [
        (path.relative_to(ROOT).as_posix(), target)
        for package in ("roles", "algos")
        for path in sorted((PACKAGE / package).rglob("*.py"))
        for target in imports(path)
        if target.startswith("tianji_dask.channels")
        and not (target == "tianji_dask.channels.ports" or target.startswith("tianji_dask.channels.ports."))
    ]
    assert not beyond, f"imports of the channels beside the ports: {beyond}"


@pytest.mark.slow
def test_the_ports_and_the_roles_load_no_transport():
    """Importing the roles loads ``channels.ports`` and nothing else of the channels, nor
    ``distributed``."""
    code = (
        "import sys\n"
        "import tianji_dask.roles.actor_base, tianji_dask.roles.buffer, tianji_dask.roles.learner_base\n"
        "loaded = [m for m in sys.modules if m == 'distributed' or m.startswith('tianji_dask.channels')]\n"
        "print(' '.join(sorted(loaded)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["tianji_dask.channels", "tianji_dask.channels.ports"], r.stdout


ACTORS = ("algos/dqn/actor.py", "algos/ppo/actor.py", "algos/ppo/async_actor.py")


@pytest.mark.parametrize("module", ACTORS)
def test_each_actor_step_reads_in_25_lines(module):
    """An actor's ``step`` is probe, act, step, write: what it writes and how belongs to its writer."""
    tree = ast.parse((PACKAGE / module).read_text())
    steps = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "step"]
    assert steps, f"{module} has no step()"
    for f in steps:
        assert f.end_lineno is not None
        assert f.end_lineno - f.lineno + 1 <= 25, f"{module}: step() is {f.end_lineno - f.lineno + 1} lines"
