"""Data-parallel learners of one group: a ``torch.distributed`` process group bootstrapped
from the Dask cluster.

The driver creates rank 0's learner first; it opens a ``TCPStore`` on its worker's host on a
port the OS picks (:class:`Rendezvous`) and the driver hands ``(host, port)`` to the other
ranks: no hard-coded ports. Each rank joins the group in its loop thread
(:meth:`DataParallelUpdates.open`). Every update, all ranks first agree (one tiny all-reduce) on
whether everyone can update, whether anyone is stopping, and whether rank 0 has new
parameters to broadcast (after averaging between groups); then gradients are averaged.
Same initial parameters + same averaged gradients + same optimiser = identical parameters.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

# Imported before any process group exists, on purpose: its functions take ``group=group.WORLD``
# as default arguments, evaluated at import. Imported later (torch imports it lazily, for
# example when the first optimizer is built), those defaults hold the default process group
# after ``destroy_process_group``, so gloo's threads outlive ``close()`` and race the
# interpreter's exit, which can abort the process ("terminate called without an active
# exception").
import torch.distributed.nn.functional

from tianji_dask.roles.loop import LearnerLoopRole

CLOSE_TIMEOUT_S = 10.0
STORE_POLL_S = 0.005  # how often a rank asks the store whether every rank has counted itself in


def open_store(host: str, world_size: int, timeout_s: float) -> torch.distributed.TCPStore:
    """Rank 0's rendezvous store on ``host``, port chosen by the OS (``store.port``)."""
    return dist.TCPStore(
        host, 0, world_size, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s)
    )


class Rendezvous:
    """Where the ranks of a data-parallel group meet. Rank 0's opens the store on ``host`` as its
    learner is created, so that the driver can read :attr:`address` and hand it to the other
    ranks before it creates them; theirs is that ``address``. :meth:`close` drops rank 0's store
    (it goes with the group, not at process exit)."""

    def __init__(self, rank: int, world_size: int, host: str, address: tuple[str, int] | None, timeout_s: float):
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.store = open_store(host, world_size, timeout_s) if rank == 0 else None
        self.address = (host, self.store.port) if self.store is not None else address

    def close(self) -> None:
        self.store = None


class DataParallel:
    """One learner's membership in its group's process group.

    Protocol: construct (blocks until all ranks joined), then per update ``agree(...)``,
    ``average_gradients(params)`` between backward and step; ``close()`` at the end.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        host: str,
        port: int,
        *,
        backend: str = "gloo",
        device: str = "cpu",
        timeout_s: float = 60.0,
        store=None,
    ):
        """``backend="nccl"``: every rank on a GPU of its own (``device``, its learner's), the
        collectives' tensors there; gloo's on the CPU."""
        self.rank, self.world_size = rank, world_size
        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None:
            store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
        self._store = store
        on = torch.device(device if backend == "nccl" else "cpu")
        if on.type == "cuda":
            torch.cuda.set_device(on)  # NCCL's communicator binds to the current device
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        self._flags = torch.zeros(3, dtype=torch.int32, device=on)

    def agree(self, can_update: bool, stopping: bool, has_new_params: bool) -> tuple[bool, bool, bool]:
        """(everyone can update, someone is stopping, rank 0 broadcasts parameters now)."""
        f = self._flags
        f.copy_(torch.tensor([not can_update, stopping, has_new_params and self.rank == 0], dtype=torch.int32))
        dist.all_reduce(f, op=dist.ReduceOp.MAX)
        cannot, stop, broadcast = f.tolist()  # one read (from the GPU with NCCL)
        return not cannot, bool(stop), bool(broadcast)

    def average_gradients(self, params) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n

    def broadcast(self, module: torch.nn.Module) -> None:
        """Make every rank's ``module`` parameters and buffers equal to rank 0's."""
        with torch.no_grad():
            for t in module.state_dict().values():
                dist.broadcast(t, src=0)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Leave the group in order: no rank tears its process group down while another may
        still be in a collective, and rank 0's store (the server every rank's store client talks
        to) outlives every rank's teardown. A rank that is gone costs at most ``timeout_s``."""
        if not dist.is_initialized():
            return
        deadline = time.monotonic() + timeout_s
        self._count_and_wait("leaving", deadline)
        dist.destroy_process_group()
        self._count_and_wait("left", deadline, everyone_waits=False)
        self._store = None

    def _count_and_wait(self, key: str, deadline: float, everyone_waits: bool = True) -> None:
        """Count this rank in ``key`` on the store, then wait (rank 0 only unless
        ``everyone_waits``) until every rank has, or until ``deadline``."""
        try:
            self._store.add(key, 1)
            if not everyone_waits and self.rank != 0:
                return
            while self._store.add(key, 0) < self.world_size and time.monotonic() < deadline:
                time.sleep(STORE_POLL_S)
        except RuntimeError:  # the store's server (rank 0) is gone: nobody left to wait for
            pass


class DataParallelUpdates:
    """The update part of one data-parallel rank's loop: every step the ranks agree whether all
    can update, whether one is stopping (then all stop together, so no rank waits in a
    collective for a rank that left) and whether rank 0 broadcasts parameters that gossip
    changed."""

    def __init__(self, dp: DataParallel):
        self.dp = dp
        self._stopped = False

    @classmethod
    def open(cls, rendezvous: Rendezvous, device: str) -> DataParallelUpdates:
        """Join the group at ``rendezvous`` (blocks until every rank has joined) as the rank of a
        learner on ``device``: NCCL's collectives on a CUDA device, gloo's otherwise."""
        if rendezvous.address is None:
            raise ValueError(f"rank {rendezvous.rank} of a data-parallel group needs the rendezvous store's address")
        host, port = rendezvous.address
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dp = DataParallel(
            rendezvous.rank,
            rendezvous.world_size,
            host,
            port,
            backend=backend,
            device=device,
            timeout_s=rendezvous.timeout_s,
            store=rendezvous.store,
        )
        return cls(dp)

    @property
    def average_gradients(self):
        """What the learner calls between backward and step: the gradients averaged over the ranks."""
        return self.dp.average_gradients

    def running(self, stop_requested: bool) -> bool:
        return not self._stopped  # a stop request reaches the others through the next agreement

    def step(self, learner: LearnerLoopRole, stop_requested: bool, params_changed: bool) -> bool:
        """One agreement, then the update if every rank can make it; True if it did."""
        everyone, stopping, broadcast = self.dp.agree(learner.wants_update(), stop_requested, params_changed)
        if stopping:
            self._stopped = True
            return False
        if broadcast:
            self.dp.broadcast(learner.module)
        if everyone:
            learner.update()
        return everyone

    def close(self) -> None:
        self.dp.close()
