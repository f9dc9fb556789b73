"""Role factories: the algorithm in the config picks each role's class.

DQN: :class:`ActorRole` (n-step transitions), :class:`BufferRole` (replay memory),
:class:`LearnerRole`. PPO: :class:`PPOActorRole` (versioned rollouts),
:class:`RolloutBufferRole`, :class:`PPOLearnerRole`.
"""

from __future__ import annotations


def actor_role_class(cfg):
    if cfg.algo.name == "ppo":
        from tianji_dask.roles.ppo_actor import PPOActorRole

        return PPOActorRole
    from tianji_dask.roles.actor import ActorRole

    return ActorRole


def make_buffer_role(cfg, inbox, obs_shape, obs_dtype, seed: int, buffer_id: int = 0):
    if cfg.algo.name == "ppo":
        from tianji_dask.roles.rollout_buffer import RolloutBufferRole

        return RolloutBufferRole(cfg, inbox, buffer_id)
    from tianji_dask.roles.buffer import BufferRole

    return BufferRole(cfg, inbox, obs_shape, obs_dtype, seed, buffer_id)


def learner_role_class(cfg):
    if cfg.algo.name == "ppo":
        from tianji_dask.roles.ppo_learner import PPOLearnerRole

        return PPOLearnerRole
    from tianji_dask.roles.learner import LearnerRole

    return LearnerRole
