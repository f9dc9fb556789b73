"""A run's start-up timeline (issue 69): the seconds from the process's start to the cluster up,
the hosts built, the first parameters, the first env step and the first learner update, in
metrics.nc's attributes and said once as a line; and the learner's optimiser made after its
first parameters are out, so that the actors do not wait for it."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import xarray as xr
from conftest import ROOT

from tianji_dask.algos.dqn.core import DQNLearner
from tianji_dask.algos.ppo.core import PPOLearner
from tianji_dask.config.machine import compiler_problem
from tianji_dask.config.schema import DQNConfig, PPOConfig
from tianji_dask.runtime.startup_timeline import PHASES, StartupTimeline, process_started_at

ORDERED = ("cluster_up", "first_parameters", "first_env_step", "first_learner_update")


def _beat(role: str, i: int, incarnation: int = 0, **times: float) -> dict:
    return {"role": role, "id": i, "incarnation": incarnation, "startup": times}


def test_the_timeline_takes_the_earliest_host_of_each_phase_and_is_said_once_complete():
    said: list[str] = []
    timeline = StartupTimeline(100.0, "process start", on_complete=said.append)
    timeline.mark("cluster_up", 102.0)
    timeline.expect_hosts(["actor 0", "actor 1", "buffer 0", "learner 0"])
    timeline.add(_beat("learner", 0, built=102.5, first_parameters=102.6))
    timeline.add(_beat("buffer", 0, built=102.2))
    timeline.add(_beat("actor", 1, built=102.4, first_env_step=103.0))
    timeline.add(_beat("actor", 0, built=102.3, first_env_step=102.8))
    assert "hosts_built" not in timeline.seconds() or timeline.seconds()["hosts_built"] == pytest.approx(2.5)
    assert not said  # no learner update yet
    timeline.add(_beat("learner", 0, incarnation=1, built=150.0, first_learner_update=151.0))  # a re-creation
    assert not said
    timeline.add(
        {
            **_beat("learner", 0, built=102.5, first_parameters=102.6, first_learner_update=104.0),
            "build_parts": {"prepare": 1.2},
        }
    )
    assert said == [
        "start-up, seconds from the process start: cluster up 2.0, hosts built 2.5, first parameters 2.6, "
        "first env step 2.8, first learner update 4.0"
    ]
    timeline.add(_beat("actor", 0, built=102.3, first_env_step=102.8))
    assert len(said) == 1
    attrs = timeline.attrs()
    assert attrs["startup_first_env_step_s"] == pytest.approx(2.8)  # actor 0's, the earlier
    assert attrs["startup_origin"] == "process start"
    assert attrs["startup_learner_prepare_s"] == 1.2
    assert json.loads(str(attrs["startup_hosts_built_json"])) == {
        "actor 0": 2.3,
        "actor 1": 2.4,
        "buffer 0": 2.2,
        "learner 0": 2.5,
    }


def test_a_phase_not_reached_is_nan_and_a_host_not_built_keeps_hosts_built_out():
    timeline = StartupTimeline(10.0, "train() call")
    timeline.mark("cluster_up", 11.0)
    timeline.expect_hosts(["actor 0", "learner 0"])
    timeline.add(_beat("learner", 0, built=11.5, first_parameters=11.6))
    attrs = timeline.attrs()
    assert attrs["startup_cluster_up_s"] == pytest.approx(1.0)
    assert math.isnan(float(attrs["startup_hosts_built_s"]))  # the actor was never built
    assert math.isnan(float(attrs["startup_first_env_step_s"]))
    with pytest.raises(ValueError, match="unknown start-up phase 'cluster'"):
        timeline.mark("cluster", 12.0)


def test_the_process_start_is_this_interpreters_to_a_clock_tick():
    code = (
        "import time; from tianji_dask.runtime.startup_timeline import process_started_at as p; print(p(), time.time())"
    )
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    started, now = map(float, out.split())
    assert before - 0.05 <= started <= now, (before, started, now)
    assert process_started_at() < before


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_a_learner_core_makes_its_optimiser_only_when_prepared_or_updated(algo):
    """Making a torch optimiser imports torch._dynamo (seconds): a learner core built for its
    first parameters has none yet; ``prepare()`` makes it, once, or the first update does."""

    def core_of(seed: int):
        if algo == "dqn":
            return DQNLearner(4, 2, DQNConfig(name="dqn", hidden_sizes=[16]), seed=seed)
        return PPOLearner(4, 2, PPOConfig(name="ppo", hidden_sizes=[16]), seed=seed)

    core = core_of(0)
    assert core.run._optim is None
    core.prepare()
    made = core.run._optim
    assert isinstance(made, torch.optim.Adam)
    core.prepare()
    assert core.run._optim is made
    state = core.state()
    fresh = core_of(1)
    fresh.restore(state)  # a restore makes its own
    assert isinstance(fresh.run._optim, torch.optim.Adam)


def _run_until_started(out, env: dict[str, str], *overrides: str) -> tuple[dict, str]:
    """``tianji-dask train`` of the CartPole config, stopped (SIGINT) once its start-up timeline
    is complete: metrics.nc's attributes, and the line that said the timeline."""
    cmd = [sys.executable, "-m", "tianji_dask.cli", "train", "configs/cartpole_dqn.yaml", "--out", str(out)]
    for override in ("stop.target_return=null", *overrides):
        cmd += ["--set", override]
    began = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    said: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        said.append(line)
        if line.startswith("start-up, seconds from the process start: "):
            ended = time.time()
            proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 128 + signal.SIGINT, "".join(said)
    (timeline,) = [line for line in said if line.startswith("start-up, ")]
    with xr.open_dataset(out / "metrics.nc") as ds:
        attrs = dict(ds.attrs)
    _check_timeline(attrs, timeline, ended - began)
    return attrs, timeline


