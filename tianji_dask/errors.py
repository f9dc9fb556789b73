"""Errors that parts on several floors raise, here where every floor may import them (nothing
is imported by this module)."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, unreadable or of another format version."""


class ChannelError(RuntimeError):
    """A channel cannot deliver: the peer is gone, the connection broke, or the channel is closed.

    The message always names the channel and the peer's address.
    """
