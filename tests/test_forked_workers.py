"""The run's LocalCluster forks its workers from a fork server that imported torch, gymnasium and
the roles (``tianji_dask.runtime.processes.fork_server``), so no worker pays seconds of importing them. (A
server that Dask started again with its own preload list, after the first had died, failed this.)"""

from __future__ import annotations

import sys

import pytest

from tianji_dask.runtime.processes.fork_server import PRELOAD


def _imported(names: list[str]) -> dict[str, bool]:
    return {name: name in sys.modules for name in names}


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_forked_worker_has_torch_and_the_roles_before_any_host_is_built():
    from distributed import Client

    from tianji_dask.runtime.cluster.cluster import local_cluster

    wanted = [*PRELOAD, "torch", "gymnasium"]
    with local_cluster(2, dashboard=False) as cluster, Client(cluster) as client:
        found = client.run(_imported, wanted)
    assert len(found) == 2
    assert all(all(imported.values()) for imported in found.values()), found
