"""Every code block of README.md and docs/*.md is run by a test, or marked a fragment with its
reason, so a block that breaks fails CI.

A block is claimed in ``RUN_BY`` by its file and first line (its comment left out), with the
tests that run it; a fragment has ``<!-- fragment: REASON -->`` on the line before its fence.
Blocks without a language (directory layouts, diagrams, output) are text, not code.
docs/benchmarks.md is a record: its commands ran on the machines it names (GPU machines, 16
cores), and the results beside them are what they printed then.

The command blocks that ``RUN_BY`` gives to ``test_the_train_commands_check_as_pasted`` are run
here line by line, as pasted, with ``--check`` added: config, arguments, env and memory are
checked, and nothing is started or written.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, cli_here

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RECORDS = {"docs/benchmarks.md"}
CODE = {"python", "bash", "sh", "shell", "console"}
FRAGMENT = re.compile(r"^<!-- fragment: (\S.*\S) -->$")
CHECKED_HERE = "test_doc_blocks.py::test_the_train_commands_check_as_pasted"

RUN_BY: dict[tuple[str, str], tuple[str, ...]] = {
    ("README.md", "./dev train"): (
        "test_readme.py::test_dev_train_trains_the_reference_config",
        "test_readme.py::test_ci_runs_the_readme_test_command",
    ),
    ("README.md", "./dev train --set seed=3"): (CHECKED_HERE,),
    ("README.md", 'import json'): (
        "test_analysis.py::test_the_readme_results_block_runs_on_a_run_and_draws_each_plot_apart",
    ),
    ("README.md", "./dev train --set seed=3 --set topology.actors=2"): (CHECKED_HERE,),
    (
        "README.md",
        "./dev train --set run.eval_every_env_steps=10000 --set stop.target_return=null "
        "--set stop.target_eval_return=500",
    ): (
        CHECKED_HERE,
        "test_learning.py::test_cartpole_best_checkpoint_plays_450_greedily",
    ),
    # the same sweep through tianji_dask.deploy.slurm_sweep, with a plan that fits the local Slurm
    ("README.md", "tianji-dask sweep configs/cartpole_dqn.yaml --grid seed=0,1,2,3 --parallel 2 --slurm --plan $P"): (
        "test_slurm_sweep.py::test_four_seeds_two_at_a_time_on_two_allocations_of_the_plan",
    ),
    ("README.md", "from distributed import Client, LocalCluster"): (
        "test_readme.py::test_readme_python_api_block_runs_as_a_script",
    ),
    ("README.md", ".venv/bin/tianji-dask plan configs/cartpole_dqn.yaml --cores 16"): (
        "test_profile_plan.py::test_plan_writes_under_runs_plans_beside_its_profile_and_never_replaces_it",
        "test_profile_plan.py::test_plan_from_a_saved_profile_and_train_with_it",
        "test_slurm_run.py::test_job_scripts_carry_the_plans_cores_and_memory",
        "test_slurm_run.py::test_train_slurm_from_the_command_line",
    ),
    ("docs/analysis.md", "from tianji_dask import open_run, open_runs"): (
        "test_analysis.py::test_the_analysis_doc_runs_as_pasted_on_runs_that_differ_in_seed_only",
    ),
    ("docs/metrics.md", "import json"): (
        "test_analysis.py::test_the_metrics_doc_block_runs_on_a_run_and_draws_each_plot_apart",
    ),
    ("docs/analysis.md", "import gymnasium as gym"): (
        "test_evaluation.py::test_the_analysis_doc_plays_a_loaded_policy_as_pasted",
    ),
    ("docs/environments.md", "import gymnasium as gym"): (
        "test_custom_env.py::test_the_documented_custom_env_trains_and_plays_through_its_module_id",
    ),
    (
        "docs/environments.md",
        "PYTHONPATH=$PWD ./dev train configs/cartpole_ppo.yaml --set env.id=corridor:Corridor-v0 "
        "--set stop.target_return=0.9",
    ): (
        "test_custom_env.py::test_the_documented_custom_env_trains_and_plays_through_its_module_id",
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Block:
    doc: str  # path relative to the checkout
    line: int  # of the opening fence, from 1
    lang: str
    lines: tuple[str, ...]
    fragment: str | None  # the reason, where marked

    @property
    def key(self) -> tuple[str, str]:
        """The file and the block's first line without its comment."""
        return self.doc, self.lines[0].split("  #")[0].strip() if self.lines else ""


