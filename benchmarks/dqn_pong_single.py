"""The one-machine alternative for DQN on Pong: a single synchronous process in the manner of
benchmarks/peers/ppo_pong_single.py. ale-py's C++ vector env steps all envs on all cores, the
Nature CNN runs on the GPU for inference and training, and the replay lives on the same device
(4-frame stacks, the next observation read from the env's next slot). It follows the serial
schedule that tianji-dask's configs/pong_dqn.yaml describes: every ``train_freq`` env steps,
``gradient_steps`` double-DQN updates of ``batch_size`` (Huber loss, Adam, gradient norm 10),
epsilon decaying linearly over ``exploration_steps`` env steps, the target network synced every
``target_update_interval`` updates, n-step returns. The env is tianji-dask's Atari env (no-op
reset, frame skip 4 with max-pool, 84x84 gray, 4-frame stack, no sticky actions, full games).
An episode's end, terminated or truncated, ends the n-step return (no bootstrap): a Pong game
ends by score long before the 108,000-frame truncation.

usage: python3 benchmarks/dqn_pong_single.py [--seed 1] [--envs 32] [--threads 16] [--target 18]
    [--max-seconds 1800] [--max-env-steps N] [--device cuda]    (--help lists the hyperparameters)
Prints a progress line every ~10 s and a final JSON line with seconds_to_target (from just before
the env, network and replay are built; imports excluded), env steps then, and throughputs.
"""

import argparse
import collections
import json
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from ale_py.vector_env import AtariVectorEnv


class QNetwork(nn.Module):
    """The Nature DQN CNN on uint8 frame stacks."""

    def __init__(self, n_actions):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 512),
            nn.ReLU(),
            nn.Linear(512, n_actions),
        )

    def forward(self, frames):
        return self.net(frames.float() / 255.0)


