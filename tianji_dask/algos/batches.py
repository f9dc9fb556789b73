"""Moving a learner's batch from numpy (replay memory, rollouts) onto its device.

On CUDA the batch goes through page-locked (pinned) host buffers, one per field, with
asynchronous copies. The buffers come in ``sets`` that are used in turn, and the copies out of
a set are marked with a CUDA event: a set is refilled only once its last copies have finished.
So no update has to wait for the GPU for the buffers' sake, and with two sets the CPU prepares
the next batch while the GPU still trains on the last one.
"""

from __future__ import annotations

import numpy as np
import torch


class BatchMover:
    def __init__(self, device: torch.device, sets: int = 2):
        if sets < 1:
            raise ValueError(f"BatchMover(sets={sets}): needs at least one set of buffers")
        self.device = device
        self._pinned: list[dict[str, torch.Tensor]] = [{} for _ in range(sets)]
        self._copied: list[torch.cuda.Event | None] = [None] * sets
        self._turn = 0

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        if self.device.type != "cuda":
            return {k: torch.as_tensor(v) for k, v in batch.items()}
        i = self._turn
        self._turn = (i + 1) % len(self._pinned)
        if self._copied[i] is not None:
            self._copied[i].synchronize()  # this set's previous copies have left it
        pinned = self._pinned[i]
        out = {}
        for k, v in batch.items():
            src = torch.from_numpy(np.ascontiguousarray(v))
            buf = pinned.get(k)
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                buf = pinned[k] = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
            buf.copy_(src)
            out[k] = buf.to(self.device, non_blocking=True)
        event = self._copied[i] or torch.cuda.Event()
        event.record()  # on the current stream, after the copies
        self._copied[i] = event
        return out