def blocks(path: Path) -> list[Block]:
    out, lines = [], path.read_text(encoding="utf-8").splitlines()
    doc = path.relative_to(ROOT).as_posix()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marked = FRAGMENT.match(lines[i - 1].strip()) if i else None
        out.append(Block(doc, i + 1, fence.group(1), tuple(lines[i + 1 : end]), marked and marked.group(1)))
        i = end + 1
    return out


def code_blocks() -> list[Block]:
    return [b for p in DOCS for b in blocks(p) if b.lang in CODE and b.doc not in RECORDS]


def test_every_code_block_is_run_by_a_test_or_marked_a_fragment():
    found = code_blocks()
    assert len(found) >= 8, found  # the parser still finds the docs' blocks
    unclaimed = [f"{b.doc}:{b.line}" for b in found if b.fragment is None and b.key not in RUN_BY]
    assert not unclaimed, f"code blocks run by no test and not marked <!-- fragment: REASON -->: {unclaimed}"
    doubly = [f"{b.doc}:{b.line}" for b in found if b.fragment is not None and b.key in RUN_BY]
    assert not doubly, f"marked a fragment and claimed by a test: {doubly}"
    stale = sorted(set(RUN_BY) - {b.key for b in found})
    assert not stale, f"RUN_BY names blocks the docs no longer have (their first lines changed?): {stale}"


@pytest.mark.parametrize("test", sorted({t for tests in RUN_BY.values() for t in tests}))
def test_each_claiming_test_exists(test):
    file, name = test.split("::")
    assert re.search(rf"^def {re.escape(name)}\(", (ROOT / "tests" / file).read_text(encoding="utf-8"), re.M), test


def train_arguments(line: str) -> list[str] | None:
    """``tianji-dask`` arguments of a pasted ``./dev train ...`` or ``tianji-dask train ...``
    line (./dev's rule: its default config unless the first argument is one, or --resume is
    given); None for any other line."""
    words = shlex.split(line, comments=True)
    if words[:2] == ["./dev", "train"]:
        rest = words[2:]
        if rest and rest[0].endswith((".yaml", ".yml")):
            return ["train", *rest]
        return ["train", *([] if "--resume" in rest else ["configs/cartpole_dqn.yaml"]), *rest]
    if len(words) >= 2 and Path(words[0]).name == "tianji-dask" and words[1] == "train":
        return words[1:]
    return None


def test_the_train_commands_check_as_pasted(tmp_path):
    (tmp_path / "configs").symlink_to(ROOT / "configs", target_is_directory=True)
    mine = [b for b in code_blocks() if CHECKED_HERE in RUN_BY.get(b.key, ())]
    assert mine
    for block in mine:
        for line in block.lines:
            args = train_arguments(line)
            assert args is not None, f"{block.doc}:{block.line}: not a train command: {line!r}"
            if "--check" not in args:
                args.append("--check")
            r = cli_here(*args, cwd=tmp_path)
            assert r.returncode == 0 and "check: ok" in r.stderr, (line, r.stderr[-2000:])
    assert [p.name for p in tmp_path.iterdir()] == ["configs"]  # nothing written


def test_train_check_refuses_what_the_run_would_refuse(tmp_path):
    r = cli_here("train", "configs/cartpole_dqn.yaml", "--set", "env.id=NoSuchEnv-v0", "--check", cwd=ROOT)
    assert r.returncode == 2 and "NoSuchEnv-v0" in r.stderr and "check: ok" not in r.stderr, r.stderr
