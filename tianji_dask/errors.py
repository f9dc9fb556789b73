"""Errors that parts on several floors raise, here where every floor may import them (nothing
is imported by this module)."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, unreadable or of another format version."""


class ChannelError(RuntimeError):
    """A channel cannot deliver: the peer is gone, the connection broke, or the channel is closed.

    The message always names the channel and the peer's address.
    """


class HostLost(RuntimeError):
    """A host stopped sending heartbeats, reported an error, or lost its worker beyond what
    the restart policy admits; the message says which and why."""


class LearnerLost(RuntimeError):
    """The learner's worker was lost as the run stopped, before its final state was taken."""
