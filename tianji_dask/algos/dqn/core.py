"""Double DQN: Q-network, epsilon-greedy acting, and the learner's update.

The pieces are split the way the roles use them: :class:`DQNPolicy` lives in
actors (inference only, parameters swapped in by version), :class:`DQNLearner`
lives in the learner (online and target networks, Adam, Huber loss). The Q-network is an MLP,
or the Nature CNN for Atari (:mod:`tianji_dask.algos.networks`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from tianji_dask.algos.executor import BatchMover, Executor
from tianji_dask.algos.networks import DuelingHead, NatureQNetwork, set_trunk_precision
from tianji_dask.envs import ATARI_OBS_SHAPE
from tianji_dask.roles.learner_core import State, component, host_arrays, load_optimizer_state, optimizer_state

if TYPE_CHECKING:
    from tianji_dask.config.schema import DQNConfig


def mlp(in_dim: int, out_dim: int, hidden: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(in_dim, h), nn.ReLU()]
        in_dim = h
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


def q_network(
    obs_dim: int, n_actions: int, hidden: list[int], network: str = "mlp", dueling: bool = False
) -> nn.Module:
    """The Q-network: an MLP over flat observations, or the Nature CNN over uint8 frame stacks
    (``network="nature_cnn"``, which ignores ``obs_dim`` and ``hidden``); ``dueling``: Q from a
    value and an advantage stream (for the MLP, one linear layer each after the hidden layers)."""
    if network == "nature_cnn":
        return NatureQNetwork(n_actions, dueling=dueling)
    if network != "mlp":
        raise ValueError(f"unknown network {network!r}; expected 'mlp' or 'nature_cnn'")
    if not dueling:
        return mlp(obs_dim, n_actions, hidden)
    trunk = list(mlp(obs_dim, hidden[-1], hidden[:-1])) + [nn.ReLU()]
    return nn.Sequential(*trunk, DuelingHead(hidden[-1], n_actions))


def epsilon_at(step: int, initial: float, final: float, decay_steps: int) -> float:
    """Linear decay from ``initial`` to ``final`` over ``decay_steps`` env steps."""
    frac = min(1.0, step / decay_steps)
    return initial + frac * (final - initial)


def ape_x_epsilons(first: int, count: int, total: int, base: float, alpha: float) -> np.ndarray:
    """Ape-X's fixed exploration (Horgan et al. 2018): env k of the run's ``total`` envs acts with
    ``base ** (1 + alpha * k / (total - 1))`` (``base`` alone when there is one env); the
    epsilons of envs ``first .. first + count - 1``."""
    k = np.arange(first, first + count, dtype=np.float64)
    return base ** (1.0 + alpha * k / (total - 1)) if total > 1 else np.full(count, base)


def double_dqn_loss(
    q: torch.Tensor,
    q_next_online: torch.Tensor,
    q_next_target: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Huber loss of Q(s,a) against r + discount * Q_target(s', argmax_a' Q_online(s', a')).

    ``rewards`` are (n-step) returns and ``discounts`` the bootstrap factors: ``gamma**n``,
    or 0 for a transition that terminated its episode (truncated episodes bootstrap from
    their final observation). ``weights``: per-transition importance weights of prioritized
    replay (the loss is their weighted mean). Returns ``(loss, q_taken, td_errors)``, the TD
    errors target - Q(s,a) detached.
    """
    q_taken = q.gather(1, actions.unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        best = q_next_online.argmax(dim=1, keepdim=True)
        target = rewards + discounts * q_next_target.gather(1, best).squeeze(1)
    if weights is None:
        loss = F.smooth_l1_loss(q_taken, target)
    else:
        loss = (weights * F.smooth_l1_loss(q_taken, target, reduction="none")).mean()
    return loss, q_taken, (target - q_taken).detach()


class DQNPolicy:
    """Epsilon-greedy inference for an actor. ``act(obs, eps)`` -> int64 actions. The network
    runs on ``device``; exploration draws come from a numpy generator whatever the device."""

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        hidden: list[int],
        seed: int,
        network: str = "mlp",
        device: str = "cpu",
        dueling: bool = False,
    ):
        self.device = torch.device(device)
        self.net = q_network(obs_dim, n_actions, hidden, network, dueling).to(self.device)
        self.net.requires_grad_(False)
        self.n_actions = n_actions
        self.rng = np.random.default_rng(seed)
        self.version = -1

    def load(self, version: int, params: dict) -> None:
        self.net.load_state_dict({k: torch.as_tensor(v) for k, v in params.items()})
        self.version = version

    def act(self, obs: np.ndarray, eps: float | np.ndarray) -> np.ndarray:
        """Epsilon-greedy actions; ``eps`` one for all rows or one per row."""
        with torch.inference_mode():
            greedy = self.net(torch.from_numpy(obs).to(self.device)).argmax(dim=1).cpu().numpy()
        return self._explore(greedy, eps)

    def act_and_values(self, obs: np.ndarray, eps: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Epsilon-greedy actions and the Q-values ``(rows, n_actions)`` they came from."""
        q = self.q_values(obs)
        return self._explore(q.argmax(axis=1), eps), q

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.net(torch.from_numpy(obs).to(self.device)).float().cpu().numpy()

    def _explore(self, greedy: np.ndarray, eps: float | np.ndarray) -> np.ndarray:
        explore = self.rng.random(len(greedy)) < eps
        if explore.any():
            greedy = greedy.copy()
            greedy[explore] = self.rng.integers(0, self.n_actions, size=int(explore.sum()))
        return greedy


#: Updates a CUDA learner may have queued on the device before it waits for the oldest.
MAX_UPDATES_IN_FLIGHT = 8


def _values(net: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    def values(obs: torch.Tensor) -> torch.Tensor:
        return net(obs)

    return values


def _no_grad_values(net: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    def values(obs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return net(obs)

    return values


def loss_and_stats(
    q: torch.Tensor,
    q_next_online: torch.Tensor,
    q_next_target: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    weights: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`double_dqn_loss`, its statistics (:attr:`DQNLearner.stat_names`) stacked."""
    loss, q_taken, td = double_dqn_loss(q, q_next_online, q_next_target, actions, rewards, discounts, weights)
    return loss, torch.stack([loss.detach(), q_taken.detach().mean()]), td


class DQNLearner:
    """Online + target network with Adam; ``update(batch)`` does one gradient step,
    ``update_sampled(sample, count)`` ``count`` of them on batches drawn on the device; both
    return their statistics as a device tensor, without waiting for the device.

    The math is :meth:`loss` and :meth:`_step`; its :class:`~tianji_dask.algos.executor.Executor`
    runs it: on CUDA, Adam is capturable (its learning rate a device tensor), so that
    ``update_sampled`` replays the draws from a device replay and the whole updates as one CUDA
    graph per launch; at most :data:`MAX_UPDATES_IN_FLIGHT` launches are queued on the device at
    a time; the forwards without autograd fork to side streams; ``algo.compile`` puts the
    forwards, the loss and the clipped Adam step through torch.compile. The trunk computes as
    ``algo.precision`` says (:func:`~tianji_dask.algos.networks.trunk_features`)."""

    #: What the statistics tensor an update returns holds, in order.
    stat_names = ("loss", "q_mean")

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        algo: DQNConfig,
        seed: int,
        device: str = "cpu",
        network: str = "mlp",
        graphs: bool = True,
    ):
        torch.manual_seed(seed)
        self.algo = algo
        self.device = torch.device(device)
        self._to_device = BatchMover(self.device)
        self.online = q_network(obs_dim, n_actions, algo.hidden_sizes, network, algo.dueling).to(self.device)
        self.target = q_network(obs_dim, n_actions, algo.hidden_sizes, network, algo.dueling).to(self.device)
        self.target.load_state_dict(self.online.state_dict())
        self.target.requires_grad_(False)
        for net in (self.online, self.target):
            set_trunk_precision(net, algo.precision, self.device)
        if self.device.type == "cuda":
            # a process-wide switch: cuDNN times its convolution algorithms at each new shape (the
            # eager warm-up updates) and keeps the fastest; its defaults at batch 32 are slower
            torch.backends.cudnn.benchmark = True
        self.updates = 0
        # the two forwards over the next observations need nothing of each other nor of the
        # online forward with autograd: on CUDA each runs on a side stream of its own, concurrent
        # branches of a captured graph (at batch 32 one forward's kernels fill few of the SMs)
        self.run = Executor(
            self.device, compile=algo.compile, graphs=graphs, side_streams=2, max_in_flight=MAX_UPDATES_IN_FLIGHT
        )
        self._sample: Callable[[int], dict[str, torch.Tensor]] | None = None
        self._q_values = self.run.compiled(_values(self.online))
        self._loss = self.run.compiled(loss_and_stats)
        self._next_forwards = tuple(
            self.run.compiled(values) for values in (_no_grad_values(self.online), _no_grad_values(self.target))
        )
        self._make_optimizer()
        image = network == "nature_cnn"
        self._obs_shape: tuple[int, ...] = ATARI_OBS_SHAPE if image else (obs_dim,)
        self._obs_dtype = torch.uint8 if image else torch.float32
        self._prepared = False
        self._restored = False

    def _make_optimizer(self) -> None:
        self.run.adam(self.online.parameters(), self.algo.lr, self.algo.max_grad_norm)

    @property
    def optim(self) -> torch.optim.Adam:
        return self.run.optim

    def prepare(self) -> None:
        """The optimiser made and, with ``algo.compile``, the loss, its backward and the Adam
        step compiled (:meth:`_compile_now`): what an update needs and the actors do not, done
        once the first parameters are out, while the replay fills. A restored learner keeps
        its state through the compile."""
        if self._prepared:
            return
        self._prepared = True
        self.run.optim  # noqa: B018 - made now, before a compiled step reads it
        if not self.algo.compile:
            return
        # a copy: the compile's zero-gradient step moves the parameters of a restored Adam
        saved = (
            {c: {k: v.clone() for k, v in part.items()} for c, part in self.state().items()} if self._restored else None
        )
        self._compile_now(self._obs_shape, self._obs_dtype)
        if saved is not None:
            self.restore(saved)

    def update(self, batch: Mapping[str, np.ndarray | torch.Tensor], grad_hook=None) -> torch.Tensor:
        """One gradient step on ``batch`` (numpy arrays, or tensors on the device);
        ``grad_hook()`` runs between backward and the optimiser step (data-parallel learners
        average gradients there). Returns the statistics (:attr:`stat_names`)."""
        self.run.zero_grad()
        stats = self._step(self._to_device(batch), grad_hook)
        self._stepped()
        return stats

    def update_sampled(self, sample: Callable[[int], dict[str, torch.Tensor]], count: int = 1) -> torch.Tensor:
        """``count`` gradient steps on batches ``sample(rows)`` draws on the device with device
        operations only (:meth:`FrameReplay.sample_on_device
        <tianji_dask.roles.frame_replay.FrameReplay.sample_on_device>`), made in launches that end
        where a target sync is due (the sync then happens between launches, at the same update as
        one update at a time would make it). A launch of ``n`` updates draws its ``n`` batches at
        once and the target network's values of all their next observations in one forward
        (:meth:`_sampled_steps`). On CUDA each launch is replayed as one CUDA graph, so ``sample``
        must read the same tensors on every call. Returns the statistics summed over the updates;
        they may belong to a graph: read them before the next update."""
        self._sample = sample
        total: torch.Tensor | None = None
        while count > 0:
            n = min(count, self.algo.target_update_interval - self.updates % self.algo.target_update_interval)
            stats = self.run.launch(n, partial(self._sampled_steps, n), {})
            self._stepped(n)
            count -= n
            if total is None and count == 0:
                return stats
            total = stats.clone() if total is None else total.add_(stats)
        assert total is not None
        return total

    def _sampled_steps(self, n: int, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """``n`` updates on one draw of batches (``inputs`` is empty: the draw reads the
        replay's own tensors), their statistics summed (gradients cleared before the first by the
        launch, before each later one here). No target sync falls inside a launch, so the target
        network's values of every batch's next observations come from one forward over the
        whole draw, forked to a side stream on CUDA; the online network's values of them follow
        its updates, one forward an update (:meth:`loss`). A launch shorter than
        ``algo.updates_per_graph`` (one ending at a publication or a target sync) still draws
        that many batches and uses the first ``n``: the target's forward keeps one shape, which
        a compiled learner compiles once, as it is built."""
        assert self._sample is not None
        rows = self.algo.batch_size
        drawn = self._sample(max(n, self.algo.updates_per_graph) * rows)
        target_values = self.run.fork(1, self._next_forwards[1], drawn["next_obs"])
        total: torch.Tensor | None = None
        for i in range(n):
            if i:
                self.run.zero_grad()
            batch = {k: v[i * rows : (i + 1) * rows] for k, v in drawn.items()}
            stats = self._step(batch, q_next_target=target_values[i * rows : (i + 1) * rows])
            total = stats if total is None else total + stats
        assert total is not None
        return total

    def _step(
        self, t: dict[str, torch.Tensor], grad_hook=None, q_next_target: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Loss, backward, ``grad_hook()``, clipping and Adam's step, with no wait for the device
        (gradients cleared before); ``q_next_target``: the target network's values of the next
        observations, where computed already."""
        loss, stats, td = self.loss(t, q_next_target)
        self._td_errors: torch.Tensor = td
        self.run.apply(loss, grad_hook)
        return stats

    def loss(
        self, t: dict[str, torch.Tensor], q_next_target: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss, the statistics :attr:`stat_names`, the TD errors) of a batch. The online
        network's values of the next observations come from a forward pass of their own, without
        autograd: one forward over both halves would make the backward pass run over twice the
        batch. The forwards without autograd (the target's unless ``q_next_target`` is given)
        fork to side streams on CUDA and join only once the forward with autograd is queued, so
        the three run side by side."""
        q_next_online = self.run.fork(0, self._next_forwards[0], t["next_obs"])
        if q_next_target is None:
            q_next_target = self.run.fork(1, self._next_forwards[1], t["next_obs"])
        q = self._q_values(t["obs"])
        self.run.join()
        return self._loss(q, q_next_online, q_next_target, t["actions"], t["rewards"], t["discounts"], t.get("weights"))

    def _compile_now(self, obs_shape: tuple[int, ...], obs_dtype: torch.dtype) -> None:
        """Compile the loss, its backward and the Adam step on a batch of zeros, so that the
        compiler runs while the replay fills rather than at the first update. Parameters stay as
        they were (Adam moves a parameter by its averaged gradient, all zeros here) and Adam's
        step counts go back to 0: the first real update is that of a fresh learner."""
        n, device = self.algo.batch_size, self.device
        weights = torch.ones(n, device=device) if self.algo.replay == "prioritized" else None
        # distinct tensors: the compiled code is specialised to its inputs' aliasing
        obs, next_obs = (torch.zeros((n, *obs_shape), dtype=obs_dtype, device=device) for _ in range(2))
        actions = torch.zeros(n, dtype=torch.int64, device=device)
        rewards, discounts = torch.zeros(n, device=device), torch.zeros(n, device=device)
        batch = {"obs": obs, "next_obs": next_obs, "actions": actions, "rewards": rewards, "discounts": discounts}
        if weights is not None:
            batch["weights"] = weights
        if self.algo.updates_per_graph > 1:  # the target's forward over a launch's whole draw
            self._next_forwards[1](
                torch.zeros((self.algo.updates_per_graph * n, *obs_shape), dtype=obs_dtype, device=device)
            )
        loss, _, _ = self.loss(batch)
        loss.backward()
        for p in self.online.parameters():
            assert p.grad is not None
            p.grad.zero_()
        self.run.optimizer_step()
        for state in self.optim.state.values():
            state["step"].zero_()
        self.run.zero_grad()

    def _stepped(self, n: int = 1) -> None:
        """``n`` updates made (a launch of them never crosses a target sync)."""
        self.updates += n
        if self.updates % self.algo.target_update_interval == 0:
            self.target.load_state_dict(self.online.state_dict())  # in place: graphs keep reading it
        self.run.mark()

    def td_errors(self) -> np.ndarray:
        """|TD error| of each transition of the last update's batch (prioritized replay's new
        priorities; one device-to-host copy)."""
        return self._td_errors.abs().cpu().numpy()

    def policy_params(self) -> dict[str, np.ndarray]:
        """The online network's weights (:func:`~tianji_dask.roles.learner_core.host_arrays`)."""
        return host_arrays(self.online)

    def load_policy_params(self, params: dict[str, np.ndarray]) -> None:
        """Replace the online network's weights (the target keeps its own schedule)."""
        self.online.load_state_dict({k: torch.as_tensor(v) for k, v in params.items()})

    @property
    def module(self) -> nn.Module:
        """The network whose parameters data-parallel ranks keep identical."""
        return self.online

    def state(self) -> State:
        """Everything a resume needs, as plain dicts of tensors (checkpoint format)."""
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optim_state": optimizer_state(self.optim),
            "schedule": {"updates": torch.tensor(self.updates, dtype=torch.int64)},
        }

    def restore(self, state: State) -> None:
        """Continue from ``state()`` of a learner of the same config: the target network keeps
        its own weights and its sync schedule (the update count)."""
        self.online.load_state_dict(component(state, "online", "DQN"))
        self.target.load_state_dict(component(state, "target", "DQN"))
        self._restored = True
        self._make_optimizer()
        load_optimizer_state(self.optim, component(state, "optim_state", "DQN"))
        self.updates = int(component(state, "schedule", "DQN")["updates"])
