"""PPO: actor-critic network, acting, GAE and the clipped-surrogate update.

As in cleanrl's ``ppo.py``: separate tanh MLPs for policy and value with orthogonal
init, GAE(lambda), advantage normalisation per minibatch, clipped surrogate, value
loss, entropy bonus, global gradient clipping, minibatch epochs. Actors keep a copy
of the whole network (they need values for GAE); the learner owns Adam. Atari runs use the
shared Nature CNN of cleanrl's ``ppo_atari.py`` instead of the MLPs
(:mod:`tianji_dask.algos.networks`). The env's action space chooses the policy
(:func:`network_for`, :func:`acting_policy`): categorical over a ``Discrete`` space, the diagonal
Gaussian of :mod:`tianji_dask.algos.ppo.gaussian` over a ``Box``; the loss and the update are the
same for both.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical

from tianji_dask.algos.executor import BatchMover, Executor, GraphedStep, Inputs
from tianji_dask.algos.networks import AtariActorCritic, network_kind, set_trunk_precision
from tianji_dask.algos.ppo.gaussian import GaussianActorCritic, GaussianPolicy
from tianji_dask.algos.ppo.mlp import tanh_mlp
from tianji_dask.algos.ppo.normalization import Moments, RunningMoments
from tianji_dask.config.schema import PPOConfig
from tianji_dask.envs import action_count
from tianji_dask.roles.learner_core import (
    State,
    component,
    generator_state,
    host_arrays,
    load_optimizer_state,
    optimizer_state,
    restore_generator,
)

if TYPE_CHECKING:
    from tianji_dask.config.schema import ExperimentConfig


class ActorCritic(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden: list[int]):
        super().__init__()
        self.actor = tanh_mlp(obs_dim, n_actions, hidden, 0.01)
        self.critic = tanh_mlp(obs_dim, 1, hidden, 1.0)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, value) of a batch."""
        return self.actor(obs), self.value(obs)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor):
        """(log-prob of ``actions``, entropy, value) under the current parameters."""
        dist = Categorical(logits=self.actor(obs), validate_args=False)  # validating waits for a GPU
        return dist.log_prob(actions), dist.entropy(), self.value(obs)


# value(obs), heads(obs), evaluate(obs, actions)
ActorCriticNet = ActorCritic | AtariActorCritic | GaussianActorCritic


def actor_critic(
    obs_dim: int,
    n_actions: int,
    hidden: list[int],
    network: str = "mlp",
    *,
    sde: bool = False,
    log_std_init: float = 0.0,
) -> ActorCriticNet:
    """Separate tanh MLPs over flat observations, the shared Nature CNN over uint8 frame
    stacks (``network="nature_cnn"``, which ignores ``obs_dim`` and ``hidden``), or the diagonal
    Gaussian policy of a ``Box`` action space (``network="gaussian_mlp"``, ``n_actions`` its
    dimensions; ``sde`` and ``log_std_init`` are its)."""
    if network == "nature_cnn":
        return AtariActorCritic(n_actions)
    if network == "gaussian_mlp":
        return GaussianActorCritic(obs_dim, n_actions, hidden, sde=sde, log_std_init=log_std_init)
    if network != "mlp":
        raise ValueError(f"unknown network {network!r}; expected 'mlp', 'nature_cnn' or 'gaussian_mlp'")
    return ActorCritic(obs_dim, n_actions, hidden)


def network_for(cfg: ExperimentConfig, action_space: gym.Space) -> tuple[str, int]:
    """(network, its action outputs) for the env's action space: the diagonal Gaussian MLP, one
    mean per dimension, for a ``Box``; else the config's network (:func:`network_kind`), one
    logit per action of the ``Discrete`` space."""
    if isinstance(action_space, gym.spaces.Box):
        return "gaussian_mlp", int(np.prod(action_space.shape))
    return network_kind(cfg), action_count(action_space)


