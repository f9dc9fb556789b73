"""Channels: the data plane between roles, on distributed's comm layer.

- queue (many senders -> one inbox, credit flow control in bytes): ``QueueSender`` -> ``QueueInbox``
- topic (one publisher -> many subscribers, newest version wins): ``TopicPublisher`` -> ``LatestInbox``
- ``ChannelService`` (one per worker, installed by ``ChannelPlugin``) opens the inboxes and
  answers connections on the worker's own listener, so tcp://, tls:// and security apply as-is.
- ``LocalQueue``/``LocalTopic``: in-process twins for the serial mode.

Arrays and tensors handed to ``push``/``publish`` belong to the channel afterwards: they are
serialized later, zero-copy, so the caller must not mutate them.
"""

from .common import ChannelError, Item
from .latest_inbox import LatestInbox
from .local import LocalQueue, LocalSubscription, LocalTopic
from .plugin import ChannelPlugin
from .queue_inbox import QueueInbox
from .queue_sender import QueueSender
from .service import ChannelService
from .topic import TopicPublisher

__all__ = [
    "ChannelError",
    "ChannelPlugin",
    "ChannelService",
    "Item",
    "LatestInbox",
    "LocalQueue",
    "LocalSubscription",
    "LocalTopic",
    "QueueInbox",
    "QueueSender",
    "TopicPublisher",
]
