"""An env of the user's own through ``env.id: module:EnvId`` (docs/environments.md), as the doc
writes it: its module registers the env, the run's LocalCluster workers import it through
PYTHONPATH, and eval makes the same env from the run's config."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
import xarray as xr
from conftest import ROOT, cli_here, doc_python_block

DOC = ROOT / "docs" / "environments.md"


def _documented_command() -> list[str]:
    """The doc's training command, as words."""
    text = DOC.read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text[text.index("## Your own env") :], re.S)
    assert block, "docs/environments.md lost its ```bash block"
    return shlex.split(block.group(1))


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_documented_custom_env_trains_and_plays_through_its_module_id(tmp_path):
    (tmp_path / "corridor.py").write_text(doc_python_block(DOC, "## Your own env"), encoding="utf-8")
    (tmp_path / "configs").symlink_to(ROOT / "configs", target_is_directory=True)
    words = _documented_command()
    assert words[:3] == ["PYTHONPATH=$PWD", "./dev", "train"], words
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    short = ["--set", "stop.max_env_steps=512", "--set", "stop.target_return=null"]  # a few hundred steps
    trained = subprocess.run(
        [sys.executable, "-m", "tianji_dask.cli", "train", *words[3:], *short],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    assert trained.returncode == 0, trained.stderr
    (run_dir,) = (tmp_path / "runs").glob("corridor-Corridor-v0__ppo__0__*")
    with xr.open_dataset(run_dir / "metrics.nc", engine="netcdf4") as ds:
        assert int(ds["env_steps"].values[-1]) >= 512 and ds.attrs["status"] == "max_env_steps"
    with xr.open_dataset(run_dir / "episodes.nc", engine="netcdf4") as episodes:
        assert episodes.sizes["episode"] > 0
    played = subprocess.run(
        [sys.executable, "-m", "tianji_dask.cli", "eval", str(run_dir), "--episodes", "3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert played.returncode == 0 and "3 episodes: return" in played.stdout, played.stderr


def test_a_module_that_does_not_import_is_refused_before_the_run(tmp_path):
    (tmp_path / "configs").symlink_to(ROOT / "configs", target_is_directory=True)
    words = _documented_command()
    r = cli_here("train", *words[3:], "--check", cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "gymnasium.make failed: ModuleNotFoundError: No module named 'corridor'" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()
