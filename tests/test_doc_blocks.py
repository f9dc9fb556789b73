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

Every shell block of README.md is also run as a user pastes it, by
``test_the_readme_shell_blocks_run_as_pasted_from_a_fresh_clone``: in a fresh clone, in a bash
with no venv activated, each block a script of its own. Commands that would take minutes are
shortened (``SHORTER``); a block that cannot run here (Slurm, GPUs) says why with
``<!-- fresh clone: not run: REASON -->`` on the line before its fence.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, cli_here

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RECORDS = {"docs/benchmarks.md"}
CODE = {"python", "bash", "sh", "shell", "console"}
FRAGMENT = re.compile(r"^<!-- fragment: (\S.*\S) -->$")
NOT_FROM_A_CLONE = re.compile(r"^<!-- fresh clone: not run: (\S.*\S) -->$")
SHELL = {"bash", "sh", "shell"}
CHECKED_HERE = "test_doc_blocks.py::test_the_train_commands_check_as_pasted"
FROM_A_CLONE = "test_doc_blocks.py::test_the_readme_shell_blocks_run_as_pasted_from_a_fresh_clone"

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
    ("README.md", "./dev summary runs/CartPole-v1__dqn__*"): (
        "test_results_shell.py::test_summary_of_a_sweep_directory_prints_the_accessors_table_as_aligned_text",
        "test_results_shell.py::test_plot_writes_one_labelled_curve_per_run_and_prints_its_path",
    ),
    ("README.md", "./dev eval runs/CartPole-v1__dqn__0__20260102-030405 --episodes 20"): (
        FROM_A_CLONE,
        "test_evaluation.py::test_the_readme_sequence_eval_then_video_writes_both_into_the_run_without_warnings",
    ),
    ("README.md", "./dev sweep configs/cartpole_dqn.yaml --grid seed=0,1 --grid algo.lr=1e-4,3e-4 --parallel 2"): (
        FROM_A_CLONE,
    ),
    # the same sweep through tianji_dask.deploy.slurm_sweep, with a plan that fits the local Slurm
    ("docs/cli.md", "./dev sweep configs/cartpole_dqn.yaml --grid seed=0,1,2,3 --parallel 2 --slurm --plan $P"): (
        "test_slurm_sweep.py::test_four_seeds_two_at_a_time_on_two_allocations_of_the_plan",
    ),
    ("README.md", "from distributed import Client, LocalCluster"): (
        "test_readme.py::test_readme_python_api_block_runs_as_a_script",
    ),
    ("README.md", "./dev plan configs/cartpole_dqn.yaml --cores 16"): (
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
    not_from_a_clone: str | None = None  # the reason, where marked

    @property
    def run_from_a_clone(self) -> bool:
        return self.doc == "README.md" and self.lang in SHELL and not (self.fragment or self.not_from_a_clone)

    @property
    def claims(self) -> tuple[str, ...]:
        """The tests that run this block."""
        return RUN_BY.get(self.key, ()) + ((FROM_A_CLONE,) if self.run_from_a_clone else ())

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
        skipped = NOT_FROM_A_CLONE.match(lines[i - 1].strip()) if i else None
        body = tuple(lines[i + 1 : end])
        out.append(Block(doc, i + 1, fence.group(1), body, marked and marked.group(1), skipped and skipped.group(1)))
        i = end + 1
    return out


def code_blocks() -> list[Block]:
    return [b for p in DOCS for b in blocks(p) if b.lang in CODE and b.doc not in RECORDS]


def test_every_code_block_is_run_by_a_test_or_marked_a_fragment():
    found = code_blocks()
    assert len(found) >= 8, found  # the parser still finds the docs' blocks
    unclaimed = [f"{b.doc}:{b.line}" for b in found if b.fragment is None and not b.claims]
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
    line (./dev's rule: its default config unless the first argument is no option, or --resume
    is given); None for any other line."""
    words = shlex.split(line, comments=True)
    if words[:2] == ["./dev", "train"]:
        rest = words[2:]
        if rest and not rest[0].startswith("-"):
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


# ------------------------------------------------------------------ the README's shell blocks, as pasted
#: what each ./dev command gets added where its block as written would take minutes (train to a
#: target, test the suite, sweep four runs to it, profile this machine for a minute)
SHORTER: dict[str, tuple[str, ...]] = {
    "train": ("--check",),
    "test": ("--collect-only", "-q", "-p", "no:cacheprovider"),
    "sweep": ("--set", "stop.max_env_steps=1000", "--set", "stop.target_return=null", "--set", "stop.max_seconds=60"),
    "plan": ("--seconds", "0.3", "--batch-sizes", "64"),
    "profile": ("--seconds", "0.3", "--batch-sizes", "64"),
}
EXAMPLE_RUN = re.compile(r"runs/CartPole-v1__dqn__0__\d{8}-\d{6}")
COMMAND_NOT_FOUND = 127


def as_run_here(line: str) -> str:
    """``line`` of a README shell block with its ``SHORTER`` arguments, its own text kept (its
    globs and ``$VARIABLES`` stay for the shell); its comment left out."""
    code = line.split("  #")[0].rstrip()
    words = shlex.split(code) if code else []
    if words[:1] != ["./dev"] or len(words) < 2 or words[1] not in SHORTER:
        return code
    extra = [a for a in SHORTER[words[1]] if a not in words] if words[1] in ("train", "test") else SHORTER[words[1]]
    return " ".join([code, *map(shlex.quote, extra)])


def fresh_clone(into) -> Path:
    """A ``git clone`` of this checkout with its uncommitted changes to tracked files on top:
    what a user gets once they are committed. Files git does not track are not in it."""
    clone = into / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, capture_output=True)
    diff = subprocess.run(["git", "-C", str(ROOT), "diff", "HEAD", "--binary"], check=True, capture_output=True).stdout
    if diff:
        subprocess.run(["git", "-C", str(clone), "apply", "--whitespace=nowarn"], input=diff, check=True)
    return clone


def shell_without_a_venv(venv: Path) -> dict[str, str]:
    """A new shell's environment: no venv active (none on PATH, no VIRTUAL_ENV, no PYTHONPATH);
    ``TIANJI_VENV`` gives the clone's ./dev this checkout's set-up venv instead of a new one."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    venvs = {str(venv / "bin"), str(Path(sys.executable).parent)}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p not in venvs and ".venv" not in p
    )
    env["TIANJI_VENV"] = str(venv)
    env["TIANJI_TEST_PROCESSES"] = "0"  # the README's ./dev test, collected in one process rather than two
    return env


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_readme_shell_blocks_run_as_pasted_from_a_fresh_clone(tmp_path):
    """Each shell block of README.md, in its order, runs in a fresh clone from a bash without a
    venv (a block that is a fragment or marked not to run from a clone aside) and exits 0; a
    command the shell does not find (exit 127: a spelling that needs an activated venv) fails it
    first. The README's example run directory is made first (a short serial run), as a user has
    one after ./dev train."""
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    venv = Path(sys.prefix)
    assert (venv / "bin" / "tianji-dask").exists(), f"the tests run outside a set-up venv ({venv})"
    clone = fresh_clone(tmp_path)
    env = shell_without_a_venv(venv)
    readme = blocks(ROOT / "README.md")
    mine = [b for b in readme if b.run_from_a_clone]
    assert len(mine) >= 6, [b.key for b in readme]

    def bash(script: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "--noprofile", "--norc", "-e", "-c", script],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )

    (example,) = set(EXAMPLE_RUN.findall((ROOT / "README.md").read_text(encoding="utf-8")))
    made = bash(
        f"./dev train --serial --out {example} --set stop.target_return=null --set stop.max_env_steps=3000 "
        "--set algo.learning_starts=500"
    )
    assert made.returncode == 0, made.stderr[-3000:]

    for block in mine:
        lines = [as_run_here(line) for line in block.lines]
        r = bash("\n".join(lines))
        where = f"README.md:{block.line} ({block.key[1]!r}), run as:\n" + "\n".join(lines)
        assert r.returncode != COMMAND_NOT_FOUND, (
            f"{where}\nexit 127, a command the shell does not find: spell it ./dev COMMAND\n{r.stderr[-2000:]}"
        )
        assert r.returncode == 0, f"{where}\nexit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    # what the blocks made in the clone: every combination of the sweep's grid a run, its manifest
    # for sweep --resume, the plot, the plan
    (sweep,) = clone.glob("runs/sweeps/*/sweep.yaml")
    combinations = {f"seed={s}__algo.lr={lr}" for s in (0, 1) for lr in ("1e-4", "3e-4")}
    assert {p.parent.name for p in sweep.parent.glob("*/metrics.nc")} == combinations
    assert [p.read_bytes()[:8] for p in clone.glob("runs/*.png")] == [b"\x89PNG\r\n\x1a\n"]
    assert list(clone.glob("runs/plans/*.yaml"))


def test_the_readme_spells_every_command_one_way():
    """Every command line of the README's blocks runs ``./dev COMMAND`` (or sets a shell
    variable): none needs ``tianji-dask`` on PATH or spells the venv's path, and a block of
    commands is marked a shell block, so the fresh-clone test runs it."""
    wrong = []
    for block in blocks(ROOT / "README.md"):
        for line in block.lines:
            code = line.split("  #")[0].strip()
            if block.lang in SHELL and code and not re.match(r"^(\./dev \S|[A-Z_]+=\S)", code):
                wrong.append(f"README.md:{block.line}: {code}")
            if block.lang not in SHELL and re.match(r"^(\./dev|tianji-dask|\.venv/bin/)", code):
                wrong.append(f"README.md:{block.line}: a command in a ``` block without 'bash': {code}")
    assert not wrong, "\n".join(wrong)
