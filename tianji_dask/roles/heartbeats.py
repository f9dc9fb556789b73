"""What each role reports in its heartbeat: one dataclass of counters per role.

Roles keep their counters in these dataclasses (typed fields, not string keys) and send them
as :class:`Heartbeat` messages; an algorithm's roles may extend them with counters of their
own (``algos/dqn/actor.py``'s epsilon, ``algos/ppo/learner.py``'s KL and policy lag).
The recorder (:mod:`tianji_dask.results.host_record`) derives its tables from the fields' metadata:
which counters only grow while a host lives (a drop means the host restarted), and which rates
it computes from which counter. A new counter is declared once, here or in its role.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

ROLES = ("actor", "buffer", "learner")


def counter(default: float = 0, *, grows: bool = False, rate: str | None = None) -> Any:
    """A counter field. ``grows``: cumulative, it only grows while its host lives. ``rate``: the
    name of the per-second rate the recorder derives from it (``grows`` implied)."""
    return field(default=default, metadata={"grows": grows or rate is not None, "rate": rate})


NAN = math.nan


@dataclass
class HostCounters:
    # the host's worker process, set by the host at each heartbeat
    rss_mb: float = counter(NAN)  # resident memory
    open_fds: float = counter(NAN)  # open file descriptors (sockets included)
    threads: float = counter(NAN)


@dataclass
class ActorCounters(HostCounters):
    env_steps: int = counter(rate="env_fps")
    messages_sent: int = counter(grows=True)  # on the trajectory channel: a chunk (DQN) or a rollout (PPO)
    bytes_sent: int = counter(rate="send_bytes_per_s")
    dropped: int = counter(grows=True)  # chunks the channel dropped (full_policy "drop")
    blocked_s: float = counter(0.0, grows=True)  # waiting for channel credit
    throttled_s: float = counter(0.0, grows=True)  # held back by the balance controller
    params_received: int = counter(grows=True)
    param_version: int = counter(-1)
    sync_wait_s: float = counter(0.0, grows=True)  # synchronous ablation: waiting for new parameters
    unsent: int = counter()  # env steps made but not yet handed to the channel (a partial chunk or rollout)


@dataclass
class BufferCounters(HostCounters):
    received: int = counter(rate="receive_fps")  # transitions
    received_bytes: int = counter(grows=True)
    seq_gaps: int = counter(grows=True)
    stale_dropped: int = counter(grows=True)  # transitions dropped unused (too old, or no room)
    size: float = counter(0.0)  # transitions held
    capacity: float = counter(0.0)


@dataclass
class LearnerCounters(HostCounters):
    updates: int = counter(grows=True)
    samples: int = counter(rate="train_fps")
    param_version: int = counter(-1)
    throttled_s: float = counter(0.0, grows=True)
    train_s: float = counter(0.0, rate="train_busy")  # in updates (an iteration's, for PPO)
    publish_errors: int = counter()
    gossip_rounds: int = counter()
    group_distance: float = counter(NAN)
    loss: float = counter(NAN)  # mean since the previous heartbeat


COUNTERS: dict[str, type[HostCounters]] = {
    "actor": ActorCounters,
    "buffer": BufferCounters,
    "learner": LearnerCounters,
}


def growing_counters(role: str) -> tuple[str, ...]:
    """Counters of ``role`` that only grow while its host lives."""
    return tuple(f.name for f in dataclasses.fields(COUNTERS[role]) if f.metadata["grows"])


def rates(role: str) -> dict[str, str]:
    """Rate name -> the counter of ``role`` it is the per-second rate of."""
    return {f.metadata["rate"]: f.name for f in dataclasses.fields(COUNTERS[role]) if f.metadata["rate"]}


@dataclass
class Heartbeat:
    """One host's report. ``counters`` are cumulative since the role was built; ``episodes``
    are the (return, length, finished-at unix time) of the episodes finished since the previous
    heartbeat. On the wire (``Worker.log_event``) it travels as :meth:`message`."""

    role: str
    id: int
    counters: HostCounters
    episodes: list = field(default_factory=list)
    t: float = field(default_factory=time.time)

    def message(self) -> dict:
        return {
            "role": self.role,
            "id": self.id,
            "t": self.t,
            "counters": dataclasses.asdict(self.counters),
            "episodes": self.episodes,
        }
