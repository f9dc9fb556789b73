"""Issue 67's limits on the code a reader meets: no package folder of more than 15 modules, no
class of more than 15 methods in ``runtime/`` or ``channels/``, no function of more than 60 lines
in the package, a README of at most 250 lines, a DQN transition through at most 14 files (as
docs/architecture.md walks it). Each failure names the offenders and their sizes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "tianji_dask"
MAX_MODULES = 15
MAX_METHODS = 15
THIN_PACKAGES = ("runtime", "channels")
MAX_FUNCTION_LINES = 60
MAX_README_LINES = 250
MAX_TRANSITION_FILES = 14


def modules_per_folder(package: Path) -> dict[str, int]:
    """Each folder of ``package`` (itself included) -> its ``.py`` files, ``__init__.py`` counted."""
    counts: dict[str, int] = {}
    for path in package.rglob("*.py"):
        folder = path.parent.relative_to(package.parent).as_posix()
        counts[folder] = counts.get(folder, 0) + 1
    return counts


def methods_per_class(folder: Path) -> dict[str, int]:
    """``path:Class`` -> the functions defined directly in its body, for every class under ``folder``."""
    counts = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                own = [f for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
                counts[f"{path.relative_to(folder.parent).as_posix()}:{node.name}"] = len(own)
    return counts


def function_lines(package: Path) -> dict[str, int]:
    """``path:line name`` -> lines from its ``def`` to its last line, for every function and
    method under ``package`` (nested ones too)."""
    lines = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                where = f"{path.relative_to(package.parent).as_posix()}:{node.lineno} {node.name}"
                lines[where] = node.end_lineno - node.lineno + 1
    return lines


def over(counts: dict[str, int], limit: int) -> dict[str, int]:
    """The entries above ``limit``, largest first."""
    return dict(sorted(((k, n) for k, n in counts.items() if n > limit), key=lambda kv: -kv[1]))


def test_the_measures_count_what_they_name(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "wide").mkdir(parents=True)
    for i in range(MAX_MODULES + 1):
        (pkg / "wide" / f"m{i}.py").write_text("")
    (pkg / "__init__.py").write_text(
        "class Wide:\n"
        + "".join(f"    def m{i}(self):\n        pass\n" for i in range(MAX_METHODS + 1))
        + "    class Inner:\n        def h(self): pass\n"
        + "def long():\n"
        + "    x = 1\n" * (MAX_FUNCTION_LINES - 1)
        + "async def short():\n    def nested():\n        pass\n"
    )
    assert over(modules_per_folder(pkg), MAX_MODULES) == {"pkg/wide": MAX_MODULES + 1}
    assert modules_per_folder(pkg)["pkg"] == 1
    assert over(methods_per_class(pkg), MAX_METHODS) == {"pkg/__init__.py:Wide": MAX_METHODS + 1}
    assert methods_per_class(pkg)["pkg/__init__.py:Inner"] == 1
    long_at = 1 + 2 * (MAX_METHODS + 1) + 2 + 1  # after the class's line, its methods and Inner
    assert over(function_lines(pkg), MAX_FUNCTION_LINES - 1) == {f"pkg/__init__.py:{long_at} long": MAX_FUNCTION_LINES}
    assert function_lines(pkg)[f"pkg/__init__.py:{long_at + MAX_FUNCTION_LINES} short"] == 3


def test_no_package_folder_holds_more_than_15_modules():
    """A folder a reader must choose among is split by who runs its code or what it is for."""
    wide = over(modules_per_folder(PACKAGE), MAX_MODULES)
    assert not wide, f"package folders with more than {MAX_MODULES} modules: {wide}"


def test_no_class_in_runtime_or_channels_has_more_than_15_methods():
    """The coordinators and the transport stay thin: a class past the bound is split by concern."""
    wide = {}
    for name in THIN_PACKAGES:
        wide.update(over(methods_per_class(PACKAGE / name), MAX_METHODS))
    assert not wide, f"classes with more than {MAX_METHODS} methods: {wide}"


def test_no_function_in_the_package_is_longer_than_60_lines():
    """A function reads on one screen; a longer one is split by job."""
    long = over(function_lines(PACKAGE), MAX_FUNCTION_LINES)
    assert not long, f"functions of more than {MAX_FUNCTION_LINES} lines: {long}"


def test_the_readme_is_at_most_250_lines():
    """The README is the front door: what the project is, how to start, where the rest is; the
    reference goes to docs/."""
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES}): move detail to docs/"


def transition_steps(doc: str) -> list[tuple[str, str]]:
    """The numbered steps of the doc's "one DQN transition" walk: (the file a step opens with,
    the first name it gives after it)."""
    section = doc.split("## Data flow: one DQN transition", 1)[1].split("\n## ", 1)[0]
    steps = []
    for match in re.finditer(r"^\d+\. `([\w/]+\.py)`(.*?)(?=^\d+\. |^$)", section, re.M | re.S):
        names = re.findall(r"`([A-Za-z_]\w*)(?:\.\w+)?`", match.group(2))
        steps.append((match.group(1), names[0] if names else ""))
    return steps


def defines(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    return any(isinstance(node, kinds) and node.name == name for node in ast.walk(tree))


def test_a_dqn_transition_crosses_at_most_14_files_each_defining_what_its_step_names():
    """The walk in docs/architecture.md lists each file the path crosses once, in order; each step's
    first name (``QueueSender.push``) is defined in the file the step names, so moving code out of
    a file breaks the walk here rather than silently in the doc."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    steps = transition_steps(doc)
    files = [f for f, _ in steps]
    assert len(files) == len(set(files)), f"a file listed twice: {files}"
    assert f"the path crosses these {len(files)} files" in doc, f"the walk's count is not {len(files)}"
    assert len(files) <= MAX_TRANSITION_FILES, f"{len(files)} files on the path: {files}"
    wrong = [(f, name) for f, name in steps if not name or not defines(PACKAGE / f, name)]
    assert not wrong, f"steps whose first name is not defined in their file: {wrong}"


def test_the_transition_walk_is_read_as_written():
    doc = (
        "## Data flow: one DQN transition, x\n\nthe path crosses these 2 files:\n\n"
        "1. `a/b.py` `Thing.step`: more\n   `Other` on a second line.\n"
        "2. `c.py` then `helper`, `Later.x`.\n\nAfter.\n\n## Next\n3. `d.py` `No`\n"
    )
    assert transition_steps(doc) == [("a/b.py", "Thing"), ("c.py", "helper")]
