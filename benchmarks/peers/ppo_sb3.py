"""stable-baselines3's PPO with rl-baselines3-zoo's tuned hyperparameters, on Pendulum-v1 timed to a
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

Everything else is SB3's PPO default (Pendulum: batch_size 64, vf_coef 0.5, max_grad_norm 0.5, no
normalisation wrapper: the entry sets no ``normalize``; HalfCheetah: ``normalize: true`` is
``VecNormalize`` of observations and rewards with the entry's gamma). The budget is
``--max-env-steps`` rather than the zoo's n_timesteps, so that a Pendulum seed that needs longer
still gets a time to target.

usage: python3 ppo_sb3.py [--env Pendulum-v1] [--seed 0] [--target -200] [--max-seconds 600]
                          [--max-env-steps 1000000] [--threads 0]
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


class StopAtTarget(BaseCallback):
    """Feeds each finished episode to ``tracker`` and stops training once the mean return of the
    last 100 episodes reaches its target, or after its ``max_seconds``."""

    def __init__(self, tracker: TimeToTarget):
        super().__init__()
        self.tracker = tracker

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:  # Monitor's record of a finished episode
                self.tracker.episode(info["episode"]["r"], self.num_timesteps)
        return not self.tracker.reached and not self.tracker.out_of_time()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", choices=sorted(ZOO), default="Pendulum-v1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=None, help="stop at this 100-episode mean (default: none)")
    p.add_argument("--max-seconds", type=float, default=600.0)
    p.add_argument("--max-env-steps", type=int, default=1_000_000)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tracker = TimeToTarget(time.perf_counter(), args.target, args.max_seconds)
    n_envs, normalize, hyperparameters = ZOO[args.env]
    env = make_vec_env(args.env, n_envs=n_envs, seed=args.seed)
    if normalize:
        env = VecNormalize(env, gamma=hyperparameters["gamma"])
    model = PPO("MlpPolicy", env, seed=args.seed, device="cpu", verbose=0, **hyperparameters)
    model.learn(total_timesteps=args.max_env_steps, callback=StopAtTarget(tracker))
    print_record(
        tracker.record(
            int(model.num_timesteps),
            torch_threads=torch.get_num_threads(),
            hyperparameters={"n_envs": n_envs, "normalize": normalize, **hyperparameters},
        )
    )


if __name__ == "__main__":
    main()
