"""stable-baselines3's PPO with rl-baselines3-zoo's hyperparameters, on Pendulum-v1 or Pong timed to a
100-episode mean return, or on HalfCheetah-v5 for a budget of env steps. Runs in its own virtual
environment, apart from tianji-dask's (it imports nothing of the project): python3 -m venv
.venv-sb3; .venv-sb3/bin/pip install torch==2.13.0 stable-baselines3 (add 'gymnasium[mujoco]' for
HalfCheetah; benchmarks/pendulum_vs_sb3.py and benchmarks/mujoco_1m.py --sb3 run it there).

The hyperparameters are the entries of rl-baselines3-zoo's hyperparams/ppo.yml (marked "Tuned";
the same at DLR-RM/rl-baselines3-zoo commits 00128b5d and 208b6fdf)::

    Pendulum-v1:                          HalfCheetah-v3 (the zoo's MuJoCo entries are for -v3):
      n_envs: 4                             normalize: true
      n_timesteps: !!float 1e5              n_envs: 1
      policy: 'MlpPolicy'                   policy: 'MlpPolicy'
      n_steps: 1024                         n_timesteps: !!float 1e6
      gae_lambda: 0.95                      batch_size: 64
      gamma: 0.9                            n_steps: 512
      n_epochs: 10                          gamma: 0.98
      ent_coef: 0.0                         learning_rate: 2.0633e-05
      learning_rate: !!float 1e-3           ent_coef: 0.000401762
      clip_range: 0.2                       clip_range: 0.1
      use_sde: True                         n_epochs: 20
      sde_sample_freq: 4                    gae_lambda: 0.92
                                            max_grad_norm: 0.8
                                            vf_coef: 0.58096
                                            policy_kwargs: "dict(log_std_init=-2, ortho_init=False,
                                              activation_fn=nn.ReLU,
                                              net_arch=dict(pi=[256, 256], vf=[256, 256]))"

Pong is the zoo's ``atari`` entry (the same file, at DLR-RM/rl-baselines3-zoo 22e3ff24 of
2026-04-23), on ``PongNoFrameskip-v4`` as the zoo's Atari runs::

    atari:
      env_wrapper:
        - stable_baselines3.common.atari_wrappers.AtariWrapper
      frame_stack: 4
      policy: 'CnnPolicy'
      n_envs: 8
      n_steps: 128
      n_epochs: 4
      batch_size: 256
      n_timesteps: !!float 1e7
      learning_rate: lin_2.5e-4
      clip_range: lin_0.1
      vf_coef: 0.5
      ent_coef: 0.01

``AtariWrapper`` (no-op reset, frame skip 4 with max-pooling, episodic life, fire reset, 84x84
grayscale, reward clipping) sits over ``Monitor``, whose full-game raw returns the record counts;
an env step is one agent step (4 frames), as tianji-dask's. ``lin_`` is the zoo's linear decay to 0
over ``n_timesteps``, which ``learn`` is given (``--max-env-steps`` stops it earlier, leaving the
schedule as published); the CNN trains on the GPU where there is one.

Everything else is SB3's PPO default (Pendulum: batch_size 64, vf_coef 0.5, max_grad_norm 0.5, no
normalisation wrapper: the entry sets no ``normalize``; HalfCheetah: ``normalize: true`` is
``VecNormalize`` of observations and rewards with the entry's gamma). The budget is
``--max-env-steps`` rather than the zoo's n_timesteps, so that a Pendulum seed that needs longer
still gets a time to target.

usage: python3 ppo_sb3.py [--env Pendulum-v1|HalfCheetah-v5|PongNoFrameskip-v4] [--seed 0]
                          [--target -200] [--max-seconds 600] [--max-env-steps N] [--threads 0]
Prints a final JSON line, the record of ``time_to_target_record.py`` beside it: seconds_to_target
(from just before the envs and the model are built; imports excluded) and env steps then (null if
not reached, or with no --target), wall_s, env_steps, env_steps_per_s, return_mean_100 at the end,
the best full window's mean, and the 100-episode mean return after each episode as a curve of
(seconds, env steps, mean).
"""

import argparse
import time

import torch
import torch.nn as nn
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize
from time_to_target_record import TimeToTarget, print_record

