"""Asking the Dask scheduler which workers it has."""

from __future__ import annotations


def scheduler_workers(client) -> dict[str, dict]:
    """The scheduler's workers (address -> info), asked of the scheduler itself.

    Not ``client.scheduler_info()``: it returns the client's cached identity, which the client's
    periodic refresh (``distributed.client.scheduler-info-interval``) overwrites with one that
    lists no workers, so a read that lands right after it sees a healthy cluster as empty."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]
