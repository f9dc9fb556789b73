"""The README's blocks must work as written, and ./dev and .ci/run must not drift apart from it.

The README shows exactly two commands (train, test) in the code block after the
``The two set-up commands`` marker. Each must be a command of ./dev, the train command must run
the reference config, and .ci/run must call the same test command. Those checks are fast:
nothing is installed or trained. The Python API block is run as a script, as a user pastes it:
that one trains CartPole to its target.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import doc_python_block

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DEV = ROOT / "dev"
CI = ROOT / ".ci" / "run"
MARKER = "The two set-up commands"


def readme_commands() -> list[list[str]]:
    """The commands of the first fenced block after the marker, comments stripped, split."""
    text = README.read_text(encoding="utf-8")
    assert MARKER in text, f"README.md lost the {MARKER!r} marker before the quick-start block"
    block = re.search(r"```[a-z]*\n(.*?)```", text[text.index(MARKER) :], re.S)
    assert block, "no fenced code block after the marker in README.md"
    commands = []
    for line in block.group(1).splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(words)
    return commands


def dev_subcommands() -> set[str]:
    """The case labels of ./dev's command dispatch, e.g. {'train', 'test', 'setup', ...}, and the
    tianji-dask commands it passes through (``TIANJI_COMMANDS``)."""
    text = DEV.read_text(encoding="utf-8")
    dispatch = text[text.index('case "$cmd" in') :]
    return {
        name.strip() for label in re.findall(r"^\s{4}([\w| -]+)\)\s*$", dispatch, re.M) for name in label.split("|")
    } | set(dev_passed_through())


def dev_passed_through() -> list[str]:
    """./dev's ``TIANJI_COMMANDS=(...)``: the tianji-dask commands it runs as they are."""
    found = re.search(r"^TIANJI_COMMANDS=\(([^)]*)\)$", DEV.read_text(encoding="utf-8"), re.M)
    assert found, "./dev lost its TIANJI_COMMANDS=(...) list"
    return found.group(1).split()


def dev_env() -> dict[str, str]:
    """The environment for running ./dev here: where the checkout's own .venv is not the venv
    running the tests, ``TIANJI_VENV`` points ./dev at the latter instead of setting up another."""
    env = dict(os.environ)
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        env["TIANJI_VENV"] = sys.prefix
    return env


def dev(*args, timeout: float = 110) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(DEV), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=dev_env(),
    )


def ci_command_lines() -> list[list[str]]:
    lines = []
    for line in CI.read_text(encoding="utf-8").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if words:
            lines.append(words)
    return lines


def test_readme_shows_exactly_two_dev_commands():
    commands = readme_commands()
    assert [c[:2] for c in commands] == [["./dev", "train"], ["./dev", "test"]], commands
    assert all(len(c) == 2 for c in commands), f"the quick-start commands take no arguments: {commands}"


def test_dev_passes_every_other_tianji_dask_command_through():
    from tianji_dask.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert sorted({"train", *dev_passed_through()}) == sorted(commands), "./dev's TIANJI_COMMANDS drifted from cli.py"


@pytest.mark.slow
def test_dev_runs_a_passed_through_command_and_refuses_an_unknown_one():
    r = dev("plot", "--help")
    assert r.returncode == 0 and "usage: tianji-dask plot" in r.stdout, r.stderr
    r = dev("evaluate", "runs/x")
    assert r.returncode == 2, r.stderr
    assert "unknown command 'evaluate'" in r.stderr and "eval sweep summary plot" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "given, says",
    [
        (
            "configs/cartpole",
            "configs/cartpole is not a config file (no such file); did you mean configs/cartpole_dqn.yaml?",
        ),
        ("configs", "configs is a directory, not a config file; give one of its configs: configs/cartpole_dqn.yaml"),
    ],
)
def test_dev_train_with_a_path_that_is_no_config_names_the_config_meant(given, says):
    r = dev("train", given, "--check")
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert "unrecognized arguments" not in r.stderr


def test_readme_commands_exist_in_dev():
    assert DEV.is_file(), "./dev is missing"
    assert DEV.read_text(encoding="utf-8").startswith("#!/usr/bin/env bash\n")
    assert os.access(DEV, os.X_OK), "./dev is not executable (chmod +x dev)"
    subcommands = dev_subcommands()
    for command in readme_commands():
        assert command[1] in subcommands, f"README command {command} is not a ./dev command {subcommands}"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_dev_train_trains_the_reference_config(tmp_path):
    """``./dev train`` with no config trains configs/cartpole_dqn.yaml (set-up is already done
    here, so ./dev takes its fast path) and passes its arguments on to ``tianji-dask train``."""
    out = tmp_path / "run"
    res = dev("train", "--set", "stop.max_seconds=3", "--out", out)
    assert res.returncode == 0, res.stderr[-3000:]
    from tianji_dask.config import load_config

    reference = load_config(ROOT / "configs" / "cartpole_dqn.yaml", ["stop.max_seconds=3"])
    assert load_config(out / "config.yaml") == reference
    assert (out / "metrics.nc").is_file()


