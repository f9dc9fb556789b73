"""Dask actors that host the role loops: ``ActorHost``, ``BufferHost``, ``LearnerHost``.

Each host runs its role's loop in a thread it owns. Never in a plain ``def`` actor
method: all sync actor methods of a worker share ONE thread, so an endless sync
loop would freeze every host on that worker. The ``async def`` methods
``start``, ``stop``, ``stats`` and ``error`` run on the worker's event loop and
stay callable while the loop runs.

Each host is two parts: :class:`~tianji_dask.runtime.hosts.host_loop.HostLoop`, the loop thread with
its heartbeats, and ``_LoopHost``, the Dask-facing ``async def`` methods around it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from distributed import Actor, get_worker
from distributed.comm import get_address_host

from tianji_dask.algos.registry import spec_for
from tianji_dask.channels import ChannelService, QueueSender, TopicPublisher
from tianji_dask.config import ExperimentConfig
from tianji_dask.config.deployment import deployment_settings
from tianji_dask.devices import on_slot_gpu
from tianji_dask.results.checkpoint import pack_state, unpack_state
from tianji_dask.roles.buffer import ReplayBufferRole
from tianji_dask.roles.loop import ActorLoopRole, BufferLoopRole, LearnerLoopRole
from tianji_dask.roles.replay_state import ReplayMark, ReplayState
from tianji_dask.runtime.hosts.gossip import GossipSync, close_peer_inboxes, open_peer_inboxes
from tianji_dask.runtime.hosts.host_loop import HostLoop, R

if TYPE_CHECKING:
    import gymnasium as gym

    from tianji_dask.runtime.hosts.dataparallel import DataParallelUpdates, Rendezvous

IDLE_S = 0.0002  # a learner with nothing to train on yields this long before looking again


def stop_event_name(run_id: str) -> str:
    """The run's global stop: a ``distributed.Event`` every host watches."""
    return f"tianji-stop-{run_id}"


class _LoopHost(HostLoop[R]):
    """The Dask-facing side of a host: the ``async def`` methods the driver calls on the
    worker's event loop (start, stop, stats, error); the loop itself is :class:`HostLoop`'s."""

    role_name = "?"

    def __init__(
        self, run_id: str, config_json: str, host_id: int, incarnation: int = 0, *, gpu_slot: int | None = None
    ):
        """``gpu_slot``: which of the worker's GPUs a ``cuda`` device means
        (:mod:`tianji_dask.devices`); default ``host_id``, a learner's and its buffer's."""
        cfg = on_slot_gpu(ExperimentConfig.model_validate_json(config_json), host_id if gpu_slot is None else gpu_slot)
        super().__init__(run_id, cfg, host_id, incarnation, get_worker())
        self._watcher: asyncio.Future[None] | None = None  # the global stop's watch, once started

    def _comm_kwargs(self) -> dict:
        """Where channel I/O runs (this worker's event loop) and how it connects (its security)."""
        return {
            "loop": self.worker.loop.asyncio_loop,  # type: ignore[attr-defined]  # always tornado's AsyncIOLoop
            "connection_args": self.worker.security.get_connection_args("worker"),
        }

    async def start(self) -> str:
        """Start the loop thread; returns the worker address hosting this role."""
        if self._thread is None and not self._stop.is_set():
            self._start_thread()
            self._watcher = asyncio.ensure_future(self._watch_global_stop())
        return self.worker.address

    async def _watch_global_stop(self) -> None:
        from distributed import Event

        client = self.worker._get_client()
        try:
            await Event(stop_event_name(self.run_id), client=client).wait()
        except asyncio.CancelledError:
            return
        except Exception:  # noqa: BLE001 - scheduler gone: the heartbeat supervision takes over
            return
        self._stop.set()

    async def stop(self, timeout: float = 10.0) -> dict:
        """Ask the loop to finish, wait for it (up to ``timeout``) and return the last heartbeat."""
        never_started = not self._stop.is_set() and self._thread is None
        self._stop.set()
        if self._watcher is not None:
            self._watcher.cancel()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, timeout)
        elif never_started:  # stopped before its loop (a rebuild as the run starts): close what __init__ opened
            self._close()
        return self._last

    async def stats(self) -> dict:
        """The latest heartbeat: counters and rates' raw material (cheap; callable anytime)."""
        return self._last

    async def error(self) -> str | None:
        return self._error


