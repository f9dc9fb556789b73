"""The run's private CUDA MPS daemon: when a run starts one, how its start fails, and that it
dies with the thread that started it. The daemon itself needs a GPU: the CUDA test runs a real
run under it on the device machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch

from tianji_dask.config import ConfigError, load_config
from tianji_dask.runtime.processes.cuda_mps import CONTROL, PrivateMps, cuda_processes, mps_control


def _config(*sets: str):
    sets = ("learner.device=cuda", "actor.device=cuda", *sets)
    return load_config("configs/pong_ppo_small.yaml", list(sets), check_device=torch.cuda.is_available())


def _control_on_path(tmp_path, monkeypatch) -> str:
    program = tmp_path / CONTROL
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return str(program)


def test_the_run_counts_its_processes_on_cuda():
    assert cuda_processes(_config()) == 2
    assert cuda_processes(_config("actor.device=cpu")) == 1
    assert cuda_processes(_config("topology.groups=2", "topology.actors=2")) == 6
    assert cuda_processes(load_config("configs/cartpole_dqn.yaml", [])) == 0


def test_a_daemon_is_started_only_where_two_processes_share_cuda(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no control program
    assert mps_control("auto", _config()) is None
    program = _control_on_path(tmp_path, monkeypatch)
    assert mps_control("auto", _config()) == program
    assert mps_control("on", _config()) == program
    assert mps_control("off", _config()) is None
    assert mps_control("on", _config("actor.device=cpu")) is None
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "users_own"))
    assert mps_control("on", _config()) is None


def test_a_daemon_required_without_its_program_is_refused_naming_the_setting(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError) as err:
        mps_control("on", _config())
    message = str(err.value)
    assert "tianji.local-cluster.cuda-mps=on" in message and CONTROL in message
    assert "DASK_TIANJI__LOCAL_CLUSTER__CUDA_MPS=auto" in message


def test_a_daemon_that_exits_at_once_fails_the_start_with_its_words_and_leaves_no_directory(tmp_path):
    program = tmp_path / "exits"
    program.write_text("#!/bin/sh\necho 'cannot find a GPU'\nexit 3\n")
    program.chmod(0o755)
    mps = PrivateMps(str(program))
    with pytest.raises(RuntimeError, match=r"exited with status 3 .*cannot find a GPU"):
        mps.start()
    assert not mps.root.exists()


def test_the_daemon_dies_with_the_process_that_started_it_even_killed(tmp_path):
    starter = textwrap.dedent(
        """
        import sys, time
        from tianji_dask.runtime.processes.cuda_mps import dying_with_parent
        child = dying_with_parent(["sleep", "300"])
        print(child.pid, flush=True)
        time.sleep(300)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    child = psutil.Process(int(proc.stdout.readline()))
    deadline = time.monotonic() + 10
    while child.name() != "sleep" and time.monotonic() < deadline:  # until the exec
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    child.wait(10)  # psutil.TimeoutExpired if it outlived its parent


@pytest.mark.skipif(torch.cuda.device_count() < 1 or not os.access("/dev/nvidiactl", os.R_OK), reason="needs a GPU")
def test_a_run_with_its_learner_and_actor_on_one_gpu_runs_under_its_own_mps_daemon(tmp_path, monkeypatch):
    from tianji_dask import train

    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    if mps_control("auto", _config()) is None:
        pytest.skip(f"{CONTROL} is not on PATH")
    events: list[str] = []
    cfg = _config("stop.max_env_steps=20000", "stop.target_return=null")
    result = train(cfg, out=tmp_path / "run", on_event=events.append).wait(timeout=300)
    assert result.ok, result.error
    assert any(e.startswith("CUDA MPS: the run's 2 GPU processes") for e in events), events
    left = [
        p.info for p in psutil.process_iter(["pid", "name"]) if (p.info["name"] or "").startswith("nvidia-cuda-mps")
    ]
    assert not left, left
