"""The ports: what the roles and algorithms see of a channel, and all they may import of it.

Four Protocols, each implemented by the remote transports (owned tcp:// sockets and tls:// comms,
``QueueSender``/``QueueInbox``/``LatestInbox``/``TopicPublisher``) and by the in-process twins of
the serial mode (``LocalQueue``/``LocalSubscription``/``LocalTopic``):

- :class:`Sender`: one actor's end of a queue (``push`` hands the payload's arrays over);
- :class:`Inbox`: a buffer's end of a queue, credit returned to the sender as items are taken;
- :class:`ParamSource`: the newest parameter version, probed without blocking;
- :class:`Publisher`: a learner's versions to its subscribers. Who subscribes is the runtime's
  business (``TopicPublisher.add_subscriber``/``remove_subscriber``), not a role's.

This module imports nothing of the transports (nor ``distributed``).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, TypedDict


class Item(NamedTuple):
    """One queue item as the consumer receives it."""

    sender: str
    seq: int
    payload: dict
    nbytes: int
    #: ``time.time()`` on the receiver when the item's message arrived (wall clock, so that
    #: sample ages can be compared with timestamps taken on other hosts).
    recv_time: float


class SenderStats(TypedDict):
    sent_items: int
    sent_bytes: int
    messages: int
    dropped: int  # items ``drop_oldest`` discarded
    blocked_s: float  # time ``push`` waited for credit
    outstanding_bytes: int  # pushed, and not yet taken by the consumer
    errors: int


class InboxStats(TypedDict):
    received_items: int
    received_bytes: int
    queued_items: int
    queued_bytes: int
    max_queued_bytes: int
    seq_gaps: int  # sequence numbers skipped: items a sender dropped
    senders: dict[str, int]  # items received, by sender id


class QueueSenderStats(SenderStats):
    window: int  # the receiver's window for this sender


class QueueInboxStats(InboxStats):
    connected: int
    capacity_bytes: int
    closed: bool


class LocalQueueStats(SenderStats, InboxStats):
    """Both ends of an in-process queue in one record."""


class PublisherStats(TypedDict):
    published: int
    sent: int
    conflated: int  # versions replaced before they were written
    errors: int
    subscribers: int


class TopicPublisherStats(PublisherStats):
    failed: list[str]  # the error of each subscriber dropped


class Sender(Protocol):
    def push(self, payload: dict) -> bool:
        """Queue one item; False when ``drop_oldest`` dropped this very item. The payload's arrays
        belong to the channel afterwards. Raises ``ChannelError`` once the channel broke."""
        ...

    def stats(self) -> SenderStats: ...

    def close(self, timeout: float = 5.0) -> None: ...


class Inbox(Protocol):
    def poll(self, max_items: int | None = None) -> list[Item]:
        """Take up to ``max_items`` queued items (all if None) without blocking."""
        ...

    def get(self, timeout: float, max_items: int | None = None) -> list[Item]:
        """Wait up to ``timeout`` seconds for at least one item, then take up to ``max_items``."""
        ...

    def stats(self) -> InboxStats: ...


class ParamSource(Protocol):
    def probe(self) -> tuple[int, dict] | None:
        """(version, payload) if a version newer than the last probed one arrived, else None."""
        ...


class Publisher(Protocol):
    def publish(self, version: int, payload: dict) -> None:
        """Make ``(version, payload)`` the newest version for every subscriber; never blocks.
        Raises ``ChannelError`` naming a subscriber that is gone."""
        ...

    def stats(self) -> PublisherStats: ...

    def close(self, timeout: float = 5.0) -> None: ...