def sample_categorical(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One action per row of ``logits`` by inverting the CDF at ``uniforms`` (one per row, in
    [0, 1)): exact categorical sampling whose randomness is only ``uniforms``, so the same
    uniforms give the same actions on any device."""
    cdf = torch.softmax(logits, dim=-1).cumsum(dim=-1)
    actions = torch.searchsorted(cdf, uniforms.to(cdf.device, cdf.dtype).unsqueeze(-1)).squeeze(-1)
    return actions.clamp_(max=logits.shape[-1] - 1)  # a CDF that rounds to just below 1


class PPOPolicy:
    """Inference in an actor: ``act(obs)`` -> (actions, log-probs, values) as numpy.

    The network runs on ``device``; the random draws come from a CPU generator whatever the
    device (:func:`sample_categorical`), so a seed gives the same actions on CPU and GPU. On a
    GPU, ``act`` replays one CUDA graph (:class:`GraphedStep`): a batch of Atari frames costs a
    few dozen kernel launches and three device-to-host reads when run eagerly, which took longer
    than the GPU's arithmetic; the graph launches once and returns its three results in one read.
    Loading parameters copies them into the tensors the graph reads, so it stays valid."""

    def __init__(
        self, obs_dim: int, n_actions: int, hidden: list[int], seed: int, network: str = "mlp", device: str = "cpu"
    ):
        self.device = torch.device(device)
        self.net = actor_critic(obs_dim, n_actions, hidden, network).to(self.device)
        self.net.requires_grad_(False)
        self.generator = torch.Generator().manual_seed(seed)
        self.version = -1
        self._graphed = (
            GraphedStep(self._infer, lambda: None, device=self.device) if self.device.type == "cuda" else None
        )
        self._pinned: dict[tuple[int, ...], torch.Tensor] = {}  # act_async's host buffers, by shape

    def load(self, version: int, params: dict) -> None:
        self.net.load_state_dict({k: torch.as_tensor(v) for k, v in params.items()})
        self.version = version

    def _infer(self, inputs: Inputs) -> torch.Tensor:
        """(actions, log-probs, values) of ``inputs["obs"]`` as the rows of one float tensor
        (action indices are exact in float32)."""
        with torch.no_grad():
            logits, values = self.net.heads(inputs["obs"])
            actions = sample_categorical(logits, inputs["uniforms"])
            logp = torch.log_softmax(logits, dim=-1).gather(1, actions.unsqueeze(1)).squeeze(1)
            return torch.stack((actions.to(logp.dtype), logp, values))

    def exploration_step(self, t: int) -> None:
        """The categorical policy draws afresh at every step."""

    def act(self, obs: np.ndarray, envs: slice | np.ndarray = slice(None)):
        inputs = {
            "obs": torch.from_numpy(obs).to(self.device),
            "uniforms": torch.rand(len(obs), generator=self.generator).to(self.device),
        }
        out = (self._graphed(inputs) if self._graphed is not None else self._infer(inputs)).cpu().numpy()
        return out[0].astype(np.int64), out[1], out[2]

    def most_likely(self, obs: np.ndarray) -> np.ndarray:
        """The most likely action of each observation (evaluation: no sampling)."""
        with torch.inference_mode():
            logits, _ = self.net.heads(torch.from_numpy(obs).to(self.device))
            return logits.argmax(dim=-1).cpu().numpy()

    def sample(self, obs: np.ndarray) -> np.ndarray:
        """Actions drawn from the policy for each observation (a trained policy used with its randomness)."""
        return self.act(obs)[0]

    def act_async(self, obs: np.ndarray, envs: slice | np.ndarray = slice(None)):
        """:meth:`act` in two halves: the inference is launched now, and the returned call gives
        its results. On a GPU the host is free in between (the copy back is queued behind the
        graph, into pinned memory); on the CPU it is :meth:`act`."""
        if self._graphed is None:
            chosen = self.act(obs, envs)
            return lambda: chosen
        inputs = {
            "obs": torch.from_numpy(obs).to(self.device),
            "uniforms": torch.rand(len(obs), generator=self.generator).to(self.device),
        }
        out = self._graphed(inputs)
        host = self._pinned.get(tuple(out.shape))
        if host is None:
            host = self._pinned[tuple(out.shape)] = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        host.copy_(out, non_blocking=True)
        done = torch.cuda.Event()
        done.record()

        def result() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            done.synchronize()
            rows = host.numpy()
            return rows[0].astype(np.int64), rows[1].copy(), rows[2].copy()

        return result

    def value(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.net.value(torch.from_numpy(obs).to(self.device)).cpu().numpy()

    # A categorical policy sends the env its actions as they are and trains on observations and
    # rewards as the env (or Atari's training signals) gives them. Nothing a step's bookkeeping
    # does changes what it chooses next: the actor may choose before it (PPOActorRole).
    chooses_ahead = True
    action_shape: tuple[int, ...] = ()
    action_dtype = np.int64

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        return actions

    def normalize(self, raw_obs: np.ndarray) -> np.ndarray:
        return raw_obs

    def observe(self, raw_obs: np.ndarray) -> np.ndarray:
        return raw_obs

    def training_rewards(self, rewards: np.ndarray, terminated: np.ndarray) -> np.ndarray:
        return rewards

    def rollout_statistics(self) -> dict[str, np.ndarray]:
        return {}


ActingPolicy = PPOPolicy | GaussianPolicy


def acting_policy(cfg: ExperimentConfig, action_space: gym.Space, obs_dim: int, seed: int) -> ActingPolicy:
    """The policy an actor acts with, chosen by the env's action space (:func:`network_for`)."""
    algo = cfg.algo_as(PPOConfig)
    if isinstance(action_space, gym.spaces.Box):
        return GaussianPolicy(
            obs_dim,
            action_space.low,
            action_space.high,
            algo.hidden_sizes,
            seed,
            algo.gamma,
            cfg.env.num_envs,
            device=cfg.actor.device,
            sde_sample_freq=algo.sde_sample_freq if algo.use_sde else None,
            log_std_init=algo.log_std_init,
            normalize_observations=algo.normalize_observations,
            normalize_rewards=algo.normalize_rewards,
        )
    network, outputs = network_for(cfg, action_space)
    return PPOPolicy(obs_dim, outputs, algo.hidden_sizes, seed, network=network, device=cfg.actor.device)


def gae(
    rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, last_values: np.ndarray, gamma: float, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimates for a rollout of shape ``(T, N)``.

    ``dones[t]`` marks that the episode ended at step t (the next observation starts a new
    episode, so nothing is bootstrapped across it; truncated episodes have their bootstrap
    value already added to ``rewards[t]`` by the actor). ``last_values`` is V of the
    observation after the last step. Returns ``(advantages, returns)``.
    """
    T = len(rewards)
    adv = np.zeros_like(rewards, dtype=np.float32)
    last = np.zeros_like(last_values, dtype=np.float32)
    for t in range(T - 1, -1, -1):
        next_v = last_values if t == T - 1 else values[t + 1]
        nonterminal = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_v * nonterminal - values[t]
        last = delta + gamma * lam * nonterminal * last
        adv[t] = last
    return adv, adv + values


def ppo_loss(
    net: ActorCriticNet,
    obs,
    actions,
    old_logp,
    adv,
    returns,
    clip: float,
    vf_coef: float,
    ent_coef: float,
    normalize: bool,
    prox_logp: torch.Tensor | None = None,
    weight_max: float = 2.0,
):
    """Clipped-surrogate PPO loss of one minibatch; returns ``(loss, stats)``, the stats as
    detached 0-d tensors on the loss's device (reading one waits for the device).

    ``old_logp`` is the log-probability under the policy that acted. With ``prox_logp`` (the
    decoupled objective of Hilton et al. 2021, for data from older policies) the ratio is taken
    against that proximal policy and clipped there, and each sample is weighted by
    ``min(pi_prox / pi_old, weight_max)``: ``-mean(w * min(r * A, clip(r) * A))``. Without it,
    ``w = 1`` and the proximal policy is the one that acted (standard PPO)."""
    logp, entropy, value = net.evaluate(obs, actions)
    anchor = old_logp if prox_logp is None else prox_logp
    log_ratio = logp - anchor
    ratio = log_ratio.exp()
    if normalize and len(adv) > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    if prox_logp is None:
        weight = torch.ones((), device=ratio.device)
        weighted = adv
    else:
        weight = (prox_logp - old_logp).exp().clamp(max=weight_max)
        weighted = adv * weight
    pg = torch.max(-weighted * ratio, -weighted * ratio.clamp(1 - clip, 1 + clip)).mean()
    v_loss = 0.5 * ((value - returns) ** 2).mean()
    ent = entropy.mean()
    loss = pg - ent_coef * ent + vf_coef * v_loss
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clipfrac = ((ratio - 1).abs() > clip).float().mean()
    return loss, {
        "pg_loss": pg.detach(),
        "v_loss": v_loss.detach(),
        "entropy": ent.detach(),
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
        "behaviour_weight": weight.mean(),
    }


def observations_of(t: Inputs) -> Callable[[slice | torch.Tensor], torch.Tensor]:
    """``observations(idx)``: the batch's observations at ``idx`` (an index tensor or a
    slice), Atari's stacks gathered from ``frames`` by their positions."""
    if "frames" in t:
        frames, positions = t["frames"], t["obs_frames"].long()

        def stacked(idx) -> torch.Tensor:
            return frames[positions[idx]]

        return stacked
    obs = t["obs"]

    def flat(idx) -> torch.Tensor:
        return obs[idx]

    return flat


def minibatch(t: Inputs, observations, prox_logp: torch.Tensor | None, idx: torch.Tensor) -> Inputs:
    """The rows ``idx`` of the batch ``t``: what one minibatch step trains on."""
    inputs = {
        "obs": observations(idx),
        "actions": t["actions"][idx],
        "logp": t["logp"][idx],
        "advantages": t["advantages"][idx],
        "returns": t["returns"][idx],
    }
    if prox_logp is not None:
        inputs["prox_logp"] = prox_logp[idx]
    return inputs


class PPOLearner:
    """Owns the network and Adam; ``train(batch, progress)`` runs the minibatch epochs.

    The math is :meth:`loss` and :meth:`_iteration`; its :class:`~tianji_dask.algos.executor.Executor`
    runs it: on CUDA, Adam is capturable (its learning rate a device tensor), so that the whole
    iteration (``algo.cuda_graph: iteration``) or each minibatch step (``minibatch``) is replayed
    as one CUDA graph. The iteration's graph warms up with one eager iteration (its 128 minibatch
    steps create Adam's state and the libraries' handles), then captures."""

    #: What the statistics of an update hold, in order.
    stat_names = ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "behaviour_weight", "loss")

    def __init__(
        self, obs_dim: int, n_actions: int, algo: PPOConfig, seed: int, device: str = "cpu", network: str = "mlp"
    ):
        torch.manual_seed(seed)
        self.algo = algo
        self.device = torch.device(device)
        self._to_device = BatchMover(self.device)
        self.net = actor_critic(
            obs_dim, n_actions, algo.hidden_sizes, network, sde=algo.use_sde, log_std_init=algo.log_std_init
        ).to(self.device)
        self.rng = np.random.default_rng(seed)
        self.updates = 0
        # running statistics the network carries, by name (the Gaussian policy's; none otherwise)
        self._statistics = {n: m for n, m in self.net.named_modules() if isinstance(m, RunningMoments)}
        set_trunk_precision(self.net, algo.precision, self.device)
        self._frames: torch.Tensor | None = None  # the iteration graph's frames, padded to a capacity
        self.run = Executor(self.device)
        self._make_optimizer()

    def _make_optimizer(self) -> None:
        self.run.adam(self.net.parameters(), self.algo.lr, self.algo.max_grad_norm, eps=1e-5)

    @property
    def optim(self) -> torch.optim.Adam:
        return self.run.optim

    def prepare(self) -> None:
        """The optimiser made: what an update needs and the actors do not, done once the first
        parameters are out."""
        self.run.optim  # noqa: B018 - made now, not at the first update

    def set_lr_for(self, env_steps: int) -> float:
        algo = self.algo
        lr = algo.lr if algo.lr_anneal_steps is None else algo.lr * max(0.0, 1.0 - env_steps / algo.lr_anneal_steps)
        lr = max(lr, algo.lr * 0.05)  # never stop learning entirely when a run outlives the schedule
        self.run.set_lr(lr)
        return lr

    def train(self, batch: dict[str, np.ndarray], grad_hook=None) -> dict:
        """``batch``: flat arrays obs, actions, logp, advantages, returns; or, for Atari, instead
        of obs the batch's ``frames`` once and ``obs_frames``, each observation's frames as
        positions into them (its stacks are rebuilt here, per minibatch, on the device).
        ``grad_hook()`` runs between backward and step (the data-parallel learners average
        gradients there).

        The epochs' permutations are drawn first (the same draws, in the same order, as one per
        epoch) and go to the device with the batch. Without a grad hook (and ``algo.cuda_graph:
        iteration`` on CUDA) the iteration is :meth:`_iteration`: on CUDA replayed as one CUDA
        graph, on the CPU run as it is; with one (or ``cuda_graph: minibatch``), the minibatch loop
        below, each step eager or its own graph. Both give the same results."""
        algo = self.algo
        n = len(batch["actions"])
        perms = np.stack([self.rng.permutation(n) for _ in range(algo.epochs)])
        t = self._to_device({**batch, "perms": perms})
        graphed_steps = self.run.graphs and algo.cuda_graph == "minibatch"
        if grad_hook is None and not graphed_steps:
            means = self._run_iteration(t)
            self.updates += algo.epochs * algo.minibatches
            return dict(zip(self.stat_names, means.tolist()))  # the one wait for the device
        observations = observations_of(t)
        prox_logp = (
            self._proximal_logp(observations, t["actions"]) if algo.staleness_correction == "decoupled" else None
        )
        if graphed_steps and grad_hook is None:
            step = partial(self.run.launch, "minibatch", self._minibatch_step)
        else:
            step = partial(self.run.eager, partial(self._minibatch_step, grad_hook=grad_hook))
        sums: torch.Tensor | None = None  # the minibatches' stats, summed on the device
        count = 0
        for perm in t["perms"]:
            # exactly `minibatches` steps per epoch whatever n is: data-parallel ranks, whose
            # batches may differ in size, must make the same number of all-reduce calls
            for idx in torch.tensor_split(perm, algo.minibatches):
                stats = step(minibatch(t, observations, prox_logp, idx))
                sums = stats.clone() if sums is None else sums + stats
                self.updates += 1
                count += 1
        assert sums is not None  # epochs >= 1 and minibatches >= 1
        return dict(zip(self.stat_names, (sums / count).tolist()))  # the one wait for the device

    def _run_iteration(self, t: Inputs) -> torch.Tensor:
        """:meth:`_iteration` on the batch ``t`` (on the device, with ``perms``): replayed from
        its CUDA graph, or run eagerly on the CPU. A graph keeps the shapes it was captured with,
        so Atari's frames, whose count varies from batch to batch, are copied into a buffer of a
        capacity with room to spare (grown, and a new graph captured, only when a batch holds
        more); the positions never point past a batch's own frames."""
        if not self.run.graphs:
            return self.run.eager(self._iteration, t)
        obs: tuple[str, ...] = ("frames", "obs_frames") if "frames" in t else ("obs",)
        inputs = {k: t[k] for k in (*obs, "actions", "logp", "advantages", "returns", "perms")}
        if "frames" in inputs:
            frames = inputs["frames"]
            if self._frames is None or len(self._frames) < len(frames) or self._frames.shape[1:] != frames.shape[1:]:
                capacity = len(frames) + len(frames) // 4
                self._frames = torch.zeros((capacity, *frames.shape[1:]), dtype=frames.dtype, device=self.device)
            self._frames[: len(frames)].copy_(frames)
            inputs["frames"] = self._frames
        return self.run.launch("iteration", self._iteration, inputs, warmup=1)

    def _iteration(self, t: Inputs) -> torch.Tensor:
        """One training iteration on the batch ``t`` (its fields on the device, ``perms`` the
        epochs' permutations as rows): the proximal log-probs (decoupled PPO), then each epoch's
        minibatches, gathered by ``perms`` on the device, each step's gradients cleared before
        it; returns the mean of the steps' stats. Never waits for the device and never reads a
        value on the host, so it can be captured as one CUDA graph (``perms`` changes from
        iteration to iteration as data in the graph's buffer, not as Python values). The same
        operations in the same order as the minibatch loop of :meth:`train`."""
        algo = self.algo
        observations = observations_of(t)
        prox_logp = (
            self._proximal_logp(observations, t["actions"]) if algo.staleness_correction == "decoupled" else None
        )
        sums: torch.Tensor | None = None
        for perm in t["perms"]:
            for idx in torch.tensor_split(perm, algo.minibatches):
                self.run.zero_grad()  # in a capture: the next backward allocates (in the graph's pool) and writes
                stats = self._minibatch_step(minibatch(t, observations, prox_logp, idx))
                sums = stats.clone() if sums is None else sums + stats
        assert sums is not None  # epochs >= 1 and minibatches >= 1
        return sums / (algo.epochs * algo.minibatches)

    def _minibatch_step(self, inputs: Inputs, grad_hook=None) -> torch.Tensor:
        """:meth:`loss`, backward, ``grad_hook()``, clipping and Adam's step on one minibatch,
        without waiting for the device; returns the stats (:attr:`stat_names`) stacked. Gradients
        must be cleared before."""
        loss, st = self.loss(inputs)
        self.run.apply(loss, grad_hook)
        st["loss"] = loss.detach()
        return torch.stack([st[k] for k in self.stat_names])

    def loss(self, inputs: Inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:func:`ppo_loss` of one minibatch under the config's coefficients."""
        algo = self.algo
        return ppo_loss(
            self.net,
            inputs["obs"],
            inputs["actions"],
            inputs["logp"],
            inputs["advantages"],
            inputs["returns"],
            algo.clip_coef,
            algo.vf_coef,
            algo.ent_coef,
            algo.normalize_advantages,
            prox_logp=inputs.get("prox_logp"),
            weight_max=algo.behaviour_weight_max,
        )

    @torch.no_grad()
    def _proximal_logp(self, observations, actions: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
        """Log-probabilities of the batch's actions under the policy as this iteration starts,
        in chunks of ``chunk`` (slices: no index tensors to build)."""
        n = len(actions)
        out = torch.empty(n, device=actions.device)
        for start in range(0, n, chunk):
            part = slice(start, min(start + chunk, n))
            out[part] = self.net.evaluate(observations(part), actions[part])[0]
        return out

    def merge_statistics(self, rollout: dict[str, np.ndarray]) -> None:
        """Fold a rollout's moments (the fields named as the network's running statistics,
        :meth:`GaussianPolicy.rollout_statistics`) into the network's; they are published with
        the next parameters. A network without running statistics takes nothing."""
        for name, running in self._statistics.items():
            if name in rollout:
                running.merge(Moments.unpack(rollout[name], tuple(running.mean.shape)))

    def load_policy_params(self, params: dict[str, np.ndarray]) -> None:
        self.net.load_state_dict({k: torch.as_tensor(v) for k, v in params.items()})

    @property
    def module(self) -> nn.Module:
        return self.net

    def policy_params(self) -> dict[str, np.ndarray]:
        return host_arrays(self.net)

    def state(self) -> State:
        """Everything a resume needs, as plain dicts of tensors (checkpoint format)."""
        lr = float(self.optim.param_groups[0]["lr"])
        return {
            "net": self.net.state_dict(),
            "optim_state": optimizer_state(self.optim),
            "schedule": {
                "updates": torch.tensor(self.updates, dtype=torch.int64),
                "lr": torch.tensor(lr, dtype=torch.float64),
            },
            "minibatch_rng": generator_state(self.rng),
        }

    def restore(self, state: State) -> None:
        """Continue from ``state()`` of a learner of the same config: the learning rate in
        effect and the generator that shuffles minibatches come back too."""
        self.net.load_state_dict(component(state, "net", "PPO"))
        # a new optimiser and graphs: a captured step keeps reading the state tensors it was captured with
        self._make_optimizer()
        load_optimizer_state(self.optim, component(state, "optim_state", "PPO"))
        schedule = component(state, "schedule", "PPO")
        self.updates = int(schedule["updates"])
        self.run.set_lr(float(schedule["lr"]))
        restore_generator(self.rng, component(state, "minibatch_rng", "PPO"))
