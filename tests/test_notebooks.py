"""The notebooks in notebooks/ run top to bottom, and are committed without outputs.

Each notebook is executed by nbclient in a kernel of this interpreter, with a per-cell timeout;
any cell error fails the test. It runs in a copy of the tree it needs (notebooks/ and configs/
under tmp_path), so its run directories (``runs/`` next to the notebook) never land in the
checkout. The wall time of each notebook is printed (``-s``) and recorded as a test property.

02_slurm.ipynb submits Slurm jobs only to a local Slurm from jobqueue/local-slurm.sh (found
through SLURM_CONF, as the other Slurm tests do); without one it must still run, skipping its
Slurm cells and saying so. With TIANJI_REQUIRE_SLURM=1 (CI) its Slurm cells must have run.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 600  # per cell; 03's training cell runs its runs of at most 60 s each
SLURM_RAN = "ran on Slurm:"  # 02_slurm prints this after its run on the Slurm jobs
SLURM_SKIPPED = "Slurm cells skipped"
# Set after a notebook's cell tagged "parameters" (papermill's convention): a target of 60
# instead of the config's 300 still shows every cell's output; in 03, one seed a run per actor
# count (its table and figures take the settings that differ, its medians are one run's) and a
# target of 40 still give a time to target for each run; 0.3 s per profile measurement still
# gives 02 a plan.
TEST_PARAMETERS = {
    "01_quickstart": "target_return = 60.0",
    "02_slurm": "profile_seconds = 0.3\ntarget_return = 60.0",
    "03_compare_runs": "seeds = (0,)\ntarget_return = 40.0",
}


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_slurm.ipynb", "03_compare_runs.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stripped(path):
    """Committed notebooks carry no outputs and no execution counts (strip them before committing,
    e.g. jupyter nbconvert --clear-output --inplace notebooks/*.ipynb)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)
    ]
    assert not dirty, (
        f"{path.name}: code cells {dirty} have outputs or execution counts; clear them with "
        f"jupyter nbconvert --clear-output --inplace {path.relative_to(ROOT)}"
    )
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", nb.metadata.get("kernelspec")


def test_start_refuses_to_make_a_cluster():
    import tianji_dask

    with pytest.raises(TypeError, match=r"LocalCluster\(n_workers=2, threads_per_worker=1\)"):
        tianji_dask.start(ROOT / "configs" / "cartpole_dqn.yaml", None)


def test_start_takes_overrides_as_strings_or_a_dict():
    from tianji_dask.config import load_config
    from tianji_dask.notebook import _resolve_config

    config = ROOT / "configs" / "cartpole_dqn.yaml"
    strings = ["seed=3", "stop.target_return=null", "algo.hidden_sizes=[32, 32]"]
    as_dict = {"seed": 3, "stop.target_return": None, "algo.hidden_sizes": [32, 32]}
    expected = load_config(config, strings)
    assert _resolve_config(config, strings) == expected
    assert _resolve_config(str(config), as_dict) == expected
    assert _resolve_config(load_config(config), as_dict) == expected
    with pytest.raises(TypeError, match="overrides=\\['seed=3'\\]"):
        _resolve_config(config, "seed=3")


def _outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out:
                parts.append(out["data"].get("text/plain", ""))
            elif out.get("output_type") == "error":
                parts.append("\n".join(out.get("traceback", [])))
    return "\n".join(parts)


def _inject_parameters(nb, source: str) -> None:
    """Insert ``source`` as a cell right after the notebook's cell tagged ``parameters``."""
    import nbformat

    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"expected one cell tagged 'parameters', found {len(tagged)}"
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(tagged[0] + 1, cell)


@pytest.mark.parametrize("stem", sorted(TEST_PARAMETERS))
def test_injected_parameters_follow_the_parameters_cell_and_set_its_names(stem):
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    _inject_parameters(nb, TEST_PARAMETERS[stem])
    at = next(i for i, c in enumerate(nb.cells) if "injected-parameters" in c.metadata.get("tags", []))
    assert "parameters" in nb.cells[at - 1].metadata["tags"]
    declared = {line.split("=")[0].strip() for line in nb.cells[at - 1].source.splitlines() if "=" in line}
    injected = {line.split("=")[0].strip() for line in TEST_PARAMETERS[stem].splitlines()}
    assert injected <= declared, injected - declared  # no name the notebook does not read
    later = "\n".join(c.source for c in nb.cells[at + 1 :] if c.cell_type == "code")
    assert all(re.search(rf"\b{name}\b", later) for name in declared), declared  # each one used below


def _slurm_env(env: dict) -> tuple[dict, bool]:
    """The kernel's environment and whether 02_slurm must use Slurm: only a local Slurm from
    jobqueue/local-slurm.sh; without one SLURM_CONF points nowhere, so no other cluster is used."""
    from slurm_support import _why_not

    conf, reason = _why_not()
    if conf is not None:
        return env, True
    if os.environ.get("TIANJI_REQUIRE_SLURM") == "1":
        pytest.fail(f"TIANJI_REQUIRE_SLURM=1 but no local Slurm answers: {reason}", pytrace=False)
    return {**env, "SLURM_CONF": "/nonexistent/no-local-slurm/slurm.conf"}, False


@pytest.mark.integration
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, record_property, capsys):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "notebooks").mkdir()
    nb_path = tmp_path / "notebooks" / path.name
    shutil.copy(path, nb_path)
    nb = nbformat.read(nb_path, as_version=4)
    if path.stem in TEST_PARAMETERS:
        _inject_parameters(nb, TEST_PARAMETERS[path.stem])

    # DASK_CONFIG: a user's dask/jobqueue settings stay out, and importing dask_jobqueue writes
    # its template jobqueue.yaml there rather than into ~/.config/dask
    env, use_slurm = {**os.environ, "DASK_CONFIG": str(tmp_path / "dask-config")}, None
    if path.stem == "02_slurm":
        env, use_slurm = _slurm_env(env)

    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(nb_path.parent)}}
    )
    t0 = time.monotonic()
    try:
        client.execute(env=env)
    except CellExecutionError as exc:
        nbformat.write(nb, tmp_path / f"failed-{path.name}")
        pytest.fail(
            f"{path.name}: a cell failed after {time.monotonic() - t0:.0f} s "
            f"(executed copy: {tmp_path / f'failed-{path.name}'}):\n{str(exc)[-4000:]}",
            pytrace=False,
        )
    wall = time.monotonic() - t0
    nbformat.write(nb, tmp_path / f"executed-{path.name}")
    record_property("wall_s", round(wall, 1))
    with capsys.disabled():
        print(f"\n{path.name}: executed in {wall:.1f} s", file=sys.stderr)

    text = _outputs_text(nb)
    if use_slurm is True:
        assert SLURM_RAN in text, f"02_slurm did not run on the local Slurm:\n{text[-4000:]}"
    elif use_slurm is False:
        assert SLURM_SKIPPED in text, f"02_slurm did not say that it skipped Slurm:\n{text[-4000:]}"
