"""Errors that parts on several floors raise, here where every floor may import them (nothing
is imported by this module)."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, unreadable or of another format version."""