#: env id -> (n_envs, normalize, PPO's keyword arguments)
ZOO = {
    "Pendulum-v1": (
        4,
        False,
        {
            "n_steps": 1024,
            "gae_lambda": 0.95,
            "gamma": 0.9,
            "n_epochs": 10,
            "ent_coef": 0.0,
            "learning_rate": 1e-3,
            "clip_range": 0.2,
            "use_sde": True,
            "sde_sample_freq": 4,
        },
    ),
    "HalfCheetah-v5": (
        1,
        True,
        {
            "batch_size": 64,
            "n_steps": 512,
            "gamma": 0.98,
            "learning_rate": 2.0633e-05,
            "ent_coef": 0.000401762,
            "clip_range": 0.1,
            "n_epochs": 20,
            "gae_lambda": 0.92,
            "max_grad_norm": 0.8,
            "vf_coef": 0.58096,
            "policy_kwargs": {
                "log_std_init": -2,
                "ortho_init": False,
                "activation_fn": nn.ReLU,
                "net_arch": {"pi": [256, 256], "vf": [256, 256]},
            },
        },
    ),
}


#: the zoo's atari entry: (n_envs, frame_stack, n_timesteps, PPO's keyword arguments but the schedules)
ATARI = {"PongNoFrameskip-v4": (8, 4, 10_000_000, {"n_steps": 128, "n_epochs": 4, "batch_size": 256, "vf_coef": 0.5,
                                                   "ent_coef": 0.01})}  # fmt: skip
ATARI_SCHEDULES = {"learning_rate": 2.5e-4, "clip_range": 0.1}  # lin_X: X times the progress remaining


def linear(initial: float):
    """The zoo's ``lin_<initial>``: ``initial`` decayed linearly to 0 over the run's timesteps."""
    return lambda progress_remaining: progress_remaining * initial


class StopAtTarget(BaseCallback):
    """Feeds each finished episode to ``tracker`` and stops training once the mean return of the
    last 100 episodes reaches its target, or after its ``max_seconds``."""

    def __init__(self, tracker: TimeToTarget, max_env_steps: int):
        super().__init__()
        self.tracker, self.max_env_steps = tracker, max_env_steps

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:  # Monitor's record of a finished episode
                self.tracker.episode(info["episode"]["r"], self.num_timesteps)
        t = self.tracker
        return not t.reached and not t.out_of_time() and self.num_timesteps < self.max_env_steps


def make_model(env_id: str, seed: int) -> tuple[PPO, int, dict]:
    """PPO on its envs as the zoo's entry for ``env_id`` makes them; the timesteps its schedules
    run over; the hyperparameters, for the record."""
    if env_id in ATARI:
        import ale_py
        import gymnasium as gym
        from stable_baselines3.common.atari_wrappers import AtariWrapper
        from stable_baselines3.common.vec_env import VecFrameStack

        gym.register_envs(ale_py)
        n_envs, stack, n_timesteps, hyper = ATARI[env_id]
        env = VecFrameStack(make_vec_env(env_id, n_envs=n_envs, seed=seed, wrapper_class=AtariWrapper), stack)
        schedules = {k: linear(v) for k, v in ATARI_SCHEDULES.items()}
        model = PPO("CnnPolicy", env, seed=seed, device="auto", verbose=0, **hyper, **schedules)
        said = {"n_envs": n_envs, "frame_stack": stack, "n_timesteps": n_timesteps, **hyper}
        return model, n_timesteps, said | {k: f"lin_{v:g}" for k, v in ATARI_SCHEDULES.items()}
    n_envs, normalize, hyperparameters = ZOO[env_id]
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    if normalize:
        env = VecNormalize(env, gamma=hyperparameters["gamma"])
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **hyperparameters)
    return model, 0, {"n_envs": n_envs, "normalize": normalize, **hyperparameters}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", choices=sorted([*ZOO, *ATARI]), default="Pendulum-v1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=None, help="stop at this 100-episode mean (default: none)")
    p.add_argument("--max-seconds", type=float, default=600.0)
    p.add_argument("--max-env-steps", type=int, help="default: the zoo's n_timesteps on Atari, else 1M")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tracker = TimeToTarget(time.perf_counter(), args.target, args.max_seconds)
    model, schedule_steps, hyperparameters = make_model(args.env, args.seed)
    budget = args.max_env_steps or schedule_steps or 1_000_000
    model.learn(total_timesteps=max(schedule_steps, budget), callback=StopAtTarget(tracker, budget))
    print_record(
        tracker.record(
            int(model.num_timesteps),
            torch_threads=torch.get_num_threads(),
            device=str(model.device),
            hyperparameters=hyperparameters,
        )
    )


if __name__ == "__main__":
    main()
