"""How a learner core's updates run on its device: its batches moved there (:class:`BatchMover`), and
its steps launched eagerly, compiled, or replayed as CUDA graphs.

A learner core holds the algorithm's math (its networks, its loss, what an update is) and hands
the running of it to an :class:`Executor`, which owns the optimiser's step (backward, gradient
clipping, Adam), the launches (eager, or each replayed from a CUDA graph), torch.compile, the side
streams independent forwards fork to, and the bound on updates queued ahead of the device. An
algorithm written this way gets every one of them by building its executor.

A learner's minibatch step on small batches (PPO's 256 Atari frames) is bound by launching its
few hundred kernels from Python, not by the GPU's arithmetic. Captured once as a CUDA graph
(forward, backward, gradient clipping and a capturable optimiser step) it is replayed with one
launch, its inputs copied into the graph's own buffers first.

The step must not wait for the GPU (no ``.item()``, no data-dependent Python branches), its
optimiser must be built with ``capturable=True`` (and a tensor learning rate, changed in place),
and the tensors it reads besides its inputs (parameters, optimiser state) must keep their
storage: replacing any of them (loading an optimiser's state dict) needs a new
:class:`GraphedStep`. Its stream, memory pool and graphs belong to its ``device``, whatever the
calling thread's current device is (a worker's host on its second GPU).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping

import numpy as np
import torch
import torch.nn as nn

from tianji_dask.config.machine import compiler_problem

Inputs = dict[str, torch.Tensor]
ShapeKey = tuple[tuple[str, tuple[int, ...], torch.dtype], ...]


class GraphedStep:
    """``step(inputs)`` -> the output tensor of ``fn(inputs)``, replayed from a CUDA graph.

    For each new set of input shapes the first ``warmup`` calls run ``fn`` eagerly on a side
    stream (they create the optimiser's state and the libraries' handles, which a capture
    cannot); the next call captures ``fn`` and replays it; later calls copy their inputs into
    the captured buffers and replay. ``zero_grad()`` runs before each eager call and before the
    capture, so ``fn`` itself never clears gradients. The returned tensor belongs to the graph:
    read or copy it before the next call.
    """

    def __init__(
        self,
        fn: Callable[[Inputs], torch.Tensor],
        zero_grad: Callable[[], None],
        warmup: int = 2,
        device: torch.device | str | None = None,
    ):
        self.fn = fn
        self.zero_grad = zero_grad
        self.warmup = warmup
        self.device = _cuda_device(device)
        with torch.cuda.device(self.device):
            self.stream = torch.cuda.Stream()
            self.pool = torch.cuda.graph_pool_handle()
        self._warm: dict[ShapeKey, int] = {}
        self._graphs: dict[ShapeKey, tuple[torch.cuda.CUDAGraph, Inputs, torch.Tensor]] = {}

    @staticmethod
    def _key(inputs: Inputs) -> ShapeKey:
        return tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(inputs.items()))

    def __call__(self, inputs: Inputs) -> torch.Tensor:
        with torch.cuda.device(self.device):
            return self._call(inputs)

    def _call(self, inputs: Inputs) -> torch.Tensor:
        key = self._key(inputs)
        captured = self._graphs.get(key)
        if captured is None:
            if self._warm.get(key, 0) < self.warmup:
                self._warm[key] = self._warm.get(key, 0) + 1
                return self._eager(inputs)
            captured = self._capture(key, inputs)
        graph, static_inputs, out = captured
        for k, v in inputs.items():
            static_inputs[k].copy_(v)
        graph.replay()
        return out

    def _eager(self, inputs: Inputs) -> torch.Tensor:
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            self.zero_grad()
            out = self.fn(inputs)
        torch.cuda.current_stream().wait_stream(self.stream)
        return out

    def _capture(self, key: ShapeKey, inputs: Inputs) -> tuple[torch.cuda.CUDAGraph, Inputs, torch.Tensor]:
        static_inputs = {k: torch.empty_like(v) for k, v in inputs.items()}
        graph = torch.cuda.CUDAGraph()
        self.stream.wait_stream(torch.cuda.current_stream())
        self.zero_grad()  # the backward inside the capture allocates the gradients the graph keeps
        # thread_local: the worker's other threads (comm, the buffer) may touch CUDA meanwhile
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            out = self.fn(static_inputs)
        self._graphs[key] = (graph, static_inputs, out)
        return self._graphs[key]


class InFlight:
    """Bounds how far the host runs ahead of the device: ``mark()`` after each step queued on the
    current stream records an event, and once more than ``limit`` steps are queued it waits for
    the oldest. Steps that never wait for the device (a replayed graph) could otherwise queue
    without end, and the counts the host reports would run ahead of the work done."""

    def __init__(self, limit: int, device: torch.device | str | None = None):
        self.limit = limit
        self.device = _cuda_device(device)
        self._events: deque[torch.cuda.Event] = deque()

    def mark(self) -> None:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._events.append(event)
        if len(self._events) > self.limit:
            self._events.popleft().synchronize()


#: The torch.compile backend of ``algo.compile``: inductor, which generates fused kernels.
COMPILE_BACKEND = "inductor"


def compiled(fn: Callable, device: torch.device) -> Callable:
    """``fn`` through ``torch.compile`` (:data:`COMPILE_BACKEND`, static shapes), wrapped at its
    first call: ``torch.compile`` imports torch._dynamo, seconds that a learner spends after its
    first parameters are published. Refused at once, with the fix, where inductor has no
    compiler for ``device`` (:func:`~tianji_dask.config.machine.compiler_problem`)."""
    problem = compiler_problem(device.type)
    if problem:
        raise RuntimeError(f"algo.compile=true: {problem}")
    made: Callable | None = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal made
        if made is None:
            made = torch.compile(fn, dynamic=False, backend=COMPILE_BACKEND)
        return made(*args, **kwargs)

    return call


class Executor:
    """Runs a learner core's updates on ``device``.

    - :meth:`adam` builds the core's optimiser; :meth:`apply` makes one step of it from a loss
      (backward, the caller's gradient hook, clipping, Adam's step);
    - :meth:`launch` runs an update function with gradients cleared first: eagerly, or where
      ``graphs`` holds (CUDA only) replayed from a CUDA graph per key (:class:`GraphedStep`);
      :meth:`eager` always eagerly;
    - :meth:`compiled` puts a function through torch.compile where ``compile`` is set, and the
      optimiser's step with it;
    - :meth:`fork` runs a forward on one of ``side_streams`` streams (CUDA; in a capture a
      concurrent branch of the graph), :meth:`join` orders the current stream after them;
    - :meth:`mark` after each launch: at most ``max_in_flight`` of them queued on the device.
    """

    def __init__(
        self,
        device: torch.device,
        *,
        compile: bool = False,
        graphs: bool = True,
        side_streams: int = 0,
        max_in_flight: int | None = None,
    ):
        self.device = device
        self.compile = compile
        cuda = device.type == "cuda"
        self.graphs = graphs and cuda
        #: the launches' graphs by key, captured against the current optimiser (a new one forgets them)
        self.captured: dict[Hashable, GraphedStep] = {}
        self._optim: torch.optim.Adam | None = None
        self._adam_args: tuple[float, dict] | None = None
        self._params: list[nn.Parameter] = []
        self._max_grad_norm = 0.0
        self._optimizer_step: Callable[[], None] = self._clipped_step
        self._in_flight = InFlight(max_in_flight, device) if cuda and max_in_flight is not None else None
        self._side_streams: tuple[torch.cuda.Stream, ...] = ()
        self._unjoined: list[torch.cuda.Stream] = []
        if cuda and side_streams:
            with torch.cuda.device(device):
                self._side_streams = tuple(torch.cuda.Stream() for _ in range(side_streams))

    def compiled(self, fn: Callable) -> Callable:
        """``fn`` through :func:`compiled` where compiling, else ``fn`` itself."""
        return compiled(fn, self.device) if self.compile else fn

    def adam(self, params: Iterable[nn.Parameter], lr: float, max_grad_norm: float, **kwargs) -> None:
        """Set up the optimiser :meth:`apply` steps, gradients clipped to ``max_grad_norm``
        first: Adam, fused (one kernel per step), or when compiling multi-tensor, which the
        compiler fuses with the clipping; on CUDA capturable, its learning rate a device tensor
        (:meth:`set_lr`). It is made at its first use (:attr:`optim`): making a torch optimiser
        imports torch._dynamo, seconds that a learner spends after its first parameters are
        published (:meth:`~tianji_dask.roles.learner_core.LearnerCore.prepare`). A new optimiser
        forgets the graphs: a captured step keeps reading the state it was captured with."""
        self._params = list(params)
        self._max_grad_norm = max_grad_norm
        self._adam_args = (lr, kwargs)
        self._optim = None
        self._optimizer_step = self.compiled(self._clipped_step)
        self.captured = {}

    @property
    def optim(self) -> torch.optim.Adam:
        """The optimiser :meth:`adam` set up, made now if it was not yet."""
        if self._optim is None:
            if self._adam_args is None:
                raise RuntimeError("the executor's optimiser is used before adam() set it up")
            lr, kwargs = self._adam_args
            cuda = self.device.type == "cuda"
            fused = not self.compile
            self._optim = torch.optim.Adam(
                self._params,
                lr=torch.tensor(lr, device=self.device) if cuda else lr,
                capturable=cuda,
                fused=fused,
                foreach=not fused,
                **kwargs,
            )
        return self._optim

    def set_lr(self, lr: float) -> None:
        """The learning rate from now on (in place on CUDA, where graphs read it)."""
        for g in self.optim.param_groups:
            if isinstance(g["lr"], torch.Tensor):
                g["lr"].fill_(lr)
            else:
                g["lr"] = lr

    def zero_grad(self) -> None:
        self.optim.zero_grad(set_to_none=True)

    def apply(self, loss: torch.Tensor, grad_hook: Callable[[], None] | None = None) -> None:
        """Backward from ``loss``, ``grad_hook()`` (data-parallel learners average gradients there),
        then the clipped optimiser step; gradients must be cleared before. Never waits for the device."""
        loss.backward()
        if grad_hook is not None:
            grad_hook()
        self._optimizer_step()

    def optimizer_step(self) -> None:
        """The clipped optimiser step alone (compiled where compiling), on gradients already made."""
        self._optimizer_step()

    def _clipped_step(self) -> None:
        nn.utils.clip_grad_norm_(self._params, self._max_grad_norm, foreach=True)
        self.optim.step()

    def launch(
        self, key: Hashable, fn: Callable[[Inputs], torch.Tensor], inputs: Inputs, warmup: int = 2
    ) -> torch.Tensor:
        """``fn(inputs)``, gradients cleared first: replayed from the CUDA graph of ``key`` where
        ``graphs`` holds (``fn`` and ``warmup`` are those of the first launch of ``key``;
        :class:`GraphedStep`), else :meth:`eager`. A graph's result belongs to it: read it before
        the next launch of ``key``."""
        if not self.graphs:
            return self.eager(fn, inputs)
        step = self.captured.get(key)
        if step is None:
            step = self.captured[key] = GraphedStep(fn, self.zero_grad, warmup=warmup, device=self.device)
        return step(inputs)

    def eager(self, fn: Callable[[Inputs], torch.Tensor], inputs: Inputs) -> torch.Tensor:
        """``fn(inputs)`` as it is, gradients cleared first."""
        self.zero_grad()
        return fn(inputs)

    def fork(self, side: int, forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``forward(x)``, on CUDA queued on side stream ``side`` forked from the current stream (in
        a capture: a concurrent branch of the graph); :meth:`join` must follow before its result
        is used. The fork also orders the side stream after whatever the current stream did with
        memory the side stream's allocations may reuse."""
        if not self._side_streams:
            return forward(x)
        stream = self._side_streams[side]
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            out = forward(x)
        self._unjoined.append(stream)
        return out

    def join(self) -> None:
        """Order the current stream after the forks not yet joined: what it queues next (and
        what it frees or reuses) comes after their work."""
        if not self._unjoined:
            return
        main = torch.cuda.current_stream(self.device)
        for stream in self._unjoined:
            main.wait_stream(stream)
        self._unjoined.clear()

    def mark(self) -> None:
        """A launch was queued: on CUDA, wait for the oldest once more than ``max_in_flight`` are."""
        if self._in_flight is not None:
            self._in_flight.mark()


