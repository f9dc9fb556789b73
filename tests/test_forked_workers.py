"""The run's LocalCluster forks its workers from a fork server that imported what a role's build
imports (``tianji_dask.forked_workers``), so no host pays seconds of imports as it is built."""

from __future__ import annotations

import sys

import pytest

from tianji_dask.forked_workers import PRELOAD


def _imported(names: list[str]) -> dict[str, bool]:
    return {name: name in sys.modules for name in names}


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_forked_worker_has_what_the_learners_optimizer_imports_before_any_host_is_built():
    from distributed import Client

    from tianji_dask.cluster import local_cluster

    # torch.optim imports torch._dynamo as the first optimizer is made (seconds on a small machine)
    wanted = [*PRELOAD, "torch", "gymnasium", "torch._dynamo"]
    with local_cluster(2, dashboard=False) as cluster, Client(cluster) as client:
        found = client.run(_imported, wanted)
    assert len(found) == 2
    assert all(all(imported.values()) for imported in found.values()), found
