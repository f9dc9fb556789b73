"""The repository stays a code base a reader can take in, not a lab notebook (issue 67): the
results git tracks stay one small folder per current figure, each linked from docs/benchmarks.md,
and that page stays a page. Sizes are those of the files in git's index, so a fresh clone in CI
measures what a commit would hold."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from conftest import ROOT

RESULTS = "benchmarks/results"
RESULTS_MAX_BYTES = 6 * 10**6
RESULTS_MAX_FILES = 300
BENCHMARKS_DOC = ROOT / "docs" / "benchmarks.md"
BENCHMARKS_DOC_MAX_LINES = 400
# what a results folder holds: summaries, one plot, a README; no code, patches or logs
RESULT_SUFFIXES = {".json", ".nc", ".png", ".md", ".txt", ".yaml"}
HISTORY = "older results live in git history (docs/benchmarks.md, 'History')"


def tracked(prefix: str) -> dict[str, int]:
    """``{path: bytes}`` of the files under ``prefix`` in git's index."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the limits are on what git tracks")
    staged = subprocess.run(
        ["git", "ls-files", "-s", "-z", "--", prefix], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    entries = [line.split("\t", 1) for line in staged.split("\0") if line]
    blobs = [meta.split()[1] for meta, _ in entries]
    sizes = subprocess.run(
        ["git", "cat-file", "--batch-check=%(objectsize)"],
        cwd=ROOT,
        input="\n".join(blobs) + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {path: int(size) for (_, path), size in zip(entries, sizes, strict=True)}


def folders(files: dict[str, int]) -> set[str]:
    return {path.split("/")[2] for path in files if path.count("/") >= 3}


def test_the_results_in_the_tree_stay_small():
    files = tracked(RESULTS)
    assert files, f"git tracks nothing under {RESULTS}: the measurement found no files"
    size = sum(files.values())
    largest = sorted(files.items(), key=lambda item: -item[1])[:5]
    assert size <= RESULTS_MAX_BYTES, (
        f"{RESULTS} holds {size / 1e6:.1f} MB in the tree (at most {RESULTS_MAX_BYTES / 1e6:.0f} MB): keep a "
        f"figure's summary, one plot and a README; {HISTORY}. Largest: {largest}"
    )
    assert len(files) <= RESULTS_MAX_FILES, (
        f"{RESULTS} holds {len(files)} files in the tree (at most {RESULTS_MAX_FILES}): keep one folder per "
        f"current figure; {HISTORY}"
    )


def test_a_results_folder_holds_a_readme_and_summaries_only():
    files = tracked(RESULTS)
    loose = [path for path in files if path.count("/") < 3]
    assert not loose, f"files directly in {RESULTS}, outside a figure's folder: {loose}"
    foreign = [path for path in files if "." + path.rsplit(".", 1)[-1] not in RESULT_SUFFIXES]
    assert not foreign, (
        f"{RESULTS} holds files that are no summary, plot or README (scripts, patches, logs): {foreign}; "
        "a reusable script goes to benchmarks/ with a test"
    )
    without = sorted(f for f in folders(files) if f"{RESULTS}/{f}/README.md" not in files)
    assert not without, f"results folders without a README.md (command, machine, date): {without}"


def test_the_benchmarks_page_links_every_results_folder_and_no_other():
    text = BENCHMARKS_DOC.read_text(encoding="utf-8")
    linked = set(re.findall(r"\(\.\./benchmarks/results/([A-Za-z0-9_.-]+)/?\)", text))
    present = folders(tracked(RESULTS))
    assert linked, "docs/benchmarks.md links no results folder: the link pattern changed?"
    missing = sorted(linked - present)
    assert not missing, f"docs/benchmarks.md links results folders git does not track: {missing}"
    assert not present - linked, (
        f"results folders that docs/benchmarks.md does not link (not a current figure?): {sorted(present - linked)}"
    )


def test_the_benchmarks_page_stays_a_page():
    lines = BENCHMARKS_DOC.read_text(encoding="utf-8").count("\n")
    assert lines <= BENCHMARKS_DOC_MAX_LINES, (
        f"docs/benchmarks.md has {lines} lines (at most {BENCHMARKS_DOC_MAX_LINES}): one table per current "
        "figure; history goes to git log"
    )
