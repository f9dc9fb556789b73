"""benchmarks/actor_phases.py with a learner training beside the actor, on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU = ["--set", "actor.device=cpu", "--set", "learner.device=cpu"]


def _actor_phases(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "actor_phases.py"), "configs/pong_ppo_small.yaml", *CPU, *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_learner_in_another_process_trains_beside_the_timed_actor(tmp_path):
    out = tmp_path / "o"
    done = _actor_phases(tmp_path, "--seconds", "6", "--learner-beside", "process", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "actor_phases.json").read_text())
    assert result["learner_beside"] == "process" and result["learner_busy"] == 1.0
    assert result["learner_iterations_per_s"] > 0 and result["env_steps_per_s"] > 0
    assert "learner beside:" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_busy_fraction_out_of_range_is_refused_before_anything_runs(tmp_path):
    out = tmp_path / "o"
    done = _actor_phases(tmp_path, "--learner-beside", "thread", "--learner-busy", "0", "--out", str(out))
    assert done.returncode == 2 and "--learner-busy 0.0 is not in (0, 1]" in done.stderr, done.stderr
    assert not out.exists()