def _cuda_device(device: torch.device | str | None) -> torch.device:
    """``device`` with its index (``cuda`` alone: the current one); None: the current device."""
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"a CUDA graph needs a CUDA device, not {device}")
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


class BatchMover:
    """Moving a learner's batch from numpy (replay memory, rollouts) onto its device.

    On CUDA the batch goes through page-locked (pinned) host buffers, one per field, reused from
    batch to batch, with asynchronous copies; a field that is a tensor already (observations
    gathered on the device by a device replay) is used where it is. Before a batch overwrites the
    buffers, the mover waits for the previous batch's copies (an event recorded after them): the
    learner's update itself need not wait for the device."""

    def __init__(self, device: torch.device):
        self.device = device
        self._pinned: dict[str, torch.Tensor] = {}
        self._copied: torch.cuda.Event | None = None  # recorded after the last batch's copies

    def __call__(self, batch: Mapping[str, np.ndarray | torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.device.type != "cuda":
            return {k: torch.as_tensor(v) for k, v in batch.items()}
        if self._copied is not None:
            self._copied.synchronize()
        out = {}
        for k, v in batch.items():
            if isinstance(v, torch.Tensor):  # gathered on the device already (a device replay)
                out[k] = v.to(self.device, non_blocking=True)
                continue
            src = torch.from_numpy(np.ascontiguousarray(v))
            buf = self._pinned.get(k)
            if buf is None or buf.numel() < src.numel() or buf.dtype != src.dtype:
                # grown with room to spare: a field whose length varies (Atari frames) reuses it
                size = src.numel() + src.numel() // 4
                buf = self._pinned[k] = torch.empty(size, dtype=src.dtype, pin_memory=True)
            staged = buf[: src.numel()].view(src.shape)
            staged.copy_(src)
            out[k] = staged.to(self.device, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        return out
