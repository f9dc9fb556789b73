"""The one contract every role's loop follows; hosts (and serial mode) drive roles only
through it and the role's own documented methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tianji_dask.roles.heartbeats import ActorCounters, Heartbeat, LearnerCounters


def never() -> bool:
    """A stop flag that is never set (an actor's ``should_stop`` outside a host)."""
    return False


class LoopRole(Protocol):
    def step(self) -> bool:
        """One unit of work; False when there was nothing to do or the role was held back."""
        ...

    def heartbeat(self) -> Heartbeat:
        """Its cumulative counters since the role was built, and the episodes finished since the
        previous heartbeat (the host sends its ``message()``)."""
        ...

    def close(self) -> None:
        """Release what the role owns (envs); channels belong to the host."""
        ...


class LearnerLoopRole(LoopRole, Protocol):
    """A learner role as its host and the parts of its loop use it (``roles.learner_base.LearnerBase``
    and its subclasses have all of it)."""

    @property
    def module(self) -> Any:
        """The network data-parallel ranks keep identical (a ``torch.nn.Module``)."""
        ...

    @property
    def counters(self) -> LearnerCounters:
        """Its cumulative counters (a subclass of LearnerCounters per algorithm)."""
        ...

    def wants_update(self) -> bool:
        """Whether the buffer holds enough for an update now."""
        ...

    def update(self) -> Any: ...

    def publish(self) -> None:
        """Send the policy parameters to the actors."""
        ...

    def prepare(self) -> None:
        """Finish the build with what updates need and actors do not (the optimiser, compiled
        kernels); called once the first parameters are published."""
        ...

    def policy_params(self) -> dict: ...

    def load_policy_params(self, params: dict) -> None: ...

    def record_gossip(self, rounds: int, distance: float) -> None: ...

    def state(self) -> dict: ...

    def restore(self, state: dict) -> None: ...

    def checkpoint_meta(self) -> dict: ...


class BufferLoopRole(LoopRole, Protocol):
    """A buffer role as serial mode drives it (``roles.buffer.BufferBase`` has it)."""

    def ingest(self, timeout: float = 0.0) -> int:
        """Take what arrived in the inbox (waiting up to ``timeout``); how many items."""
        ...


class ActorLoopRole(LoopRole, Protocol):
    """An actor role as its host, serial mode and the profile use it (``roles.actor_base.ActorBase``
    has it)."""

    num_envs: int
    obs_shape: tuple[int, ...]
    obs_dtype: Any  # a numpy dtype or scalar type
    action_space: Any  # the env's single action space (gymnasium)

    @property
    def counters(self) -> ActorCounters:
        """Its cumulative counters (a subclass of ActorCounters per algorithm)."""
        ...

    def probe_params(self) -> bool:
        """Take the newest parameters if any arrived; whether it did."""
        ...

    def flush(self) -> None:
        """Push what the actor holds that a message may carry now."""
        ...

    def wait_for_params(self, timeout: float, stop: Callable[[], bool] = ...) -> None:
        """Block until the first policy parameters arrived (``TimeoutError`` after ``timeout``)."""
        ...