def _check_timeline(attrs: dict, said: str, within_s: float) -> None:
    """The timeline of a CLI run: from the process start, every phase reached, in order, each
    host's built time, and the line saying the same figures."""
    seconds = {phase: float(attrs[f"startup_{phase}_s"]) for phase in PHASES}
    assert attrs["startup_origin"] == "process start"
    assert seconds["cluster_up"] > 0 and all(not math.isnan(s) for s in seconds.values()), seconds
    assert [seconds[p] for p in ORDERED] == sorted(seconds[p] for p in ORDERED), seconds
    assert seconds["cluster_up"] <= seconds["hosts_built"] < within_s, seconds
    built = json.loads(attrs["startup_hosts_built_json"])
    assert set(built) == {"actor 0", "buffer 0", "learner 0"}, built
    assert max(built.values()) == pytest.approx(seconds["hosts_built"], abs=1e-3)
    for phase, s in seconds.items():
        assert f"{phase.replace('_', ' ')} {s:.1f}" in said, (phase, said)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_cli_runs_record_their_start_up_and_the_second_compiles_from_the_first_runs_cache(tmp_path):
    """Two ``tianji-dask train`` runs with ``algo.compile``, stopped as their start-up ends: each
    records its timeline from the process's start; the first on a machine compiles its learner
    (inductor's C++ here: tens of seconds), the next finds the kernels in inductor's cache (per
    user, kept between runs) and prepares in a fraction of that time; in both the actors step
    before the learner has prepared."""
    problem = compiler_problem("cpu")
    if problem:
        pytest.skip(problem)
    # one compile thread: on two cores the compile pool costs more than it saves
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "compile-cache"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    cold, _ = _run_until_started(tmp_path / "first", env, "algo.compile=true")
    warm, _ = _run_until_started(tmp_path / "second", env, "algo.compile=true", "seed=1")
    first, second = cold["startup_learner_prepare_s"], warm["startup_learner_prepare_s"]
    assert second < first / 2, (first, second)
    for attrs in (cold, warm):
        prepared = attrs["startup_first_parameters_s"] + attrs["startup_learner_prepare_s"]
        assert attrs["startup_first_env_step_s"] < prepared < attrs["startup_first_learner_update_s"] + 0.01, attrs
