"""Double DQN's assembly: n-step transition actors, a replay buffer, a replay-sampling learner."""

from __future__ import annotations

from collections.abc import Callable

from tianji_dask.roles.loop import ActorLoopRole, LearnerLoopRole, LoopRole


class DQNSpec:
    name = "dqn"
    tunable_batch = True

    def actor_role(self) -> Callable[..., ActorLoopRole]:
        from tianji_dask.algos.dqn.actor import DQNActorRole

        return DQNActorRole

    def make_buffer_role(self, cfg, inbox, obs_shape, obs_dtype, seed: int, buffer_id: int = 0) -> LoopRole:
        from tianji_dask.roles.buffer import ReplayBufferRole

        return ReplayBufferRole(cfg, inbox, obs_shape, obs_dtype, seed, buffer_id)

    def learner_role(self) -> Callable[..., LearnerLoopRole]:
        from tianji_dask.algos.dqn.learner import DQNLearnerRole

        return DQNLearnerRole

    def samples_per_update(self, cfg) -> int:
        return cfg.algo.batch_size

    def replay_nbytes(self, cfg, obs_shape, obs_dtype, capacity: int | None = None) -> int:
        from tianji_dask.roles.buffer import replay_nbytes

        return replay_nbytes(cfg, obs_shape, obs_dtype, capacity)

    def steps_per_message(self, cfg) -> int:
        return cfg.channel.chunk_steps * cfg.env.num_envs

    def serial_period(self, cfg) -> int:
        return cfg.algo.train_freq

    def serial_train_round(self, cfg, learner) -> None:
        if learner.ready():
            for _ in range(cfg.algo.gradient_steps):
                learner.step()
            learner.publish()

    def steady_algo(self, algo: dict, batch_size: int | None) -> None:
        algo["exploration_steps"] = 1
        if batch_size is not None:
            algo["batch_size"] = batch_size
        algo["learning_starts"] = max(algo["batch_size"], 1)

    def profile_batch_sizes(self, cfg, requested: list[int] | None) -> list[int]:
        return sorted(set(requested or [cfg.algo.batch_size]))

    def learner_workload(self, run) -> tuple[Callable[[], int], float]:
        cfg = run.cfg
        while len(run.buffer) < cfg.algo.learning_starts:
            run.actor.step()
            run.actor.flush()
            run.buffer.ingest()

        def work() -> int:
            run.learner.update()
            return cfg.algo.batch_size

        return work, run.buffer.replay.nbytes / run.buffer.replay.capacity

    def scaled_for_batch(self, cfg, batch: int) -> dict[str, int]:
        """train_freq and buffer_size scaled with the batch: R and P = B/N_s stay the serial ones."""
        a = cfg.algo
        k = batch / a.batch_size
        return {"train_freq": max(1, round(a.train_freq * k)), "buffer_size": max(batch, round(a.buffer_size * k))}

    def plan_fields(self, cfg) -> dict[str, int | None]:
        a = cfg.algo
        return {"batch_size": a.batch_size, "buffer_size": a.buffer_size, "train_freq": a.train_freq}
