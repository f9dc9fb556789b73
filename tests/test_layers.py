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
FLOORS = [  # bottom first: the top-level modules and packages of each
    {"errors", "seeding", "channels", "envs"},
    {"config", "devices", "progress"},
    {"roles"},
    {"algos"},
    {"results"},
    {"runtime"},
    {"deploy"},
    {"cli", "notebook", "__init__"},
]


def floor_of(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    (floor,) = [i for i, names in enumerate(FLOORS) if part in names]
    return floor


def imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tianji_dask":
            names = [a.name for a in node.names] if node.module == "tianji_dask" else [""]
            out += [f"{node.module}.{n}".rstrip(".") for n in names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "tianji_dask"]
    return out


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_module_is_on_a_floor():
    tops = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    assert tops == set().union(*FLOORS), tops ^ set().union(*FLOORS)


def test_no_module_imports_from_a_floor_above_its_own():
    up = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = floor_of(module_of(path))
        for target in imports(path):
            if floor_of(target) > here:
                up.append((path.relative_to(ROOT).as_posix(), target))
    assert not up, f"imports from a floor above: {up}"


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
        if target.startswith("tianji_dask.channels") and target != "tianji_dask.channels.ports"
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


MAX_METHODS = 15


def methods_per_class(package: Path) -> dict[str, int]:
    """``path:Class`` (the path under ``package``) -> the functions defined directly in its body (properties and dunders
    count, functions inside its methods do not), for every class under ``package``."""
    counts = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                own = [f for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
                counts[f"{path.relative_to(package).as_posix()}:{node.name}"] = len(own)
    return counts


def test_the_method_count_counts_the_class_bodys_own_functions(tmp_path):
    (tmp_path / "m.py").write_text(
        "class A:\n"
        "    def f(self):\n        def inner(): pass\n"
        "    @property\n    def p(self): pass\n"
        "    async def g(self): pass\n"
        "    def __init__(self): pass\n"
        "    class B:\n        def h(self): pass\n"
    )
    counts = {k.rsplit(":", 1)[1]: n for k, n in methods_per_class(tmp_path).items()}
    assert counts == {"A": 4, "B": 1}


def test_no_class_in_the_runtime_has_more_than_fifteen_methods():
    """The runtime's coordinators stay thin: a class that grows past the bound is split by concern."""
    counts = methods_per_class(PACKAGE / "runtime")
    wide = {cls: n for cls, n in counts.items() if n > MAX_METHODS}
    assert not wide, f"classes with more than {MAX_METHODS} methods: {wide}"


def test_the_channels_keep_classes_of_at_most_fifteen_methods_and_folders_of_fifteen_modules():
    """The transport is split by job (a sender's window, its owned-socket threads, its comm
    stream; the inbox's credit-queue core) rather than grown in place."""
    counts = methods_per_class(PACKAGE / "channels")
    wide = {cls: n for cls, n in counts.items() if n > MAX_METHODS}
    assert not wide, f"classes with more than {MAX_METHODS} methods: {wide}"
    folders = {p.parent for p in (PACKAGE / "channels").rglob("*.py")}
    crowded = {f.name: n for f in folders if (n := len(list(f.glob("*.py")))) > 15}
    assert not crowded, f"channel folders with more than 15 modules: {crowded}"


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