class BufferHost(_LoopHost[BufferLoopRole]):
    """Receives trajectory chunks on channel ``channel`` of its worker into replay memory."""

    role_name = "buffer"

    def __init__(
        self,
        run_id: str,
        config_json: str,
        host_id: int,
        seed: int,
        channel: str,
        obs_shape: tuple,
        obs_dtype: str,
        n_senders: int = 1,
        *,
        incarnation: int = 0,
        replay: ReplayState | None = None,
    ):
        """``replay``: for a buffer re-created after its worker was lost, the replay state its
        predecessor's learner host copied (:meth:`LearnerHost.group_snapshot`), which it starts with."""
        super().__init__(run_id, config_json, host_id, incarnation)
        inbox = ChannelService.current().open_queue(
            channel, self.cfg.channel.capacity_bytes * max(1, n_senders), replace=incarnation > 0
        )
        self.channel = channel
        self.role = spec_for(self.cfg).make_buffer(
            self.cfg, inbox, tuple(obs_shape), np.dtype(obs_dtype), seed, host_id
        )
        if replay is not None:
            if not isinstance(self.role, ReplayBufferRole):
                raise TypeError(f"buffer {host_id}: a replay state given to a {type(self.role).__name__}")
            self.role.restore_replay(replay)

    def _make_role(self) -> BufferLoopRole:
        return self._built

    def _torch_threads(self) -> int:  # shares the learner's process: the same process-wide setting
        return self.cfg.topology.learner_torch_threads

    def _after_loop(self) -> None:
        ChannelService.for_worker(self.worker).close(self.channel)


class SnapshotRequests:
    """Hands a copy of the learner's state from its loop thread to a caller on another thread.

    A copy taken from outside the loop could catch an update halfway, so the caller asks
    (:meth:`request`) and the loop answers between two updates (:meth:`serve`)."""

    def __init__(self) -> None:
        self._wanted: tuple[concurrent.futures.Future, Callable[[], Any] | None] | None = None

    def request(self, take: Callable[[], Any] | None = None) -> concurrent.futures.Future:
        """Ask for ``take()`` (default: what :meth:`serve` is given) from the loop thread."""
        want: concurrent.futures.Future = concurrent.futures.Future()
        self._wanted = (want, take)
        return want

    def serve(self, take: Callable[[], Any]) -> None:
        """In the loop thread: answer the pending request, if any, with its own ``take`` or this one."""
        if self._wanted is None:  # the usual case, every step: read only, so no request is overwritten
            return
        (want, own), self._wanted = self._wanted, None
        try:
            want.set_result((own or take)())
        except Exception as exc:  # noqa: BLE001 - the caller reports it; the loop goes on
            want.set_exception(exc)

    def cancel(self, reason: str) -> None:
        """As the loop ends: answer a pending request with an error rather than let it time out."""
        wanted, self._wanted = self._wanted, None
        if wanted is not None:
            wanted[0].set_exception(RuntimeError(reason))


class LocalUpdates:
    """The update part of a learner alone in its group: it updates whenever it can and stops
    when asked."""

    def running(self, stop_requested: bool) -> bool:
        return not stop_requested

    def step(self, learner: LearnerLoopRole, stop_requested: bool, params_changed: bool) -> bool:
        """True if the learner updated."""
        return learner.step()

    average_gradients = None  # alone in its group: nothing to average

    def close(self) -> None:
        pass


