"""The one assembly point of an algorithm: its roles and the rules the rest of the system asks
it about. :mod:`tianji_dask.algos.registry` maps ``algo.name`` to a spec; nothing outside the
registry and the config schema tests the algorithm's name.

Adding an algorithm: a folder ``algos/<name>/`` with its learner core (``core.py``: the
:class:`~tianji_dask.roles.learner_core.LearnerCore` contract), its roles (``actor.py``, ``learner.py``,
and ``buffer.py`` unless the shared :class:`~tianji_dask.roles.buffer.ReplayBufferRole` serves)
and a ``spec.py`` implementing :class:`AlgorithmSpec`, whose ``make_*`` methods build the roles;
its config section in :mod:`tianji_dask.config.schema`, joining the ``AlgoConfig`` union; its spec in
the registry (docs/algorithms.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypedDict

from tianji_dask.roles.loop import ActorLoopRole, BufferLoopRole, LearnerLoopRole

if TYPE_CHECKING:
    import gymnasium as gym
    import numpy as np
    import numpy.typing as npt

    from tianji_dask.channels.ports import Inbox, ParamSource, Publisher, Sender
    from tianji_dask.config.schema import AlgoConfig, ExperimentConfig
    from tianji_dask.roles.learner_base import AverageGradients


class PlanFields(TypedDict):
    """The algorithm's own fields of a plan made of a config (``planner.Plan``)."""

    batch_size: int
    buffer_size: int | None  # replay algorithms only
    train_freq: int | None  # replay algorithms only


class AlgorithmSpec(Protocol):
    name: str

    @property
    def config(self) -> type[AlgoConfig]:
        """Its section of the config (``algo``), whose ``name`` is the spec's."""
        ...

    #: The planner may choose the learner's batch size (scaling what keeps the serial replay
    #: ratio); otherwise the batch is what the config's rollouts give.
    tunable_batch: bool
    #: Its buffers hold a replay that a lost learner's snapshot keeps (SnapshotKeeper.take).
    keeps_replay: bool
    #: It learns from a replay of past experience, so that its replay ratio (samples consumed per
    #: transition received) is a setting worth showing; an on-policy one learns each rollout once.
    off_policy: bool

    # --- roles: built with the channels they use ------------------------------------------------
    def make_actor(
        self,
        cfg: ExperimentConfig,
        actor_id: int,
        seed: int,
        sender: Sender,
        params: ParamSource,
        *,
        prior_env_steps: int = 0,
        balance_prior_env_steps: int = 0,
        balance: bool = True,
        n_actors: int | None = None,
        should_stop: Callable[[], bool] = ...,
    ) -> ActorLoopRole:
        """An actor pushing its messages to ``sender`` and taking parameters from ``params``
        (:class:`~tianji_dask.roles.actor_base.ActorBase` says what the options mean)."""
        ...

    def make_buffer(
        self,
        cfg: ExperimentConfig,
        inbox: Inbox,
        obs_shape: tuple[int, ...],
        obs_dtype: npt.DTypeLike,
        seed: int,
        buffer_id: int = 0,
    ) -> BufferLoopRole:
        """A buffer taking the actors' messages from ``inbox``."""
        ...

    def make_learner(
        self,
        cfg: ExperimentConfig,
        buffer: BufferLoopRole,
        publisher: Publisher | None,
        obs_dim: int,
        action_space: gym.Space,
        seed: int,
        *,
        balance: bool = True,
        learner_id: int = 0,
        average_gradients: AverageGradients | None = None,
        world_size: int = 1,
    ) -> LearnerLoopRole:
        """A learner training from its co-located ``buffer`` and publishing to ``publisher``
        (:class:`~tianji_dask.roles.learner_base.LearnerBase` says what the options mean)."""
        ...

    def evaluation_policy(
        self,
        cfg: ExperimentConfig,
        state: dict,
        action_space,
        obs_dim: int,
        *,
        epsilon: float,
        seed: int,
        sample: bool = False,
    ) -> Callable[[np.ndarray], np.ndarray]:
        """The trained policy of a learner's checkpoint ``state`` acting on ``cfg.actor.device``
        without its exploration: observations as the env gives them -> the env's actions (a
        value-based policy keeps ``epsilon`` of random actions; a policy-gradient one takes its
        most likely action, or its mean). ``sample``: a policy-gradient one's actions drawn from
        its distribution instead (a value-based policy's randomness is its ``epsilon``)."""
        ...

    # --- rules ------------------------------------------------------------------------------
    def samples_per_update(self, cfg: ExperimentConfig) -> int:
        """Samples one learner update consumes: the learner's batch."""
        ...

    def replay_nbytes(
        self, cfg: ExperimentConfig, obs_shape: tuple[int, ...], obs_dtype, capacity: int | None = None
    ) -> int:
        """Bytes of replay one buffer fills (0 without a replay); ``capacity`` replaces the config's."""
        ...

    def steps_per_message(self, cfg: ExperimentConfig) -> int:
        """Env steps an actor puts in one message to its buffer."""
        ...

    # --- the serial schedule (serial.py) -------------------------------------------------------
    def serial_period(self, cfg: ExperimentConfig) -> int:
        """Env steps between two training rounds of the serial algorithm."""
        ...

    def serial_train_round(self, cfg: ExperimentConfig, learner) -> None:
        """One training round of the serial algorithm, after the buffer has taken the data."""
        ...

    # --- profiling and planning ----------------------------------------------------------------
    def steady_algo(self, algo: dict, batch_size: int | None) -> None:
        """Edit a dumped ``algo`` section for profiling at steady state with ``batch_size``."""
        ...

    def profile_batch_sizes(self, cfg: ExperimentConfig, requested: list[int] | None) -> list[int]: ...

    def learner_workload(self, run) -> tuple[Callable[[], int], float]:
        """On a primed :class:`~tianji_dask.runtime.serial.SerialRun`: a function making one update
        (returning the samples it consumed), and the replay's bytes per transition."""
        ...

    def scaled_for_batch(self, cfg: ExperimentConfig, batch: int) -> dict[str, float]:
        """``algo`` fields changed with the batch so that the serial replay ratio stays (and the
        learning rate follows), by name."""
        ...

    def plan_fields(self, cfg: ExperimentConfig) -> PlanFields:
        """``batch_size``, ``buffer_size`` and ``train_freq`` of a plan made of this config."""
        ...

    def actors_per_group_limit(self, cfg: ExperimentConfig) -> int | None:
        """The most actors a group may have before their data grows staler than the config
        admits (None: no such limit)."""
        ...
