"""Channels: the data plane between roles, on distributed's comm layer.

- queue (many senders -> one inbox, credit flow control in bytes): ``QueueSender`` -> ``QueueInbox``
- topic (one publisher -> many subscribers, newest version wins): ``TopicPublisher`` -> ``LatestInbox``
- ``ChannelService`` (one per worker, installed by ``ChannelPlugin``) opens the inboxes and
  answers connections on the worker's own listener, so tcp://, tls:// and security apply as-is.
- ``LocalQueue``/``LocalTopic``: in-process twins for the serial mode.

Roles and algorithms see them only through the Protocols of :mod:`.ports`. The names below load
on first use, so that importing ``tianji_dask.channels.ports`` loads no transport (nor
``distributed``).

Arrays and tensors handed to ``push``/``publish`` belong to the channel afterwards: they are
serialized later, zero-copy, so the caller must not mutate them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .latest_inbox import LatestInbox
    from .local import LocalQueue, LocalSubscription, LocalTopic
    from .plugin import ChannelPlugin
    from .queue_inbox import QueueInbox
    from .queue_sender import QueueSender
    from .service import ChannelService
    from .topic import TopicPublisher

_WHERE = {
    "LatestInbox": ".latest_inbox",
    "LocalQueue": ".local",
    "LocalSubscription": ".local",
    "LocalTopic": ".local",
    "ChannelPlugin": ".plugin",
    "QueueInbox": ".queue_inbox",
    "QueueSender": ".queue_sender",
    "ChannelService": ".service",
    "TopicPublisher": ".topic",
}
__all__ = [
    "ChannelPlugin",
    "ChannelService",
    "LatestInbox",
    "LocalQueue",
    "LocalSubscription",
    "LocalTopic",
    "QueueInbox",
    "QueueSender",
    "TopicPublisher",
]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