class LearnerHost(_LoopHost[LearnerLoopRole]):
    """Trains on its buffer; a group's rank 0 publishes parameters to ``subscribers``.

    ``buffer`` is the handle of the :class:`BufferHost` it trains from, which must live on the
    same worker: the learner samples from that buffer's memory directly, with no copy between
    processes. Its step composes separate parts: snapshot requests (:class:`SnapshotRequests`),
    gossip with the other groups (:class:`~tianji_dask.runtime.hosts.gossip.GossipSync`, rank 0 of each group
    when there are several groups) and updates, alone (:class:`LocalUpdates`) or as one rank of
    a data-parallel group (:class:`~tianji_dask.runtime.hosts.dataparallel.DataParallelUpdates`,
    ``world_size > 1``: rank 0 opens the rendezvous store in its constructor, the driver reads
    its host and port with :meth:`rendezvous_address` and gives them to the other ranks, which
    may live on other hosts). Each part builds its own channels and group; the host composes them.
    """

    role_name = "learner"
    startup_phases: ClassVar[dict[str, Callable[[Any], bool]]] = {
        "first_learner_update": lambda role: role.counters.updates > 0,
        # the rank that publishes (data-parallel ranks but the first have no publisher)
        "first_parameters": lambda role: role.publisher is not None and role.counters.param_version >= 0,
    }

    def _torch_threads(self) -> int:
        return self.cfg.topology.learner_torch_threads

    def __init__(
        self,
        run_id: str,
        config_json: str,
        host_id: int,
        seed: int,
        subscribers: list,
        obs_dim: int,
        action_space: gym.Space,
        buffer: Actor,
        *,
        rank: int = 0,
        world_size: int = 1,
        store_address: tuple[str, int] | None = None,
        gossip_peers: dict | None = None,
        incarnation: int = 0,
        restore: bytes | None = None,
    ):
        """``restore``: a packed learner state (of a snapshot or checkpoint) to continue from,
        for a learner re-created after its worker was lost."""
        super().__init__(run_id, config_json, host_id, incarnation)
        self._restore = restore
        buffer_host = self.worker.state.actors.get(buffer.key)
        if not isinstance(buffer_host, BufferHost):
            raise RuntimeError(
                f"LearnerHost {host_id} of run {run_id} must be placed on the worker of its BufferHost "
                f"({buffer.key}): {self.worker.address} does not hold it"
            )
        self.buffer = buffer_host._built  # built with its host
        self._make_learner = functools.partial(
            spec_for(self.cfg).make_learner,
            self.cfg,
            self.buffer,
            obs_dim=obs_dim,
            action_space=action_space,
            seed=seed,
        )
        self._subscribers = [tuple(s) for s in subscribers]
        self.rank, self.world_size = rank, world_size
        self.rendezvous: Rendezvous | None = None
        if world_size > 1:
            from tianji_dask.runtime.hosts.dataparallel import Rendezvous

            timeout_s = deployment_settings().timeouts.data_parallel
            host = get_address_host(self.worker.address)
            self.rendezvous = Rendezvous(rank, world_size, host, store_address, timeout_s)
        self.snapshots = SnapshotRequests()
        self.publisher: TopicPublisher | None = None  # built in the loop thread (rank 0 only)
        self.updates: LocalUpdates | DataParallelUpdates = LocalUpdates()
        # gossip: {"group": g, "publish_to": [(address, channel)], "inboxes": {peer_group: channel}}
        self._gossip_spec = gossip_peers
        self.gossip: GossipSync | None = None
        self._gossip_inboxes = open_peer_inboxes(gossip_peers, replace=incarnation > 0) if gossip_peers else {}

    async def rendezvous_address(self) -> tuple[str, int] | None:
        """(host, port) of this rank-0 learner's rendezvous store (None without data parallelism)."""
        return self.rendezvous.address if self.rendezvous is not None else None

    def _make_role(self) -> LearnerLoopRole:
        self.publisher = TopicPublisher(list(self._subscribers), **self._comm_kwargs()) if self.rank == 0 else None
        if self.rendezvous is not None:
            from tianji_dask.runtime.hosts.dataparallel import DataParallelUpdates

            self.updates = DataParallelUpdates.open(self.rendezvous, self.cfg.learner.device)
        role = self._make_learner(
            publisher=self.publisher,
            learner_id=self.id,
            world_size=self.world_size,
            average_gradients=self.updates.average_gradients,
        )
        if self._restore is not None:
            role.restore(unpack_state(self._restore))
            self._restore = None
        if self._gossip_spec:
            interval = self.cfg.topology.sync_interval_s
            self.gossip = GossipSync.open(self._gossip_spec, self._gossip_inboxes, interval, **self._comm_kwargs())
            role.record_gossip(0, float("nan"))
        return role

    async def move_subscriber(self, channel: str, new_address: str) -> None:
        """A subscriber of this learner's parameters or gossip (``channel``, one subscriber's
        name) was re-created on another worker: publish there from now on, starting with the
        latest version. Wherever it was before: a re-creation cut short by another lost worker
        never moved it to the worker it was meant for. Nothing to do if it is there already."""
        spec = self._gossip_spec or {}
        for subscribers, publisher in (
            (self._subscribers, self.publisher),
            (spec.get("publish_to", []), self.gossip.publisher if self.gossip is not None else None),
        ):
            for k, (address, ch) in enumerate(subscribers):
                if ch == channel and address != new_address:
                    subscribers[k] = (new_address, ch)  # what a publisher not built yet will use
                    if publisher is not None:
                        publisher.remove_subscriber(address, channel)
                        publisher.add_subscriber(new_address, channel)

    def _before_loop(self) -> None:
        self._built.publish()  # version 0: actors start acting as soon as it lands
        self._note_phases()
        if self.publisher is None:  # a rank that never publishes: no test of it in every step
            self._pending_phases.pop("first_parameters", None)
        began = time.monotonic()
        self._built.prepare()  # the optimiser and compiled kernels: seconds the actors need not wait
        self._start_parts["prepare"] = time.monotonic() - began

    def _continue(self) -> bool:
        return self.updates.running(self._stop.is_set())

    def _step(self) -> None:
        self.snapshots.serve(self._state_on_cpu)
        role = self._built
        changed = self.gossip.apply(role) if self.gossip is not None else False
        if not self.updates.step(role, self._stop.is_set(), changed):
            time.sleep(IDLE_S)

    def _after_loop(self) -> None:
        self.snapshots.cancel(f"learner {self.id}'s loop ended before its snapshot")
        if self.publisher is not None:
            self.publisher.close(timeout=2.0)
        if self.gossip is not None:
            self.gossip.close()
        if self._gossip_spec:
            close_peer_inboxes(self._gossip_spec, self.worker)
        self.updates.close()
        if self.rendezvous is not None:
            self.rendezvous.close()

    async def parameters(self) -> dict:
        """The learner's current network parameters as numpy arrays (tests, diagnostics)."""
        return self.role.policy_params() if self.role is not None else {}

    async def checkpoint(self) -> tuple[bytes, dict] | None:
        """(packed state, metadata) of the learner's full state; call after ``stop``. None when
        the run stopped before the learner was built: there is no state to save."""
        if self.role is None:
            return None
        return await _packed(self._state())

    async def snapshot(self, timeout: float = 60.0) -> tuple[bytes, dict]:
        """Like :meth:`checkpoint`, while the loop runs: the loop thread copies the state to CPU
        between two updates, and it is packed outside the loop."""
        if self._thread is None or not self._thread.is_alive():
            return await _packed(self._state())
        return await _packed(await asyncio.wait_for(asyncio.wrap_future(self.snapshots.request()), timeout))

    async def group_snapshot(
        self, learner: bool, replay: tuple[ReplayMark | None, int] | None, timeout: float = 60.0
    ) -> dict:
        """What a group rebuilt after its worker was lost continues from, taken by the loop
        thread between two updates: ``learner`` (if asked: :meth:`snapshot`'s packed state and
        metadata) and, with ``replay = (since, max_bytes)``, ``replay``: the buffer's replay
        state (only what changed after the mark ``since``; None for a buffer without a replay,
        or one whose filled part is more than ``max_bytes``) and ``replay_bytes``, its filled part's
        bytes."""

        def take() -> dict:
            out: dict = {"learner": self._state_on_cpu() if learner else None, "replay": None, "replay_bytes": 0}
            if replay is not None and isinstance(self.buffer, ReplayBufferRole):
                out["replay"], out["replay_bytes"] = self.buffer.replay_state(*replay)
            return out

        if self._thread is None or not self._thread.is_alive():
            out = take()
        else:
            out = await asyncio.wait_for(asyncio.wrap_future(self.snapshots.request(take)), timeout)
        if out["learner"] is not None:
            out["learner"] = await _packed(out["learner"])
        return out

    def _state_on_cpu(self) -> tuple[dict, dict]:
        state, meta = self._state()
        return {part: {k: v.detach().to("cpu", copy=True) for k, v in t.items()} for part, t in state.items()}, meta

    def _state(self) -> tuple[dict, dict]:
        role = self._built
        return role.state(), {**role.checkpoint_meta(), "algo": self.cfg.algo.name, "env_id": self.cfg.env.id}


