"""Moving a learner's batch from numpy (replay memory, rollouts) onto its device.

On CUDA the batch goes through page-locked (pinned) host buffers, one per field, reused from
batch to batch, with asynchronous copies; a field that is a tensor already (observations
gathered on the device by a device replay) is used where it is. Before a batch overwrites the
buffers, the mover waits for the previous batch's copies (an event recorded after them): the
learner's update itself need not wait for the device.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch


class BatchMover:
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
