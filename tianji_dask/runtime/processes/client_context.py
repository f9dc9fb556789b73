"""The run's client as the current one of a block of code, without touching Dask's settings.

A Dask actor handle binds, as it arrives, to the current client (``Client.current()``): outside
``Client.as_current()`` that is the process's newest default Client, which may be another one the
user made (a notebook's, or one that failed to connect). ``as_current()`` also sets Dask's
``scheduler`` setting, which is process-wide: a user's Client made and closed in another thread
meanwhile puts back, or leaves behind, the wrong value ("dask.distributed" with no client, and
"no Client active" at the user's next ``compute``). :func:`current_client` sets only the context
variable that ``Client.current()`` reads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from distributed import Client
from distributed.client import _current_client


@contextlib.contextmanager
def current_client(client: Client) -> Iterator[None]:
    """``client`` is ``Client.current()`` in this thread (or task) for the block."""
    token = _current_client.set(client)
    try:
        yield
    finally:
        _current_client.reset(token)