async def _packed(state_and_meta: tuple[dict, dict]) -> tuple[bytes, dict]:
    """A learner's (state, metadata) with the state packed, in a thread: not on the event loop."""
    state, meta = state_and_meta
    return await asyncio.to_thread(pack_state, state), meta


class ActorHost(_LoopHost[ActorLoopRole]):
    """Steps a vector env with the newest parameters and pushes chunks to the buffer."""

    role_name = "actor"
    startup_phases: ClassVar[dict[str, Callable[[Any], bool]]] = {
        "first_env_step": lambda role: role.counters.env_steps > 0
    }

    def __init__(
        self,
        run_id: str,
        config_json: str,
        host_id: int,
        seed: int,
        buffer_address: str,
        traj_channel: str,
        params_channel: str,
        *,
        incarnation: int = 0,
        prior_env_steps: int = 0,
        balance_from_zero: bool = False,
        buffer_id: int | None = None,
    ):
        """``prior_env_steps``: env steps of the actor's predecessors, for one re-created after
        its worker was lost: its exploration schedule goes on, and so does its share of the
        production the balance controller weighs against its learner's consumption, unless
        ``balance_from_zero`` (its learner and buffer were re-created too and count from 0).
        ``buffer_id``: the global id of the buffer it feeds, whose learner's GPU it uses."""
        super().__init__(run_id, config_json, host_id, incarnation, gpu_slot=buffer_id)
        self.params_channel = params_channel
        self.params = ChannelService.current().open_latest(params_channel, replace=incarnation > 0)
        self.buffer_address, self.traj_channel = buffer_address, traj_channel
        self._make_actor = functools.partial(
            spec_for(self.cfg).make_actor,
            self.cfg,
            host_id,
            seed,
            params=self.params,
            prior_env_steps=prior_env_steps,
            balance_prior_env_steps=0 if balance_from_zero else prior_env_steps,
            should_stop=self._stop.is_set,
        )

    def _device(self) -> str:
        return self.cfg.actor.device

    def _make_role(self) -> ActorLoopRole:
        c = self.cfg.channel
        self.sender = QueueSender(
            self.buffer_address,
            self.traj_channel,
            f"actor-{self.id}",
            c.capacity_bytes,
            full_policy=c.full_policy,
            **self._comm_kwargs(),
        )
        return self._make_actor(sender=self.sender)

    def _before_loop(self) -> None:
        # the only wait of an actor: for the first parameters; heartbeats go on meanwhile
        interval = self.cfg.run.metrics_interval
        wait_s = deployment_settings().timeouts.first_params
        deadline = time.monotonic() + wait_s
        while not self._stop.is_set():
            try:
                self._built.wait_for_params(timeout=interval, stop=self._stop.is_set)
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"actor {self.id}: no parameters from the learner after {wait_s:g} s "
                        "(tianji.timeouts.first-params)"
                    ) from None
                self._beat()

    def _after_loop(self) -> None:
        try:
            if self.role is not None:
                self.sender.close(timeout=2.0)
        finally:
            # opened in __init__: left open, every run would leave an inbox (holding its last
            # parameters) on the worker for good
            ChannelService.for_worker(self.worker).close(self.params_channel)
