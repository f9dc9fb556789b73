"""Dask on several "nodes" of one machine: the network namespaces of ``jobqueue/netns-nodes.sh``,
a scheduler in the root namespace on their bridge, and workers started inside the nodes (each
listening on its node's address only), so that every byte between two workers crosses the veth
links. Used by ``tests/test_netns.py`` and ``benchmarks/link_throughput.py``; root only.

    nodes = Nodes.up(3, workdir, rate="1gbit")      # jobqueue/netns-nodes.sh up 3 --rate 1gbit
    address = nodes.start_scheduler()
    nodes.start_worker(1, "node1", {"tianji_learner": 1, "tianji_group_0": 1})
    ...
    nodes.stop()                                    # the scheduler, the workers, the namespaces
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "jobqueue" / "netns-nodes.sh"
PREFIX = os.environ.get("TIANJI_NETNS_PREFIX", "tjt")
SUBNET = os.environ.get("TIANJI_NETNS_SUBNET", "10.78.0")


class NetnsError(RuntimeError):
    """The namespaces could not be made; the message has the script's reason."""


def _env() -> dict[str, str]:
    return {**os.environ, "TIANJI_NETNS_PREFIX": PREFIX, "TIANJI_NETNS_SUBNET": SUBNET}


def _netns(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=_env(), check=check)


def address(k: int) -> str:
    return f"{SUBNET}.1" if k == 0 else f"{SUBNET}.{10 + k}"


def link_bytes(k: int) -> tuple[int, int]:
    """(bytes node k sent, bytes node k received), from the root end of its veth pair."""
    stats = Path(f"/sys/class/net/{PREFIX}-{k}-h/statistics")
    return int((stats / "rx_bytes").read_text()), int((stats / "tx_bytes").read_text())


@dataclass
class Nodes:
    count: int
    scheduler_file: Path
    scheduler: subprocess.Popen | None = None
    workers: list[subprocess.Popen] = field(default_factory=list)
    #: where the scheduler and the workers import from (the repository; add what a job's tasks import)
    pythonpath: list[str] = field(default_factory=lambda: [str(ROOT)])

    def _env(self) -> dict[str, str]:
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        return {**os.environ, "PYTHONPATH": os.pathsep.join([*self.pythonpath, *inherited])}

    @property
    def scheduler_address(self) -> str:
        return json.loads(self.scheduler_file.read_text())["address"]

    def start_scheduler(self, timeout: float = 60) -> str:
        log = open(self.scheduler_log, "wb")  # noqa: SIM115 - handed to the child, closed below
        self.scheduler = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", address(0), "--port", "0",
             "--no-dashboard", "--scheduler-file", str(self.scheduler_file)],
            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, env=self._env(),
        )  # fmt: skip
        log.close()  # the child has its own descriptor
        deadline = time.monotonic() + timeout
        while not self.scheduler_file.exists():
            if time.monotonic() > deadline or self.scheduler.poll() is not None:
                said = self.scheduler_log.read_text(errors="replace").strip().splitlines()[-15:]
                raise RuntimeError(
                    f"the scheduler on the bridge did not start (exit {self.scheduler.poll()}); "
                    f"{self.scheduler_log} ends:\n" + "\n".join(said)
                )
            time.sleep(0.2)
        return self.scheduler_address

    @property
    def scheduler_log(self) -> Path:
        return self.scheduler_file.with_name("scheduler.log")

    def start_worker(self, k: int, name: str, resources: dict[str, int]) -> None:
        """A Dask worker (with its nanny) in node k, listening on node k's address only."""
        tags = ",".join(f"{r}={v}" for r, v in resources.items())
        self.workers.append(
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    f"{PREFIX}-{k}",
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    "--scheduler-file",
                    str(self.scheduler_file),
                    "--host",
                    address(k),
                    "--nthreads",
                    "1",
                    "--name",
                    name,
                    "--resources",
                    tags,
                    "--no-dashboard",
                    "--memory-limit",
                    "0",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=self._env(),
            )  # fmt: skip
        )

    def wait_for_workers(self, n: int, timeout: float = 90) -> dict[str, dict]:
        from distributed import Client

        with Client(self.scheduler_address, timeout=30) as client:
            client.wait_for_workers(n, timeout=timeout)
            return client.scheduler_info(n_workers=-1)["workers"]

    @classmethod
    def up(cls, count: int, workdir: Path, rate: str | None = None) -> Nodes:
        """Make nodes 1..count (after removing any left from an earlier use)."""
        _netns("down", check=False)
        r = _netns("up", str(count), *(["--rate", rate] if rate else []), check=False)
        if r.returncode != 0:
            raise NetnsError(f"jobqueue/netns-nodes.sh up {count} failed: {r.stderr.strip()}")
        return cls(count, Path(workdir) / "scheduler.json")

    def stop(self) -> None:
        if self.scheduler is not None and self.scheduler.poll() is None:
            self.scheduler.kill()
            self.scheduler.wait(10)
        _netns("down", check=False)  # kills every process left in the nodes
        for w in self.workers:
            try:
                w.wait(10)
            except subprocess.TimeoutExpired:
                w.kill()
