"""Double DQN's assembly: n-step transition actors, a replay buffer, a replay-sampling learner."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tianji_dask.config.schema import DQNConfig
from tianji_dask.roles.loop import ActorLoopRole, BufferLoopRole, LearnerLoopRole, never

if TYPE_CHECKING:
    import gymnasium as gym
    import numpy as np

    from tianji_dask.algos.spec import PlanFields
    from tianji_dask.channels.ports import Inbox, ParamSource, Publisher, Sender
    from tianji_dask.config.schema import ExperimentConfig
    from tianji_dask.roles.learner_base import AverageGradients


class DQNSpec:
    name = "dqn"
    config = DQNConfig
    tunable_batch = True
    keeps_replay = True
    off_policy = True

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
        from tianji_dask.algos.dqn.actor import DQNActorRole

        return DQNActorRole(
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
        from tianji_dask.roles.buffer import ReplayBufferRole
        from tianji_dask.roles.prioritized import PrioritySettings

        algo = cfg.algo_as(DQNConfig)
        priorities = None
        if algo.replay == "prioritized":
            priorities = PrioritySettings(
                algo.priority_alpha, algo.priority_beta, algo.priority_beta_steps, algo.priority_eps
            )
        return ReplayBufferRole(
            inbox,
            algo.buffer_size,
            obs_shape,
            obs_dtype,
            frame_stacks=cfg.env.frame_stacks,
            seed=seed,
            buffer_id=buffer_id,
            priorities=priorities,
            device=cfg.learner.device if algo.replay_device == "learner" else None,
        )

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
        from tianji_dask.algos.dqn.learner import DQNLearnerRole

        return DQNLearnerRole(
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
        from tianji_dask.algos.dqn.core import DQNPolicy
        from tianji_dask.algos.networks import network_kind
        from tianji_dask.envs import action_count

        algo = cfg.algo_as(DQNConfig)
        policy = DQNPolicy(
            obs_dim,
            action_count(action_space),
            algo.hidden_sizes,
            seed,
            network=network_kind(cfg),
            device=cfg.actor.device,
            dueling=algo.dueling,
        )
        policy.load(0, state["online"])
        return lambda obs: policy.act(obs, epsilon)

    def samples_per_update(self, cfg: ExperimentConfig) -> int:
        return cfg.algo_as(DQNConfig).batch_size

    def replay_nbytes(self, cfg: ExperimentConfig, obs_shape, obs_dtype, capacity: int | None = None) -> int:
        from tianji_dask.roles.buffer import replay_nbytes

        algo = cfg.algo_as(DQNConfig)
        capacity = algo.buffer_size if capacity is None else capacity
        return replay_nbytes(capacity, obs_shape, obs_dtype, cfg.env.frame_stacks, algo.replay == "prioritized")

    def steps_per_message(self, cfg: ExperimentConfig) -> int:
        return cfg.channel.chunk_steps * cfg.env.num_envs

    def serial_period(self, cfg: ExperimentConfig) -> int:
        return cfg.algo_as(DQNConfig).train_freq

    def serial_train_round(self, cfg: ExperimentConfig, learner) -> None:
        if learner.ready():
            for _ in range(cfg.algo_as(DQNConfig).gradient_steps):
                learner.step()
            learner.publish()

    def steady_algo(self, algo: dict, batch_size: int | None) -> None:
        algo["exploration_steps"] = 1
        if batch_size is not None:
            algo["batch_size"] = batch_size
        algo["learning_starts"] = max(algo["batch_size"], 1)

    def profile_batch_sizes(self, cfg: ExperimentConfig, requested: list[int] | None) -> list[int]:
        return sorted(set(requested or [cfg.algo_as(DQNConfig).batch_size]))

    def learner_workload(self, run) -> tuple[Callable[[], int], float]:
        cfg = run.cfg
        while len(run.buffer) < cfg.algo_as(DQNConfig).learning_starts:
            run.actor.step()
            run.actor.flush()
            run.buffer.ingest()

        def work() -> int:
            before = run.learner.counters.samples
            run.learner.update()  # one launch: algo.updates_per_graph updates on a device replay
            return run.learner.counters.samples - before

        return work, run.buffer.replay.nbytes / run.buffer.replay.capacity

    def scaled_for_batch(self, cfg: ExperimentConfig, batch: int) -> dict[str, float]:
        """train_freq and buffer_size scaled with the batch, so that R and P = B/N_s stay the
        serial ones; the target network synced after as many samples (so as many env steps) as
        before; lr by ``algo.lr_batch_scaling`` (a batch k times larger averages k times as many
        gradients a step, taken k times less often)."""
        algo = cfg.algo_as(DQNConfig)
        k = batch / algo.batch_size
        lr_factor = {"sqrt": k**0.5, "linear": k, "none": 1.0}[algo.lr_batch_scaling]
        return {
            "train_freq": max(1, round(algo.train_freq * k)),
            "buffer_size": max(batch, round(algo.buffer_size * k)),
            "target_update_interval": max(1, round(algo.target_update_interval / k)),
            "lr": float(f"{algo.lr * lr_factor:.6g}"),
        }

    def plan_fields(self, cfg: ExperimentConfig) -> PlanFields:
        algo = cfg.algo_as(DQNConfig)
        return {"batch_size": algo.batch_size, "buffer_size": algo.buffer_size, "train_freq": algo.train_freq}

    def actors_per_group_limit(self, cfg: ExperimentConfig) -> int | None:
        return None  # replay: the balance controller holds the replay ratio, whatever the actors
