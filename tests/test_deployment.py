"""The ``tianji`` namespace of the Dask config: its defaults come from the packaged tianji.yaml,
Dask's usual sources override them, a wrong value is refused naming key, value and variable, and
the code that waits or writes reads them."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import dask.config
import pytest
import yaml
from conftest import CONFIG, ROOT

from tianji_dask.config import ConfigError
from tianji_dask.config.deployment import DEFAULTS_FILE, deployment_settings


def test_the_defaults_are_the_packaged_yaml():
    assert dask.config.get("tianji") == yaml.safe_load(DEFAULTS_FILE.read_text(encoding="utf-8"))["tianji"]
    settings = deployment_settings()
    assert settings.runs_dir == Path("runs")
    assert settings.local_cluster.dashboard_address == "127.0.0.1:0"
    assert settings.scheduler.connect_timeout == 10
    timeouts = settings.timeouts
    assert (timeouts.host_startup, timeouts.first_params, timeouts.data_parallel) == (60, 60, 30)
    assert timeouts.slurm_workers == 600


def test_dask_config_set_overrides_a_default():
    with dask.config.set({"tianji.timeouts.data-parallel": "2m", "tianji.runs_dir": "/scratch/runs"}):
        settings = deployment_settings()
    assert settings.timeouts.data_parallel == 120 and settings.runs_dir == Path("/scratch/runs")
    assert deployment_settings().timeouts.data_parallel == 30


def test_environment_variables_and_yaml_files_override_a_default(tmp_path):
    """In a fresh process, as Dask reads them: DASK_TIANJI__* variables and YAML files in
    $DASK_CONFIG; the commented copy of the defaults lands there too."""
    (tmp_path / "site.yaml").write_text("tianji:\n  local-cluster:\n    dashboard-address: 127.0.0.1:8787\n")
    env = {
        **os.environ,
        "DASK_CONFIG": str(tmp_path),
        "DASK_TIANJI__TIMEOUTS__DATA_PARALLEL": "45",
        "DASK_TIANJI__RUNS_DIR": "/scratch/runs",
    }
    code = (
        "import json\n"
        "from tianji_dask.config.deployment import deployment_settings\n"
        "s = deployment_settings()\n"
        "print(json.dumps([s.timeouts.data_parallel, str(s.runs_dir), s.local_cluster.dashboard_address, "
        "s.timeouts.first_params]))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [45.0, "/scratch/runs", "127.0.0.1:8787", 60.0]
    copy = (tmp_path / "tianji.yaml").read_text(encoding="utf-8")
    assert "#   runs-dir: runs" in copy and yaml.safe_load(copy) is None  # every line commented out


def test_a_wrong_setting_names_key_value_and_variable():
    wrong = {"tianji.timeouts.data-parallel": "soon", "tianji.local-cluster.dashbord-address": "x"}
    with dask.config.set(wrong), pytest.raises(ConfigError) as refused:
        deployment_settings()
    message = str(refused.value)
    assert "invalid Dask config, tianji namespace" in message and str(DEFAULTS_FILE) in message
    assert (
        "tianji.timeouts.data-parallel='soon': must be a duration such as 30s, 2m (minutes) or 90 (seconds) "
        "(DASK_TIANJI__TIMEOUTS__DATA_PARALLEL)"
    ) in message
    assert "tianji.local-cluster.dashbord-address: unknown key (did you mean 'dashboard-address'?)" in message


@pytest.mark.parametrize("value", [True, 0, "-5s", [30]])
def test_a_timeout_must_be_a_positive_duration(value):
    with dask.config.set({"tianji.scheduler.connect-timeout": value}), pytest.raises(ConfigError):
        deployment_settings()


@pytest.mark.slow  # the CLI in a subprocess
@pytest.mark.parametrize("where", [[], ["--slurm"]])
def test_the_cli_refuses_a_wrong_setting_before_anything_starts(tmp_path, where):
    """Exit 2 before a run directory is made or a Slurm job is submitted."""
    env = {**os.environ, "DASK_TIANJI__TIMEOUTS__HOST_STARTUP": "soon"}
    out = tmp_path / "out"
    res = subprocess.run(
        [sys.executable, "-m", "tianji_dask.cli", "train", str(CONFIG), "--out", str(out), *where],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 2, res.stderr
    assert "tianji.timeouts.host-startup='soon'" in res.stderr and "Traceback" not in res.stderr
    assert not out.exists()


# ------------------------------------------------------------------ where the settings are read
def test_runs_plans_and_profiles_go_under_the_runs_dir(tmp_path):
    from tianji_dask.deploy.planner import default_plan_path
    from tianji_dask.deploy.profiling import default_profile_path
    from tianji_dask.results.rundir import prepare_run_dir

    with dask.config.set({"tianji.runs-dir": str(tmp_path / "runs")}):
        assert prepare_run_dir(None, name="r").parent == tmp_path / "runs"
        assert default_plan_path("configs/x.yaml", 4).parent == tmp_path / "runs" / "plans"
        assert default_profile_path("configs/x.yaml").parent == tmp_path / "runs" / "profiles"


def test_the_local_cluster_dashboard_listens_where_configured(monkeypatch):
    from tianji_dask.runtime.cluster import cluster

    monkeypatch.setattr(cluster, "TianjiLocalCluster", lambda **kwargs: kwargs)
    monkeypatch.setattr(cluster, "spawned_ignoring_driver_signals", contextlib.nullcontext)
    monkeypatch.setattr(cluster, "start_fork_server", lambda: None)
    with dask.config.set({"tianji.local-cluster.dashboard-address": "127.0.0.1:8787"}):
        assert cluster.local_cluster(2)["dashboard_address"] == "127.0.0.1:8787"
        assert cluster.local_cluster(2, dashboard=False)["dashboard_address"] is None


def test_the_scheduler_check_waits_the_connect_timeout(monkeypatch):
    import socket

    from tianji_dask.deploy.preflight import SchedulerUnreachable, check_scheduler_listens

    def no_answer(address, timeout):
        raise TimeoutError

    monkeypatch.setattr(socket, "create_connection", no_answer)
    with (
        dask.config.set({"tianji.scheduler.connect-timeout": "3s"}),
        pytest.raises(SchedulerUnreachable, match="no answer within 3 s"),
    ):
        check_scheduler_listens("tcp://127.0.0.1:8786")


def test_a_host_silent_past_the_startup_timeout_is_lost():
    from tianji_dask.errors import HostLost
    from tianji_dask.runtime.cluster.supervisor import Supervisor

    with dask.config.set({"tianji.timeouts.host-startup": "2s"}):
        run_section = SimpleNamespace(heartbeat_timeout=5.0, max_restarts=3, restart_window_s=600.0)
        run = Supervisor(None, SimpleNamespace(run=run_section), "r", lambda text: None, since=time.time())
    run._expected = {("actor", 0): "tcp://127.0.0.1:1"}
    run._next_worker_check = float("inf")  # no scheduler to ask
    run._started_at = time.time() - 1
    run.check_health()  # within the 2 s
    run._started_at = time.time() - 3
    with pytest.raises(HostLost, match=r"no heartbeat within 2 s of starting \(tianji.timeouts.host-startup\)"):
        run.check_health()


def test_an_actor_waits_the_first_params_timeout_for_parameters():
    from tianji_dask.runtime.hosts.hosts import ActorHost

    def no_params(timeout, stop):
        time.sleep(timeout)
        raise TimeoutError

    host = SimpleNamespace(
        id=3,
        cfg=SimpleNamespace(run=SimpleNamespace(metrics_interval=0.01)),
        _built=SimpleNamespace(wait_for_params=no_params),
        _stop=SimpleNamespace(is_set=lambda: False),
        _beat=lambda: None,
    )
    start = time.monotonic()
    with (
        dask.config.set({"tianji.timeouts.first-params": "200ms"}),
        pytest.raises(TimeoutError, match=r"after 0.2 s \(tianji.timeouts.first-params\)"),
    ):
        ActorHost._before_loop(host)
    assert 0.2 <= time.monotonic() - start < 2
