"""benchmarks/learner_throughput.py: two source trees measured side by side, each really
imported from its own directory, and bad input refused before any measurement."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses of the benchmark script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "learner_throughput.py"


def bench(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


@pytest.mark.timeout(200)
def test_two_sources_side_by_side(tmp_path):
    other = tmp_path / "other"
    shutil.copytree(ROOT / "tianji_dask", other / "tianji_dask", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "out"
    r = bench(
        "configs/cartpole_dqn.yaml",
        "--src",
        str(ROOT),
        str(other),
        "--seconds",
        "0.3",
        "--repeats",
        "1",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "learner_throughput.json").read_text())["results"]["configs/cartpole_dqn.yaml"]
    names = [ROOT.name, "other"]
    assert list(res["median"]) == names
    assert all(len(res["samples_per_s"][n]) == 1 and min(res["samples_per_s"][n]) > 0 for n in names)
    assert res["ratio_to_first"][ROOT.name] == 1.0
    assert (out / "learner_throughput.nc").stat().st_size > 0


@pytest.mark.timeout(200)
def test_variants_give_one_tree_overrides_of_its_own(tmp_path):
    """``--variant NAME DIR KEY=VALUE``: each variant's overrides reach only its measurements (a
    bad value for one variant fails it, the same tree without it measures), labelled by name."""
    out = tmp_path / "out"
    common = ["configs/cartpole_ppo.yaml", "--seconds", "0.3", "--repeats", "1", "--out", str(out)]
    r = bench(
        *common, "--variant", "plain", str(ROOT), "--variant", "minibatch", str(ROOT), "algo.cuda_graph=minibatch"
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "learner_throughput.json").read_text())
    assert summary["variants"]["minibatch"] == {"src": str(ROOT), "overrides": ["algo.cuda_graph=minibatch"]}
    res = summary["results"]["configs/cartpole_ppo.yaml"]
    assert list(res["median"]) == ["plain", "minibatch"] and min(res["median"].values()) > 0
    # the same tree without the bad value measured above: the bad one alone fails
    r = bench(*common, "--variant", "bad", str(ROOT), "algo.precision=bf16")
    assert r.returncode != 0 and "algo.precision=bf16" in r.stderr


@pytest.mark.timeout(60)
def test_a_source_that_fails_to_measure_is_reported(tmp_path):
    broken = tmp_path / "broken" / "tianji_dask"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('this tree is broken on purpose')\n")
    r = bench(
        "configs/cartpole_dqn.yaml",
        "--src",
        str(broken.parent),
        "--seconds",
        "0.3",
        "--repeats",
        "1",
        "--out",
        str(tmp_path / "out"),
    )
    assert r.returncode != 0 and "broken on purpose" in r.stderr
    assert not (tmp_path / "out" / "learner_throughput.json").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["configs/nope.yaml"], "config configs/nope.yaml does not exist"),
        (["configs/cartpole_dqn.yaml", "--src", "/tmp"], "holds no tianji_dask package"),
        (["configs/cartpole_dqn.yaml", "--src", str(ROOT), str(ROOT)], "names must differ"),
        (["configs/cartpole_dqn.yaml", "--repeats", "0"], "--repeats and --threads at least 1"),
        (["configs/cartpole_dqn.yaml", "--variant", "a"], "--variant takes NAME DIR"),
        (["configs/cartpole_dqn.yaml", "--variant", "a", str(ROOT), "lr"], "--variant takes NAME DIR"),
        (["configs/cartpole_dqn.yaml", "--variant", "a", str(ROOT), "--variant", "a", str(ROOT)], "names must differ"),
    ],
)
def test_bad_input_is_refused_with_the_fix(h, tmp_path, args, message):
    # the first refusal as the script's own process (its exit status), the rest called here
    first = args == ["configs/nope.yaml"]
    r = (
        bench(*args, "--out", str(tmp_path / "out"), timeout=30)
        if first
        else h.called_here(h.script_main(SCRIPT), *args, "--out", tmp_path / "out", cwd=ROOT)
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)
def test_learner_kernels_profiles_a_tree_on_the_cpu(tmp_path):
    """benchmarks/learner_kernels.py, the kernel table's companion script, on the CPU (no kernels
    there: the totals it reports are the wall time's), importing the tree given by --src."""
    other = tmp_path / "other"
    shutil.copytree(ROOT / "tianji_dask", other / "tianji_dask", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "learner_kernels.py"),
            "configs/cartpole_ppo.yaml",
            "--device",
            "cpu",
            "--warmup",
            "1",
            "--iterations",
            "1",
            "--src",
            str(other),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "learner_kernels.json").read_text())
    assert Path(summary["package"]).is_relative_to(other) and summary["samples_per_s"] > 0
    assert "aten::" in (out / "learner_kernels.txt").read_text()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal where no GPU is")
def test_learner_direct_refuses_a_machine_without_cuda_before_writing_anything(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "learner_direct.py"),
            "configs/pong_ppo.yaml",
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2 and "needs a CUDA device" in done.stderr, done.stderr
    assert not (tmp_path / "o").exists()
