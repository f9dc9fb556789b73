"""Helpers of the Slurm tests: ``require_slurm()`` for the ones that need a real (local) Slurm
(the fixtures ``slurm_conf`` and ``jobqueue_defaults`` in conftest.py build on it);
``fake_command`` and the plans they submit for all.

(``tests/`` is on ``sys.path`` under pytest's default import mode, as for ``conftest``.)

The tests only ever talk to a Slurm started by ``jobqueue/local-slurm.sh`` (its slurm.conf names
the cluster ``tianji-local``), found through ``SLURM_CONF``: they never submit to a real
cluster that happens to be configured on the machine. Without one they skip, unless
``TIANJI_REQUIRE_SLURM=1`` (set by CI), where they fail: a skip there would hide a broken
Slurm install.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "jobqueue" / "local-slurm.sh"
CLUSTER_NAME = "tianji-local"  # written by jobqueue/local-slurm.sh
HOW_TO_START = (
    "start one with: sudo jobqueue/local-slurm.sh start /tmp/tj-slurm && "
    'eval "$(jobqueue/local-slurm.sh env /tmp/tj-slurm)"'
)


def _why_not() -> tuple[str | None, str | None]:
    """``(SLURM_CONF, None)`` when the local Slurm answers, else ``(None, reason)``."""
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        return None, "SLURM_CONF is not set"
    path = Path(conf)
    if not path.is_file():
        return None, f"SLURM_CONF={conf} does not exist"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        return None, f"SLURM_CONF={conf} is not readable ({e})"
    if f"ClusterName={CLUSTER_NAME}" not in text.split():
        return None, (
            f"SLURM_CONF={conf} is not a local Slurm from {SCRIPT.relative_to(ROOT)} "
            f"(no ClusterName={CLUSTER_NAME}); the tests never submit to another cluster"
        )
    if shutil.which("sinfo") is None:
        return None, "sinfo is not installed"
    # A stopped slurmctld makes sinfo retry for ~10 s; a refused connect answers at once.
    host = re.search(r"^SlurmctldHost=[^(\s]*\(([^)\s]+)\)", text, re.M)
    port = re.search(r"^SlurmctldPort=(\d+)\s*$", text, re.M)
    addr = (host.group(1) if host else "127.0.0.1", int(port.group(1)) if port else 6817)
    try:
        socket.create_connection(addr, timeout=5).close()
    except OSError as e:
        return None, f"slurmctld does not answer on {addr[0]}:{addr[1]} ({e.strerror or e})"
    try:
        r = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"],
            capture_output=True,
            text=True,
            timeout=15,
            env={**os.environ, "SLURM_CONF": conf},
        )
    except subprocess.TimeoutExpired:
        return None, f"sinfo (SLURM_CONF={conf}) did not answer within 15 s"
    if r.returncode != 0:
        err = (r.stderr or r.stdout).strip().splitlines()
        return None, f"sinfo (SLURM_CONF={conf}) failed: {err[-1] if err else f'exit {r.returncode}'}"
    states = r.stdout.split()
    usable = {"idle", "mixed", "allocated", "completing"}
    if not states or not usable.intersection(s.rstrip("*~#!%$@^-") for s in states):
        return None, f"no usable node in sinfo (SLURM_CONF={conf}): {states or 'no nodes'}"
    return conf, None


def require_slurm() -> dict[str, str]:
    """The environment of the local Slurm, ``{"SLURM_CONF": path}``, when it answers.

    Otherwise ``pytest.fail`` when ``TIANJI_REQUIRE_SLURM=1`` (CI), else ``pytest.skip``, both
    with the reason and how to start one.
    """
    conf, reason = _why_not()
    if conf is not None:
        return {"SLURM_CONF": conf}
    if os.environ.get("TIANJI_REQUIRE_SLURM") == "1":
        pytest.fail(
            f"TIANJI_REQUIRE_SLURM=1 but no local Slurm answers: {reason}; {HOW_TO_START}",
            pytrace=False,
        )
    pytest.skip(f"no local Slurm: {reason}; {HOW_TO_START}")


def import_dask_jobqueue():
    """``import dask_jobqueue`` without its side effect of writing a commented template
    ``jobqueue.yaml`` into the user's dask config dir (~/.config/dask or $DASK_CONFIG)."""
    if "dask_jobqueue" in sys.modules:
        return sys.modules["dask_jobqueue"]
    import dask.config

    saved = dask.config.PATH
    with tempfile.TemporaryDirectory(prefix="tianji-dask-config-") as scratch:
        dask.config.PATH = scratch  # where dask.config.ensure_file puts the template
        try:
            import dask_jobqueue
        finally:
            dask.config.PATH = saved
    return dask_jobqueue


def fake_command(monkeypatch, bin_dir: Path, name: str, body: str) -> Path:
    """An executable shell script ``name`` (``body`` after the shebang) in ``bin_dir``, which goes
    first on PATH, so it answers instead of the real command for the rest of the test."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    path.chmod(0o755)
    if os.environ["PATH"].split(os.pathsep)[0] != str(bin_dir):
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return path


def six_core_plan(cfg):
    """One group on 6 cores: a learner job of 2 threads, an actors job of 4 single-core processes."""
    from tianji_dask.deploy.planner import Profile, Resources, make_plan

    prof = Profile(
        actors=(1, 2, 4),
        actor_env_steps_per_s=(1_000.0, 2_000.0, 4_000.0),
        threads=(1, 2, 4),
        batch_sizes=(64,),
        learner_samples_per_s=((16_000.0,), (64_000.0,), (64_000.0,)),
        replay_bytes_per_transition=48.0,
    )
    plan = make_plan(cfg, prof, Resources(cores=6))
    assert (plan.groups, plan.actors, plan.learner_threads) == (1, 4, 2)
    return plan


def two_core_profile():
    """A profile where one actor outruns a one-thread learner."""
    from tianji_dask.deploy.planner import Profile

    return Profile(
        actors=(1, 2),
        actor_env_steps_per_s=(20_000.0, 40_000.0),
        threads=(1,),
        batch_sizes=(64,),
        learner_samples_per_s=((50_000.0,),),
        replay_bytes_per_transition=48.0,
    )


def two_core_plan(cfg):
    """The planner's answer for a 2-core node (the local Slurm's) on :func:`two_core_profile`: a
    learner job and an actors job of one core each."""
    from tianji_dask.deploy.planner import Resources, make_plan

    return make_plan(cfg, two_core_profile(), Resources(cores=2))
