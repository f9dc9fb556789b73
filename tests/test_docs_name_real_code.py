"""docs/architecture.md and docs/algorithms.md stay true where they name code: every file they
name exists, and every class, function and ``Class.member`` they name is defined in the project,
imported by it, or a name of a library it builds on (Dask, dask-jobqueue, gymnasium, xarray,
torch). A rename or a removal that forgets the docs fails here."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["architecture.md", "algorithms.md"]
CODE_DIRS = ("tianji_dask", "benchmarks", "jobqueue", "tests")


def _sources() -> list[Path]:
    return [p for d in CODE_DIRS for p in (ROOT / d).rglob("*.py")]


def _code_names() -> tuple[set[str], dict[str, set[str]]]:
    """(every name defined or imported anywhere in the code, members per class defined)."""
    names: set[str] = set()
    members: dict[str, set[str]] = {}
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names.add(node.name)
                own = members.setdefault(node.name, set())
                own.update(b.id for b in node.bases if isinstance(b, ast.Name))  # resolved below
                for item in ast.walk(node):
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        own.add(item.name)
                    elif isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name):
                        if item.value.id == "self":
                            own.add(item.attr)
                    elif isinstance(item, ast.Name | ast.AnnAssign):
                        target = item.target if isinstance(item, ast.AnnAssign) else item
                        if isinstance(target, ast.Name):
                            own.add(target.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.Attribute) and node.attr[:1].isupper():
                names.add(node.attr)  # a library's class used through its module: gym.vector.SyncVectorEnv
            elif isinstance(node, ast.ImportFrom | ast.Import):
                names.update((a.asname or a.name).split(".")[-1] for a in node.names)
                names.update(a.name.split(".")[-1] for a in node.names)
    return names | set(dir(builtins)), members


LIBRARIES = ("distributed", "dask_jobqueue", "gymnasium", "xarray", "torch", "torch.distributed")


def _library_name(name: str) -> bool:
    """A name the docs may use without the code importing it: one of the libraries' own."""
    import importlib

    return any(hasattr(importlib.import_module(lib), name) for lib in LIBRARIES)


def _all_members(cls: str, members: dict[str, set[str]], seen: frozenset = frozenset()) -> set[str]:
    own = members.get(cls, set())
    out = set(own)
    for base in own & set(members):  # inherited from the project's own bases
        if base not in seen:
            out |= _all_members(base, members, seen | {cls})
    return out


def _doc_spans(doc: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", (ROOT / "docs" / doc).read_text(encoding="utf-8"))


@pytest.mark.parametrize("doc", DOCS)
def test_every_file_the_doc_names_exists(doc):
    skip = {".venv", ".git"}
    files = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if not skip & set(p.parts)}
    missing = []
    for span in _doc_spans(doc):
        for token in re.findall(r"[\w./-]*\w\.(?:py|yaml|sh|md)\b", span):
            if token.startswith("shared/"):  # the project's shared folder, outside the repository
                continue
            if not any(f == token or f.endswith("/" + token) for f in files):
                missing.append(token)
    assert not missing, f"docs/{doc} names files that do not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_class_and_member_the_doc_names_is_defined(doc):
    names, members = _code_names()
    missing = []
    for span in _doc_spans(doc):
        for cls, member in re.findall(r"\b([A-Z][a-z]+[A-Z]\w*|[A-Z]\w*[a-z]\w*[A-Z]\w*)(?:\.(\w+))?", span):
            if cls not in names and not _library_name(cls):
                missing.append(cls)
            elif member and cls in members and member not in _all_members(cls, members):
                missing.append(f"{cls}.{member}")
        for func in re.findall(r"^([a-z_][a-z0-9_]*)\(", span):
            if func not in names:
                missing.append(f"{func}()")
    assert not missing, f"docs/{doc} names code that is not defined: {sorted(set(missing))}"


def test_the_architecture_page_stays_an_overview():
    """docs/architecture.md is the overview and the reading path: reference material goes in the
    modules' docstrings and the other pages, measurements in benchmarks.md (issue 33's bound)."""
    lines = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 400, f"docs/architecture.md has {lines} lines: move reference material to where the code is"