class Replay:
    """A ring of ``slots`` vector steps of ``envs`` transitions each, on ``device``: the
    observation, action, reward and end flag of every env at every step; the next observation
    of slot t is slot t+1's (an episode's end makes it unused)."""

    def __init__(self, slots, envs, device):
        self.slots, self.envs = slots, envs
        self.obs = torch.zeros((slots, envs, 4, 84, 84), dtype=torch.uint8, device=device)
        self.actions = torch.zeros((slots, envs), dtype=torch.long, device=device)
        self.rewards = torch.zeros((slots, envs), device=device)
        self.ends = torch.zeros((slots, envs), device=device)
        self.written = 0  # vector steps stored so far

    def add(self, obs, actions, rewards, ends):
        t = self.written % self.slots
        self.obs[t], self.actions[t], self.rewards[t], self.ends[t] = obs, actions, rewards, ends
        self.written += 1

    def sample(self, n, n_step, gamma, gen):
        """n transitions with their n-step returns: slots whose n following steps are stored."""
        oldest = max(0, self.written - self.slots)
        usable = self.written - n_step - oldest  # the newest slots' n-step windows are not complete
        t = (oldest + torch.randint(usable, (n,), device=self.obs.device, generator=gen)) % self.slots
        e = torch.randint(self.envs, (n,), device=self.obs.device, generator=gen)
        ret = torch.zeros(n, device=self.obs.device)
        alive = torch.ones(n, device=self.obs.device)
        for k in range(n_step):
            tk = (t + k) % self.slots
            ret += alive * gamma**k * self.rewards[tk, e]
            alive = alive * (1.0 - self.ends[tk, e])
        nxt = (t + n_step) % self.slots
        return self.obs[t, e], self.actions[t, e], ret, alive * gamma**n_step, self.obs[nxt, e]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--envs", type=int, default=32, help="configs/pong_dqn.yaml: 4 actors x 8 envs")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--gamma", type=float, default=0.99)
    ap.add_argument("--n-step", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--buffer-size", type=int, default=1_000_000, help="transitions")
    ap.add_argument("--learning-starts", type=int, default=80_000, help="transitions before the first update")
    ap.add_argument("--train-freq", type=int, default=4, help="env steps between training rounds")
    ap.add_argument("--gradient-steps", type=int, default=1, help="updates a training round")
    ap.add_argument("--target-update-interval", type=int, default=250, help="updates")
    ap.add_argument("--initial-eps", type=float, default=1.0)
    ap.add_argument("--final-eps", type=float, default=0.01)
    ap.add_argument("--exploration-steps", type=int, default=1_000_000, help="env steps")
    ap.add_argument("--max-grad-norm", type=float, default=10.0)
    ap.add_argument("--target", type=float, default=18.0)
    ap.add_argument("--max-seconds", type=float, default=1800.0)
    ap.add_argument("--max-env-steps", type=int, help="stop after this many env steps (a smoke run)")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    dev = torch.device(a.device)
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    t0 = time.perf_counter()
    envs = AtariVectorEnv(
        "pong",
        num_envs=a.envs,
        num_threads=a.threads,
        max_num_frames_per_episode=108_000,
        repeat_action_probability=0.0,
        autoreset_mode="SameStep",
        noop_max=30,
        episodic_life=False,
        use_fire_reset=False,
        reward_clipping=True,  # Pong's rewards are -1, 0, 1: clipped = game reward
    )
    obs, _ = envs.reset(seed=a.seed)
    n_actions = envs.single_action_space.n
    online, target = QNetwork(n_actions).to(dev), QNetwork(n_actions).to(dev)
    target.load_state_dict(online.state_dict())
    opt = torch.optim.Adam(online.parameters(), lr=a.lr)
    E = a.envs
    replay = Replay(max(a.buffer_size // E, a.n_step + 2), E, dev)
    ep_ret = np.zeros(E)
    finished = collections.deque(maxlen=100)
    env_steps, updates, owed, t_sample, t_train = 0, 0, 0.0, 0.0, 0.0
    hit, last_print, curve = None, 0.0, []
    while True:
        ts = time.perf_counter()
        eps = a.initial_eps + min(1.0, env_steps / a.exploration_steps) * (a.final_eps - a.initial_eps)
        obs_t = torch.as_tensor(obs, device=dev)
        with torch.no_grad():
            act = online(obs_t).argmax(dim=1).cpu().numpy()
        explore = rng.random(E) < eps
        act[explore] = rng.integers(0, n_actions, int(explore.sum()))
        obs, r, term, trunc, _ = envs.step(act)
        ends = term | trunc
        ep_ret += r
        for i in np.flatnonzero(ends):
            finished.append(ep_ret[i])
            ep_ret[i] = 0.0
        replay.add(
            obs_t,
            torch.as_tensor(act, device=dev),
            torch.as_tensor(r, dtype=torch.float32, device=dev),
            torch.as_tensor(ends, dtype=torch.float32, device=dev),
        )
        env_steps += E
        tt = time.perf_counter()
        t_sample += tt - ts
        if env_steps >= a.learning_starts and replay.written > a.n_step + 1:
            owed += E * a.gradient_steps / a.train_freq  # the serial schedule, per vector step
            while owed >= 1:
                owed -= 1
                o, ac, ret, disc, nxt = replay.sample(a.batch_size, a.n_step, a.gamma, gen)
                q = online(torch.cat([o, nxt]))
                q_taken = q[: len(o)].gather(1, ac[:, None]).squeeze(1)
                with torch.no_grad():
                    best = q[len(o) :].argmax(dim=1, keepdim=True)
                    y = ret + disc * target(nxt).gather(1, best).squeeze(1)
                loss = F.smooth_l1_loss(q_taken, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(online.parameters(), a.max_grad_norm)
                opt.step()
                updates += 1
                if updates % a.target_update_interval == 0:
                    target.load_state_dict(online.state_dict())
            t_train += time.perf_counter() - tt
        now = time.perf_counter() - t0
        mean = float(np.mean(finished)) if len(finished) == 100 else float("nan")
        if now - last_print >= 10:
            last_print = now
            curve.append((round(now, 1), env_steps, round(mean, 2)))
            so_far = f" ({len(finished)} episodes, mean {np.mean(finished):.1f})" if 0 < len(finished) < 100 else ""
            print(
                f"{now:7.1f}s steps {env_steps:,} ({env_steps / now:,.0f}/s) updates {updates:,} "
                f"eps {eps:.3f} return(100) {mean:.1f}{so_far} sample {t_sample:.0f}s train {t_train:.0f}s",
                flush=True,
            )
        if len(finished) == 100 and mean >= a.target:
            hit = (round(now, 1), env_steps)
            break
        if now > a.max_seconds or (a.max_env_steps is not None and env_steps >= a.max_env_steps):
            break
    now = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "system": "single-process synchronous DQN (ale-py vector env + GPU replay)",
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
