"""Errors that parts on several floors raise, here where every floor may import them (nothing
is imported by this module)."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, unreadable or of another format version."""


class HostLost(RuntimeError):
    """A host stopped sending heartbeats, reported an error, or lost its worker beyond what
    the restart policy admits; the message says which and why."""


class LearnerLost(RuntimeError):
    """The learner's worker was lost as the run stopped, before its final state was taken."""
