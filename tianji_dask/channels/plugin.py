"""Worker plugin that installs the channel service on every worker, present and future.

Call protocol (driver)::

    client.register_plugin(ChannelPlugin())
"""

from __future__ import annotations

from distributed import WorkerPlugin

from .service import ChannelService


class ChannelPlugin(WorkerPlugin):
    """Installs ``ChannelService`` (and its ``tianji_channel`` handler) on each worker.

    ``idempotent``: registering it again (a second driver, a re-run notebook cell) is a no-op
    instead of a teardown that would close every open channel."""

    name = "tianji-channels"
    idempotent = True

    def setup(self, worker) -> None:
        ChannelService.for_worker(worker)

    def teardown(self, worker) -> None:
        service = ChannelService.installed(worker)
        if service is not None:
            service.close_all()