@pytest.mark.slow
def test_dev_train_resume_brings_no_config_of_its_own(tmp_path):
    """``./dev train --resume RUN_DIR`` continues with the run's own config, whatever config
    made it: ./dev adds its default config only when neither a config nor --resume is given.
    A run of configs/cartpole_ppo.yaml without results is refused for those, not its config."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(ROOT / "configs" / "cartpole_ppo.yaml", run / "config.yaml")
    res = dev("train", "--resume", run)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "metrics.nc is missing" in res.stderr and "cartpole_dqn" not in res.stderr, res.stderr


def test_installed_torch_is_the_pin_and_pyproject_admits_it():
    from packaging.requirements import Requirement

    pin = re.search(r'^TORCH_PIN="torch==([0-9.]+)"$', DEV.read_text(encoding="utf-8"), re.M)
    assert pin, './dev must pin torch exactly (TORCH_PIN="torch==X.Y.Z")'
    assert importlib.metadata.version("torch").split("+")[0] == pin.group(1)
    torch_req = next(Requirement(r) for r in _pyproject()["project"]["dependencies"] if Requirement(r).name == "torch")
    assert torch_req.specifier.contains(pin.group(1)), (pin.group(1), str(torch_req))


def test_ci_runs_the_readme_test_command():
    test_command = readme_commands()[1]
    calls = [words for words in ci_command_lines() if words[: len(test_command)] == test_command]
    assert calls, f".ci/run does not call the README's test command {' '.join(test_command)!r}"


@pytest.mark.parametrize(
    ("rc", "tail", "verdict", "says"),
    [
        (0, "==== 3 passed in 1.0s ====", 0, "ci: ok"),
        (5, "==== no tests ran in 0.1s ====", 1, "collected no tests"),
        (0, "==== 2 skipped in 0.1s ====", 1, "passed no test"),
        (1, "==== 1 failed, 2 passed in 1.0s ====", 1, "exited 1"),
        (2, "interrupted", 2, "exited 2"),
    ],
)
def test_ci_verdict_on_a_pytest_run(tmp_path, rc, tail, verdict, says):
    log = tmp_path / "log"
    log.write_text(f"tests/test_x.py ...\n{tail}\n")
    res = subprocess.run(["bash", str(ROOT / ".ci" / "verdict.sh"), str(rc), str(log)], capture_output=True, text=True)
    assert res.returncode == verdict and says in res.stdout, (res.returncode, res.stdout)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_scripts_parse_and_help_needs_no_setup():
    for script in (DEV, CI):
        subprocess.run(["bash", "-n", str(script)], check=True)
    out = subprocess.run([str(DEV), "help"], capture_output=True, text=True, timeout=30, check=True)
    for command in readme_commands():
        assert " ".join(command) in out.stdout


def test_dev_is_executable_in_git():
    """A lost exec bit in a commit would break CI's ./dev call: check the index mode if tracked."""
    if shutil.which("git") is None:
        pytest.skip("git is missing")
    res = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--stage", "--", "dev", ".ci/run"], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip("not a git checkout")
    modes = {line.split("\t")[1]: line.split()[0] for line in res.stdout.splitlines()}
    if "dev" not in modes:
        pytest.skip("./dev is not committed yet")
    assert modes["dev"] == "100755", f"./dev is committed with mode {modes['dev']}; git add --chmod=+x dev"


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


API_MARKER = "**Python API.**"


def readme_python_api_block() -> str:
    """The first ```python block after the "Python API." paragraph of the README, as it stands."""
    return doc_python_block(README, API_MARKER)


@pytest.mark.integration
def test_readme_python_api_block_runs_as_a_script(tmp_path):
    """Pasted into a file and run with ``python file.py``, the block trains to the reference
    config's target and exits 0. Its relative config path resolves through a link to configs/,
    and its run directory lands under the temporary folder."""
    script = tmp_path / "train_api.py"
    script.write_text(readme_python_api_block(), encoding="utf-8")
    (tmp_path / "configs").symlink_to(ROOT / "configs", target_is_directory=True)
    res = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    status, ok, run_dir = res.stdout.split()[:3]
    assert (status, ok) == ("target_reached", "True"), res.stdout
    assert Path(run_dir).parent == tmp_path / "runs" and (Path(run_dir) / "metrics.nc").is_file()


def test_readme_states_the_configs_run_intervals():
    """Each ``run.X_interval`` (N s) the README names is the config's default, and the README says
    how often the results are saved while a run goes on."""
    from tianji_dask.config.schema import RunConfig

    stated = dict(re.findall(r"run\.(\w+_interval)`? \(([0-9.]+) s\)", README.read_text(encoding="utf-8")))
    assert "save_interval" in stated, "README.md does not say that run.save_interval rewrites the .nc files"
    for name, seconds in stated.items():
        assert float(seconds) == RunConfig.model_fields[name].default, (name, seconds)
