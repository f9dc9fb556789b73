"""The one-machine alternative for PPO on Pong: a single synchronous process, ale-py's C++ vector env
stepping all envs on all cores, the Nature CNN on the GPU for both inference and training (the recipe
of CleanRL's envpool PPO, written here from scratch). Hyperparameters match tianji-dask's
configs/pong_ppo.yaml: 64 envs x 128 steps = 8,192 transitions per update, 4 epochs x 32 minibatches,
clip 0.1, lr 2.5e-4 annealed over 10 M env steps, entropy 0.01, value 0.5, GAE 0.95, grad norm 0.5.

usage: python3 ppo_pong_single.py [--seed 1] [--envs 64] [--threads 16] [--target 18] [--max-seconds 540]
Prints a progress line every ~10 s and a final JSON line with seconds_to_target (from just before the
env and network are built; imports excluded), env steps then, and throughputs.
"""

import argparse
import collections
import json
import time

import numpy as np
import torch
import torch.nn as nn
from ale_py.vector_env import AtariVectorEnv
from torch.distributions import Categorical


def orthogonal(layer, gain=2**0.5):
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    def __init__(self, n_actions):
        super().__init__()
        self.trunk = nn.Sequential(
            orthogonal(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            orthogonal(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            orthogonal(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            orthogonal(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.policy = orthogonal(nn.Linear(512, n_actions), 0.01)
        self.value = orthogonal(nn.Linear(512, 1), 1.0)

    def forward(self, frames):
        h = self.trunk(frames.float() / 255.0)
        return self.policy(h), self.value(h).squeeze(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--envs", type=int, default=64)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--minibatches", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2.5e-4)
    ap.add_argument("--anneal-steps", type=float, default=1e7, help="env steps over which lr falls to 0 (0: constant)")
    ap.add_argument("--target", type=float, default=18.0)
    ap.add_argument("--max-seconds", type=float, default=540.0)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    gamma, lam, clip, ent_coef, vf_coef, max_norm = 0.99, 0.95, 0.1, 0.01, 0.5, 0.5

    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    dev = torch.device(a.device)
    t0 = time.perf_counter()
    envs = AtariVectorEnv(
        "pong",
        num_envs=a.envs,
        num_threads=a.threads,
        autoreset_mode="SameStep",
        episodic_life=False,
        reward_clipping=True,
    )  # Pong: clipped reward = game reward
    obs, _ = envs.reset(seed=a.seed)
    net = ActorCritic(envs.single_action_space.n).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=a.lr, eps=1e-5)
    S, E = a.steps, a.envs
    b_obs = torch.zeros((S, E, 4, 84, 84), dtype=torch.uint8, device=dev)
    b_act = torch.zeros((S, E), dtype=torch.long, device=dev)
    b_logp, b_rew, b_done, b_val = (torch.zeros((S, E), device=dev) for _ in range(4))
    next_obs = torch.as_tensor(obs, device=dev)
    ep_ret = np.zeros(E)
    finished = collections.deque(maxlen=100)
    env_steps, updates, t_sample, t_train = 0, 0, 0.0, 0.0
    hit, last_print, curve = None, 0.0, []
    while True:
        for g in opt.param_groups:
            g["lr"] = a.lr * max(0.0, 1.0 - env_steps / a.anneal_steps) if a.anneal_steps else a.lr
        ts = time.perf_counter()
        for t in range(S):
            b_obs[t] = next_obs
            with torch.no_grad():
                logits, v = net(next_obs)
                dist = Categorical(logits=logits)
                act = dist.sample()
            b_act[t], b_logp[t], b_val[t] = act, dist.log_prob(act), v
            o, r, term, trunc, _ = envs.step(act.cpu().numpy())
            done = term | trunc
            ep_ret += r
            for i in np.flatnonzero(done):
                finished.append(ep_ret[i])
                ep_ret[i] = 0.0
            b_rew[t] = torch.as_tensor(r, dtype=torch.float32, device=dev)
            b_done[t] = torch.as_tensor(done, dtype=torch.float32, device=dev)
            next_obs = torch.as_tensor(o, device=dev)
            env_steps += E
        tt = time.perf_counter()
        t_sample += tt - ts
        with torch.no_grad():
            _, last_v = net(next_obs)
            adv = torch.zeros_like(b_rew)
            run = torch.zeros(E, device=dev)
            for t in reversed(range(S)):
                nv = last_v if t == S - 1 else b_val[t + 1]
                nonterminal = 1.0 - b_done[t]
                delta = b_rew[t] + gamma * nv * nonterminal - b_val[t]
                run = delta + gamma * lam * nonterminal * run
                adv[t] = run
            ret = adv + b_val
        f_obs, f_act, f_logp = b_obs.flatten(0, 1), b_act.flatten(), b_logp.flatten()
        f_adv, f_ret = adv.flatten(), ret.flatten()
        n = S * E
        mb = n // a.minibatches
        for _ in range(a.epochs):
            perm = torch.randperm(n, device=dev)
            for k in range(0, n, mb):
                idx = perm[k : k + mb]
                logits, v = net(f_obs[idx])
                dist = Categorical(logits=logits)
                logp = dist.log_prob(f_act[idx])
                ratio = (logp - f_logp[idx]).exp()
                adv_mb = f_adv[idx]
                adv_mb = (adv_mb - adv_mb.mean()) / (adv_mb.std() + 1e-8)
                pg = torch.max(-adv_mb * ratio, -adv_mb * ratio.clamp(1 - clip, 1 + clip)).mean()
                v_loss = 0.5 * ((v - f_ret[idx]) ** 2).mean()
                loss = pg - ent_coef * dist.entropy().mean() + vf_coef * v_loss
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(net.parameters(), max_norm)
                opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        updates += 1
        t_train += time.perf_counter() - tt
        now = time.perf_counter() - t0
        mean = float(np.mean(finished)) if len(finished) == 100 else float("nan")
        if now - last_print >= 10 or updates == 1:
            last_print = now
            curve.append((round(now, 1), env_steps, round(mean, 2)))
            print(
                f"{now:7.1f}s steps {env_steps:,} ({env_steps / now:,.0f}/s) return(100) {mean:.1f} "
                f"sample {t_sample:.0f}s train {t_train:.0f}s",
                flush=True,
            )
        if len(finished) == 100 and mean >= a.target:
            hit = (round(now, 1), env_steps)
            break
        if now > a.max_seconds:
            break
    now = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "system": "single-process synchronous PPO (ale-py vector env + GPU)",
                "seed": a.seed,
                "envs": E,
                "threads": a.threads,
                "target": a.target,
                "seconds_to_target": hit[0] if hit else None,
                "env_steps_to_target": hit[1] if hit else None,
                "env_steps": env_steps,
                "wall_s": round(now, 1),
                "env_steps_per_s": round(env_steps / now),
                "sample_s": round(t_sample, 1),
                "train_s": round(t_train, 1),
                "updates": updates,
                "best_mean": max((c[2] for c in curve if c[2] == c[2]), default=None),
                "curve": curve,
            }
        )
    )


if __name__ == "__main__":
    main()
