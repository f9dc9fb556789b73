"""PPO's assembly: versioned-rollout actors, a rollout buffer with a policy-lag bound, a learner
running minibatch epochs on whole rollouts."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tianji_dask.config.schema import PPOConfig
from tianji_dask.roles.loop import ActorLoopRole, BufferLoopRole, LearnerLoopRole, never

if TYPE_CHECKING:
    import gymnasium as gym
    import numpy as np

    from tianji_dask.algos.spec import PlanFields
    from tianji_dask.channels.ports import Inbox, ParamSource, Publisher, Sender
    from tianji_dask.config.schema import ExperimentConfig
    from tianji_dask.roles.learner_base import AverageGradients


class PPOSpec:
    name = "ppo"
    config = PPOConfig
    tunable_batch = False
    keeps_replay = False
    off_policy = False

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
        should_stop: Callable[[], bool] = never,
    ) -> ActorLoopRole:
        """On an asynchronous vector env where ``env.async_batch`` is set
        (:mod:`tianji_dask.algos.ppo.async_actor`), else stepping all its envs together."""
        from tianji_dask.algos.ppo.actor import PPOActorRole
        from tianji_dask.algos.ppo.async_actor import PPOAsyncActorRole

        role = PPOAsyncActorRole if cfg.env.async_batch else PPOActorRole
        return role(
            cfg,
            actor_id,
            seed,
            sender,
            params,
            prior_env_steps=prior_env_steps,
            balance_prior_env_steps=balance_prior_env_steps,
            balance=balance,
            n_actors=n_actors,
            should_stop=should_stop,
        )

    def make_buffer(
        self, cfg: ExperimentConfig, inbox: Inbox, obs_shape, obs_dtype, seed: int, buffer_id: int = 0
    ) -> BufferLoopRole:
        from tianji_dask.algos.ppo.buffer import RolloutBufferRole

        return RolloutBufferRole(cfg, inbox, buffer_id)

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
        from tianji_dask.algos.ppo.learner import PPOLearnerRole

        return PPOLearnerRole(
            cfg,
            buffer,
            publisher,
            obs_dim,
            action_space,
            seed,
            balance=balance,
            learner_id=learner_id,
            average_gradients=average_gradients,
            world_size=world_size,
        )

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
        from tianji_dask.algos.ppo.core import acting_policy

        policy = acting_policy(cfg, action_space, obs_dim, seed)
        policy.load(0, state["net"])
        return policy.sample if sample else policy.most_likely

    def samples_per_update(self, cfg: ExperimentConfig) -> int:
        """The one PPO batch rule: every rollout of an iteration, each ``rollout_steps`` x ``num_envs``."""
        algo = cfg.algo_as(PPOConfig)
        return algo.rollouts_per_update * algo.rollout_steps * cfg.env.num_envs

    def replay_nbytes(self, cfg: ExperimentConfig, obs_shape, obs_dtype, capacity: int | None = None) -> int:
        return 0  # rollouts are consumed, not replayed

    def steps_per_message(self, cfg: ExperimentConfig) -> int:
        return cfg.algo_as(PPOConfig).rollout_steps * cfg.env.num_envs

    def serial_period(self, cfg: ExperimentConfig) -> int:
        return cfg.algo_as(PPOConfig).rollout_steps * cfg.env.num_envs

    def serial_train_round(self, cfg: ExperimentConfig, learner) -> None:
        while learner.step():
            pass

    def steady_algo(self, algo: dict, batch_size: int | None) -> None:
        pass  # no exploration schedule or warm-up; the batch is the rollouts'

    def profile_batch_sizes(self, cfg: ExperimentConfig, requested: list[int] | None) -> list[int]:
        return [self.samples_per_update(cfg)]

    def learner_workload(self, run) -> tuple[Callable[[], int], float]:
        # until the buffer holds a full iteration's rollouts
        while not (rollouts := run.buffer.take(run.learner.version)):
            run.actor.step()
            run.buffer.ingest()

        def work() -> int:
            batch = run.learner.batch_from(rollouts)
            run.learner.learner_core.train(batch)
            return len(batch["actions"])

        return work, 0.0

    def scaled_for_batch(self, cfg: ExperimentConfig, batch: int) -> dict[str, float]:
        return {}

    def plan_fields(self, cfg: ExperimentConfig) -> PlanFields:
        return {"batch_size": self.samples_per_update(cfg), "buffer_size": None, "train_freq": None}

    def actors_per_group_limit(self, cfg: ExperimentConfig) -> int | None:
        # At balance, A actors each finish a rollout every A / rollouts_per_update learner
        # iterations, so a rollout reaches the learner about that many versions after the
        # parameters it acted with; beyond max_policy_lag it is dropped.
        algo = cfg.algo_as(PPOConfig)
        return algo.max_policy_lag * algo.rollouts_per_update
