"""The deployment's checks, made before a run starts, so that bad input is refused with the fix
before any work: a scheduler address where nothing listens, a plan that cannot be read or was
made for another experiment, and a plan that needs more than the machine or cluster has. The
run's own checks (config, env, devices, replay memory) are :mod:`tianji_dask.runtime.checks`'s."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

WHAT_TO_CHECK = (
    "Check that the scheduler is started (`dask scheduler` prints the address it listens at, "
    "e.g. tcp://10.0.0.5:8786) and that --scheduler gives that host and port. "
    "Nothing was started or written."
)


class SchedulerUnreachable(ValueError):
    """Nothing answers at the scheduler address; the message names the address and what to check."""


def check_scheduler_listens(address: str, timeout: float | None = None) -> None:
    """Raise :class:`SchedulerUnreachable` when a TCP connection to ``address`` (``tcp://``,
    ``tls://`` or a bare ``host:port``) fails. A refused connection fails at once, where the
    Client would retry it until its timeout. Other transports are left to the Client.
    ``timeout`` None: ``tianji.scheduler.connect-timeout`` (:mod:`tianji_dask.config.deployment`)."""
    from tianji_dask.config.deployment import deployment_settings

    if timeout is None:
        timeout = deployment_settings().scheduler.connect_timeout
    from distributed.comm.addressing import parse_address

    scheme, location = parse_address(address)
    if scheme not in ("tcp", "tls"):
        return
    host, port = _host_port(address, location)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            if scheme == "tls":
                _tls_handshake(sock, host, address)
    except ConnectionRefusedError:
        raise SchedulerUnreachable(
            f"--scheduler {address}: nothing listens there (connection refused). {WHAT_TO_CHECK}"
        ) from None
    except TimeoutError:
        raise SchedulerUnreachable(
            f"--scheduler {address}: no answer within {timeout:g} s. {WHAT_TO_CHECK} "
            "A firewall between here and there may drop the connection."
        ) from None
    except OSError as exc:  # the host's name does not resolve, no route to it, a failed TLS handshake
        raise SchedulerUnreachable(f"--scheduler {address}: cannot connect ({exc}). {WHAT_TO_CHECK}") from None


def _host_port(address: str, location: str) -> tuple[str, int]:
    from distributed.comm.addressing import parse_host_port

    try:
        return parse_host_port(location)
    except ValueError as exc:
        raise SchedulerUnreachable(
            f"--scheduler {address}: {exc}; give HOST:PORT, e.g. tcp://127.0.0.1:8786 "
            "(`dask scheduler` prints its address)"
        ) from None


def _tls_handshake(sock: socket.socket, host: str, address: str) -> None:
    """Complete the TLS handshake the scheduler expects, with Dask's own TLS settings (a bare
    TCP connection would make it log a failed handshake)."""
    from distributed.security import Security

    context = Security().get_connection_args("client").get("ssl_context")
    if context is None:
        raise SchedulerUnreachable(
            f"--scheduler {address}: tls:// needs certificates in Dask's config (distributed.comm.tls.ca-file, "
            "distributed.comm.tls.client.cert and distributed.comm.tls.client.key); none are set. "
            "Nothing was started or written."
        )
    with context.wrap_socket(sock, server_hostname=host):
        pass


@dataclass(frozen=True)
class Capacity:
    """What a run may use: cores (or worker threads) and memory, with the words that say where."""

    cores: int
    cores_text: str  # e.g. "worker threads of the cluster at tcp://10.0.0.5:8786"
    memory_bytes: int | None  # None: not known (a worker without a memory limit)
    where: str  # e.g. "this machine", "the cluster at tcp://10.0.0.5:8786"
    single_node: bool  # memory_bytes is one node's (what tianji-dask plan --memory-per-node takes)


def this_machine() -> Capacity:
    """The cores this process may use and the machine's memory: a run's own LocalCluster gives
    every worker all of it."""
    import psutil

    return Capacity(
        cores=len(os.sched_getaffinity(0)),
        cores_text="cores this process may use on this machine (os.sched_getaffinity)",
        memory_bytes=psutil.virtual_memory().total,
        where="this machine",
        single_node=True,
    )


def cluster_capacity(client, address: str) -> Capacity:
    """The threads and memory limits of the cluster's workers, as its scheduler reports them."""
    from tianji_dask.runtime.cluster.workers import scheduler_workers

    workers = list(scheduler_workers(client).values())
    limits = [w.get("memory_limit") or 0 for w in workers]
    return Capacity(
        cores=sum(w["nthreads"] for w in workers),
        cores_text=f"worker threads of the cluster at {address}",
        memory_bytes=sum(limits) if workers and all(limits) else None,
        where=f"the cluster at {address}",
        single_node=False,
    )


def plan_fit_problems(plan, capacity: Capacity, *, plan_path, config_path) -> tuple[str | None, str | None]:
    """``(warning, refusal)`` for running ``plan`` on ``capacity``: a plan for more cores runs,
    slower than it predicts; one that needs more memory would be killed, so it is refused."""
    gib = 2**30
    warning = refusal = None
    if plan.cores_used > capacity.cores:
        warning = (
            f"the plan {plan_path} uses {plan.cores_used} cores, more than the {capacity.cores} "
            f"{capacity.cores_text}: its processes will share cores and will not "
            f"reach its predicted {plan.predicted.get('train_env_steps_per_s', 0):,.0f} env steps/s. "
            f"Make a plan for what is there: tianji-dask plan {config_path} --cores {capacity.cores}"
        )
    needed = sum(job.memory_bytes for job in plan.jobs)
    if capacity.memory_bytes is not None and needed > capacity.memory_bytes:
        per_node = f"{int(capacity.memory_bytes // gib)}GiB" if capacity.single_node else "SIZE (one node's memory)"
        refusal = (
            f"the plan {plan_path} needs {needed / gib:.2f} GiB ({len(plan.jobs)} jobs: processes and "
            f"replay), more than the {capacity.memory_bytes / gib:.2f} GiB of {capacity.where}. Make a "
            f"plan that fits: tianji-dask plan {config_path} --cores {min(plan.cores_used, capacity.cores)} "
            f"--memory-per-node {per_node}. Nothing was started or written."
        )
    return warning, refusal


def planned(cfg, plan_path) -> tuple:
    """``(cfg as the plan at plan_path sets it, the plan)``, or ``(cfg, None)`` without a plan.
    Raises PlanError for a plan that cannot be read, ConfigError for one made for another
    algorithm or env."""
    if plan_path is None:
        return cfg, None
    from tianji_dask.deploy.planner import load_plan

    plan = load_plan(plan_path)
    return plan.apply(cfg), plan


def plan_fit(plan, client, *, scheduler, plan_path, config_path) -> tuple[str | None, str | None]:
    """:func:`plan_fit_problems` on what the run will have: this machine for the run's own
    LocalCluster (``client`` None), else the workers of the cluster at ``scheduler``."""
    capacity = this_machine() if client is None else cluster_capacity(client, scheduler)
    return plan_fit_problems(plan, capacity, plan_path=plan_path, config_path=config_path)
