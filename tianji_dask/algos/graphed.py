"""A training step replayed as one CUDA graph.

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

from collections import deque
from collections.abc import Callable

import torch

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


def _cuda_device(device: torch.device | str | None) -> torch.device:
    """``device`` with its index (``cuda`` alone: the current one); None: the current device."""
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"a CUDA graph needs a CUDA device, not {device}")
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
