"""Replay of image transitions that stores every frame once.

A DQN transition on Atari is ``(4-frame stack, action, n-step return, 4-frame stack, discount)``;
stored as it is, that is 2 x 4 x 84 x 84 = 56 KB, eight copies of each frame. Here frames travel
and are stored once, and stacks are rebuilt at sample time:

* **Actor side** (:class:`FrameStreams`): every env of every actor is a *stream* of frames with
  consecutive sequence numbers. A step emits the newest frame of each env's stack (one frame);
  the first stack of an episode is emitted whole (4 frames, whatever the env padded it with), so
  a stack is always the 4 frames with the ids ``ids[e]`` and never crosses an episode boundary.
  The actor's n-step window then works on stacks of frame *ids* instead of pixels, and a chunk
  carries ``frames``/``frame_ids`` (each new frame once) plus ``obs``/``next_obs`` as ``(n, 4)``
  int64 ids, ``actions``, ``rewards`` (n-step returns) and ``discounts`` as before.
* **Buffer side** (:class:`FrameReplay`): a ring of single 84x84 frames and a ring of transitions
  that hold the ring positions of their 4 + 4 frames. Ids are resolved to positions when a chunk
  is added: against the chunk's own frames first, then against the last :data:`WINDOW` frames of
  each stream seen earlier. A transition whose frames cannot be found (a chunk dropped by
  ``full_policy: drop_oldest``) is skipped and counted in ``unresolved``.

The frame ring holds ``capacity + capacity // 64 + 1024`` frames: an episode costs 4 frames more
than its transitions (its first stack), so with the slack the oldest transitions keep their
frames for any episode longer than about 256 steps. Should a transition's oldest frame be
overwritten anyway, sampling skips it (its ``oldest`` frame count is checked). Memory is
``frames x 7,056 B + transitions x 56 B`` (:meth:`FrameReplay.nbytes_for`): about 7.2 KB per
transition, 7.2 GB for a million.

With ``device`` (a torch device, the learner's), the frame ring is a tensor there: each chunk's
new frames are copied to it once, and a sample's stacks are gathered there by index, so a batch's
observations never exist on the host. The bookkeeping (ids, positions, actions, returns) stays
in numpy, a few bytes per transition; ``get`` and ``sample`` return ``obs``/``next_obs`` as
tensors on the device, which the learner's batch mover passes through. The transitions' ring
positions, actions, returns and discounts are also mirrored there (:class:`_DeviceTransitions`),
so that :meth:`FrameReplay.sample_on_device` draws a whole batch with device operations only:
no host work and no wait for the device, which lets a learner replay sampling and update as one
CUDA graph.

``state()``/``restore()`` (:mod:`tianji_dask.roles.replay_state`) copy two rings out and back:
the filled frames (from the device, where they live there) and the filled transitions, or only
those written since an earlier state. The per-stream windows are not part of it: a restored
replay is fed by actors created with it, whose streams begin again with a whole first stack.
"""

from __future__ import annotations

import uuid

import numpy as np

from tianji_dask.envs import ATARI_FRAME_STACK, ATARI_SCREEN
from tianji_dask.roles.replay_state import ReplayMark, ReplayState, mark_for, put_ring, take_arrays, take_ring

#: Bits of a frame id that count frames within one stream; the bits above name the stream.
SEQ_BITS = 40
SEQ_MASK = (1 << SEQ_BITS) - 1
#: Envs per actor that stream ids can tell apart (actor ids up to 2**11 - 1).
MAX_ENVS = 1 << 12
MAX_ACTORS = 1 << 11
#: Frames per stream the buffer remembers across chunks. A transition refers to frames at most
#: 5 * (n_step + 4) frames older than its stream's newest one (a step emits at most 5 frames:
#: the final frame of an episode plus the 4 of the next one's first stack), 120 for n_step <= 20.
WINDOW = 256
#: Bytes per transition besides its frames: 8 int32 ring positions, the oldest frame's count
#: (int64), the action (int64), return and discount (float32).
TRANSITION_BYTES = 8 * 4 + 8 + 8 + 4 + 4


class FrameStreams:
    """The actor side: frame ids for ``num_envs`` envs of actor ``actor_id``.

    ``start(obs)`` once with the first observations; then per vector step
    ``real_next = step(next_obs, dones, infos)`` returns the id stacks of the true next
    observations (``final_obs`` where an episode ended) and moves ``ids`` on to the stacks of
    ``next_obs``. ``take()`` hands out the frames emitted since the previous call. Where only
    some envs stepped, ``envs`` names the envs the arrays' rows are; ``restart(envs, stacks)``
    emits those envs' stacks whole again (a rollout that starts needs no earlier frame).
    """

    def __init__(self, actor_id: int, num_envs: int, stack: int = 4):
        if not 0 <= actor_id < MAX_ACTORS or not 1 <= num_envs <= MAX_ENVS:
            raise ValueError(
                f"frame streams support actor ids < {MAX_ACTORS} and up to {MAX_ENVS} "
                f"envs per actor, got actor {actor_id} with {num_envs} envs"
            )
        self.num_envs, self.stack = num_envs, stack
        self._base = (np.int64(actor_id) * MAX_ENVS + np.arange(num_envs, dtype=np.int64)) << SEQ_BITS
        self._next_seq = np.zeros(num_envs, np.int64)
        self.ids = np.zeros((num_envs, stack), np.int64)  # ids of the current stacks
        self._frames: list[np.ndarray] = []
        self._frame_ids: list[np.ndarray] = []
        self.emitted = 0

    def _emit(self, envs: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """Emit ``frames[j]`` for env ``envs[j]`` (several frames of one env in order); their ids."""
        if len(np.unique(envs)) == len(envs):  # one frame per env: the usual step
            ids = self._base[envs] + self._next_seq[envs]
            self._next_seq[envs] += 1
        else:
            ids = np.empty(len(envs), np.int64)
            for e in np.unique(envs):  # per env, consecutive sequence numbers in order
                sel = np.flatnonzero(envs == e)
                ids[sel] = self._base[e] + self._next_seq[e] + np.arange(len(sel))
                self._next_seq[e] += len(sel)
        self._frames.append(np.array(frames, dtype=np.uint8, copy=True))
        self._frame_ids.append(ids)
        self.emitted += len(ids)
        return ids

    def _begin_episode(self, envs: np.ndarray, stacks: np.ndarray) -> None:
        """The first stack of an episode: all of its frames are new."""
        k = self.stack
        ids = self._emit(np.repeat(envs, k), stacks.reshape(len(envs) * k, *stacks.shape[2:]))
        self.ids[envs] = ids.reshape(len(envs), k)

    def start(self, obs: np.ndarray) -> None:
        self._begin_episode(np.arange(self.num_envs), obs)

    def restart(self, envs: np.ndarray, stacks: np.ndarray) -> None:
        self._begin_episode(np.asarray(envs), stacks)

    def step(self, next_obs: np.ndarray, dones: np.ndarray, infos: dict, envs: np.ndarray | None = None) -> np.ndarray:
        rows = np.arange(self.num_envs) if envs is None else np.asarray(envs)
        real_next = np.empty((len(rows), self.stack), np.int64)
        real_next[:, :-1] = self.ids[rows, 1:]
        going = np.flatnonzero(~dones)
        ended = np.flatnonzero(dones)
        if len(ended):
            last = np.stack([np.asarray(infos["final_obs"][e])[-1] for e in ended])
            newest = np.concatenate([next_obs[going, -1], last])
            ids = self._emit(rows[np.concatenate([going, ended])], newest)
        else:
            ids = self._emit(rows[going], next_obs[:, -1])
        real_next[np.concatenate([going, ended]), -1] = ids
        self.ids = self.ids.copy()  # a new array: callers keep the stacks they read before the step
        self.ids[rows] = real_next
        if len(ended):
            self._begin_episode(rows[ended], next_obs[ended])
        return real_next

    def env_of(self, ids: np.ndarray) -> np.ndarray:
        """The env of each frame id of this actor's streams."""
        return (ids >> SEQ_BITS) - (self._base[0] >> SEQ_BITS)

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        """``(frames (F, H, W) uint8, frame_ids (F,) int64)`` emitted since the last call."""
        if not self._frames:
            return np.zeros((0, 0, 0), np.uint8), np.zeros(0, np.int64)
        frames = np.concatenate(self._frames) if len(self._frames) > 1 else self._frames[0]
        ids = np.concatenate(self._frame_ids) if len(self._frame_ids) > 1 else self._frame_ids[0]
        self._frames, self._frame_ids = [], []
        return frames, ids

    @property
    def pending(self) -> int:
        return sum(len(i) for i in self._frame_ids)


class FrameReplay:
    """Uniform replay of frame-stack transitions, each frame stored once (see the module doc).

    Same protocol as :class:`~tianji_dask.roles.buffer.ReplayMemory`: ``add(chunk)`` with the keys
    ``frames, frame_ids, obs, next_obs, actions, rewards, discounts`` (``obs``/``next_obs`` as
    ``(n, stack)`` frame ids); ``sample(n, rng)`` returns ``obs``/``next_obs`` as uint8
    ``(n, stack, H, W)`` stacks plus ``actions, rewards, discounts``. Not thread-safe.
    """

    def __init__(
        self,
        capacity: int,
        frame_shape: tuple[int, int] = (ATARI_SCREEN, ATARI_SCREEN),
        stack: int = ATARI_FRAME_STACK,
        frame_capacity: int | None = None,
        device: str | None = None,
    ):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.stack = stack
        self.frame_shape = tuple(frame_shape)
        self.frame_capacity = int(frame_capacity or self.default_frame_capacity(capacity))
        if self.frame_capacity < 2 * stack:
            raise ValueError(f"frame_capacity must be >= {2 * stack}, got {self.frame_capacity}")
        self.device = device
        self._frames = _frame_ring((self.frame_capacity, *self.frame_shape), device)
        self._mirror = None if device is None else _DeviceTransitions(capacity, stack, device)
        self._obs = np.zeros((capacity, stack), np.int32)  # ring positions of the frames
        self._next = np.zeros((capacity, stack), np.int32)
        self._oldest = np.zeros(capacity, np.int64)  # count of the oldest frame referred to
        self._actions = np.zeros(capacity, np.int64)
        self._rewards = np.zeros(capacity, np.float32)
        self._discounts = np.zeros(capacity, np.float32)
        # per stream: the last WINDOW frames' sequence numbers and frame counts, by seq % WINDOW
        self._rows: dict[int, int] = {}
        self._win_seq = np.full((0, WINDOW), -1, np.int64)
        self._win_count = np.zeros((0, WINDOW), np.int64)
        self._pos = 0
        self._size = 0
        self.frames_written = 0
        self.written = 0  # transitions written into the ring: the next goes to written % capacity
        self.added = 0
        self.unresolved = 0  # transitions skipped: a frame they need never arrived
        self.token = uuid.uuid4().hex  # names these contents for state(since=...)

    @staticmethod
    def default_frame_capacity(capacity: int) -> int:
        return capacity + capacity // 64 + 1024

    @classmethod
    def nbytes_for(cls, capacity: int, frame_shape: tuple[int, int] = (ATARI_SCREEN, ATARI_SCREEN)) -> int:
        """Bytes of a replay of ``capacity`` transitions (without the per-stream windows)."""
        return cls.default_frame_capacity(capacity) * int(np.prod(frame_shape)) + capacity * TRANSITION_BYTES

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        arrays = (self._obs, self._next, self._oldest, self._actions, self._rewards, self._discounts)
        mirror = 0 if self._mirror is None else self._mirror.nbytes
        return sum(a.nbytes for a in arrays) + self._frames.nbytes + mirror

    # --- adding ---------------------------------------------------------------------------
    def _stream_rows(self, streams: np.ndarray, create: bool) -> np.ndarray:
        uniq, inverse = np.unique(streams, return_inverse=True)
        rows = np.empty(len(uniq), np.int64)
        for j, s in enumerate(uniq.tolist()):
            row = self._rows.get(s)
            if row is None:
                if not create:
                    row = -1
                else:
                    row = self._rows[s] = len(self._rows)
                    if row >= len(self._win_seq):
                        grow = max(8, len(self._win_seq))
                        self._win_seq = np.concatenate([self._win_seq, np.full((grow, WINDOW), -1, np.int64)])
                        self._win_count = np.concatenate([self._win_count, np.zeros((grow, WINDOW), np.int64)])
            rows[j] = row
        return rows[inverse].reshape(streams.shape)

    def _resolve(
        self, ids: np.ndarray, local_ids: np.ndarray, local_order: np.ndarray, local_counts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Frame counts of ``ids`` and whether each was found (this chunk's frames first)."""
        counts = np.zeros(ids.shape, np.int64)
        found = np.zeros(ids.shape, bool)
        if len(local_ids):
            k = np.searchsorted(local_ids, ids, sorter=local_order).clip(max=len(local_ids) - 1)
            hit = local_ids[local_order[k]] == ids
            counts[hit] = local_counts[local_order[k[hit]]]
            found |= hit
        rest = ~found
        if rest.any() and len(self._rows):
            rid = ids[rest]
            rows = self._stream_rows(rid >> SEQ_BITS, create=False)
            seq = rid & SEQ_MASK
            slot = seq % WINDOW
            ok = rows >= 0
            hit = np.zeros(len(rid), bool)
            hit[ok] = self._win_seq[rows[ok], slot[ok]] == seq[ok]
            c = np.zeros(len(rid), np.int64)
            c[hit] = self._win_count[rows[hit], slot[hit]]
            counts[rest] = c
            found[rest] = hit
        return counts, found

    def _register(self, ids: np.ndarray, counts: np.ndarray) -> None:
        """Remember the newest WINDOW frames of each stream in this chunk."""
        rows = self._stream_rows(ids >> SEQ_BITS, create=True)
        seq = ids & SEQ_MASK
        newest = np.full(len(self._rows), -1, np.int64)
        np.maximum.at(newest, rows, seq)
        keep = seq > newest[rows] - WINDOW  # distinct seqs of a stream within WINDOW: distinct slots
        rows, seq, counts = rows[keep], seq[keep], counts[keep]
        self._win_seq[rows, seq % WINDOW] = seq
        self._win_count[rows, seq % WINDOW] = counts

    def add(self, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Store ``batch``; returns the ring indices written and the batch rows they hold
        (transitions whose frames never arrived are skipped)."""
        frames = batch.get("frames")
        fids = batch.get("frame_ids")
        if frames is None or fids is None:
            frames, fids = np.zeros((0, *self.frame_shape), np.uint8), np.zeros(0, np.int64)
        fids = np.asarray(fids, np.int64)
        if len(fids) > self.frame_capacity:  # only the newest frames can be kept
            frames, fids = frames[-self.frame_capacity :], fids[-self.frame_capacity :]
        counts = self.frames_written + np.arange(len(fids), dtype=np.int64)
        order = np.argsort(fids, kind="stable")
        obs_c, obs_ok = self._resolve(np.asarray(batch["obs"], np.int64), fids, order, counts)
        nxt_c, nxt_ok = self._resolve(np.asarray(batch["next_obs"], np.int64), fids, order, counts)
        if len(fids):
            self._frames.write(counts % self.frame_capacity, frames)
            self.frames_written += len(fids)
            self._register(fids, counts)

        n = len(batch["actions"])
        self.added += n
        ok = obs_ok.all(axis=1) & nxt_ok.all(axis=1)
        oldest = np.minimum(
            obs_c.min(axis=1, initial=np.iinfo(np.int64).max), nxt_c.min(axis=1, initial=np.iinfo(np.int64).max)
        )
        ok &= oldest >= self.frames_written - self.frame_capacity
        keep = np.flatnonzero(ok)
        self.unresolved += n - len(keep)
        keep = keep[-self.capacity :]
        m = len(keep)
        if m == 0:
            return keep, keep
        idx = (self._pos + np.arange(m)) % self.capacity
        fc = self.frame_capacity
        self._obs[idx] = obs_c[keep] % fc
        self._next[idx] = nxt_c[keep] % fc
        self._oldest[idx] = oldest[keep]
        self._actions[idx] = batch["actions"][keep]
        self._rewards[idx] = batch["rewards"][keep]
        self._discounts[idx] = batch["discounts"][keep]
        self._pos = int((self._pos + m) % self.capacity)
        self._size = min(self._size + m, self.capacity)
        self.written += m
        if self._mirror is not None:
            self._mirror.write(idx, self, newest=(self._pos - 1) % self.capacity)
        return idx, keep

    # --- state ----------------------------------------------------------------------------
    def _transition_arrays(self) -> dict[str, np.ndarray]:
        return {
            "obs": self._obs,
            "next_obs": self._next,
            "oldest": self._oldest,
            "actions": self._actions,
            "rewards": self._rewards,
            "discounts": self._discounts,
        }

    def filled_nbytes(self) -> int:
        """Bytes of the filled part: what a full :meth:`state` copies."""
        frames = min(self.frames_written, self.frame_capacity) * int(np.prod(self.frame_shape))
        return frames + self._size * TRANSITION_BYTES

    def state(self, since: ReplayMark | None = None, extra: dict[str, np.ndarray] | None = None) -> ReplayState:
        """The filled frames and transitions, write positions and counters (only those written
        after ``since``, a mark of an earlier state of this memory); ``extra``: more arrays
        indexed by transition ring row (a wrapper's)."""

        def frames(rows: np.ndarray) -> dict[str, np.ndarray]:
            got = self._frames.gather(rows)
            return {"frames": got if isinstance(got, np.ndarray) else got.cpu().numpy()}

        fc = self.frame_capacity
        rings = {
            "frames": take_ring(frames, fc, self.frames_written, mark_for(self.token, since, "frames")),
            "transitions": take_arrays(
                {**self._transition_arrays(), **(extra or {})},
                self.capacity,
                self.written,
                mark_for(self.token, since, "transitions"),
            ),
        }
        values = {"added": self.added, "unresolved": self.unresolved}
        return ReplayState("frames", self.token, rings, values)

    def restore(self, state: ReplayState, extra: dict[str, np.ndarray] | None = None) -> None:
        """Hold exactly the frames and transitions of ``state`` (a full one); the per-stream
        windows start empty (see the module doc). ``extra`` as in :meth:`state`."""
        if state.kind != "frames":
            raise ValueError(f"a {state.kind!r} replay state cannot restore a frame replay")
        frames, trans = state.rings["frames"], state.rings["transitions"]
        shape = frames.arrays["frames"].shape[1:]
        if tuple(shape) != self.frame_shape:
            raise ValueError(f"replay state frames of {tuple(shape)} restored into a replay of {self.frame_shape}")
        arrays = {**self._transition_arrays(), **(extra or {})}
        if set(trans.arrays) != set(arrays):
            raise ValueError(f"replay state fields {sorted(trans.arrays)} differ from the replay's {sorted(arrays)}")
        put_ring(frames, lambda rows, values: self._frames.write(rows, values["frames"]), self.frame_capacity)

        def put(rows: np.ndarray, values: dict[str, np.ndarray]) -> None:
            for k, a in arrays.items():
                a[rows] = values[k]

        put_ring(trans, put, self.capacity)
        self.frames_written, self.written = frames.total, trans.total
        self._pos, self._size = trans.total % self.capacity, trans.rows
        self.added, self.unresolved = int(state.values["added"]), int(state.values["unresolved"])
        self._rows = {}
        self._win_seq = np.full((0, WINDOW), -1, np.int64)
        self._win_count = np.zeros((0, WINDOW), np.int64)
        self.token = state.token
        if self._mirror is not None and self._size:
            self._mirror.write(np.arange(self._size), self, newest=(self._pos - 1) % self.capacity)

    # --- reading --------------------------------------------------------------------------
    def valid(self, idx: np.ndarray) -> np.ndarray:
        """Whether the transitions at ``idx`` still have all their frames."""
        return self._oldest[idx] >= self.frames_written - self.frame_capacity

    def get(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """The transitions at ring indices ``idx`` (0 .. len-1), stacks rebuilt from frames."""
        idx = np.asarray(idx)
        n, k = len(idx), self.stack
        return {
            "obs": self._frames.gather(self._obs[idx].reshape(-1)).reshape(n, k, *self.frame_shape),
            "next_obs": self._frames.gather(self._next[idx].reshape(-1)).reshape(n, k, *self.frame_shape),
            "actions": self._actions[idx],
            "rewards": self._rewards[idx],
            "discounts": self._discounts[idx],
        }

    def sample(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay memory")
        idx = rng.integers(0, self._size, size=n)
        bad = ~self.valid(idx)
        tries = 0
        while bad.any():  # only the oldest few transitions can have lost a frame
            tries += 1
            if tries > 64:
                raise RuntimeError(
                    "replay memory: no transition with all its frames found; "
                    "the frame ring is too small for these episodes"
                )
            idx[bad] = rng.integers(0, self._size, size=int(bad.sum()))
            bad = ~self.valid(idx)
        return self.get(idx)

    def sample_on_device(self, n: int) -> dict:
        """``n`` uniformly drawn transitions as tensors on the replay's device (``obs``,
        ``next_obs``, ``actions``, ``rewards``, ``discounts``, and their ring ``indices``), drawn
        by device operations only, with torch's generator of that device: nothing waits for the
        device, so the draw can be part of a CUDA graph. A draw whose oldest frame was overwritten is drawn again, up to
        :data:`DEVICE_REDRAWS` times, then replaced by the newest transition (the invalid ones
        are the oldest few, a tiny fraction of the ring). Needs ``device`` and a non-empty replay."""
        if self._mirror is None:
            raise ValueError("sample_on_device needs a replay built with a device")
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay memory")
        assert isinstance(self._frames, _DeviceFrames)
        return self._mirror.sample(n, self._frames.tensor, self.frame_shape)


#: Times :meth:`FrameReplay.sample_on_device` draws again for a transition that lost a frame.
DEVICE_REDRAWS = 3


class _DeviceTransitions:
    """The transition ring's fields on a torch device, plus device scalars of the replay's size,
    its newest transition and the oldest frame count still stored, which a captured CUDA graph
    reads at replay time. Written by :meth:`FrameReplay.add`, in the device's stream order."""

    def __init__(self, capacity: int, stack: int, device: str):
        import torch

        self.torch = torch
        dev = self.device = torch.device(device)
        self.positions = torch.zeros((capacity, 2 * stack), dtype=torch.int64, device=dev)  # obs, next
        self.oldest = torch.zeros(capacity, dtype=torch.int64, device=dev)
        self.actions = torch.zeros(capacity, dtype=torch.int64, device=dev)
        self.rewards = torch.zeros(capacity, dtype=torch.float32, device=dev)
        self.discounts = torch.zeros(capacity, dtype=torch.float32, device=dev)
        # size, newest index, oldest frame count kept: one tensor, written by one copy
        self.scalars = torch.zeros(3, dtype=torch.int64, device=dev)
        self.stack = stack
        fields = (self.positions, self.oldest, self.actions, self.rewards, self.discounts, self.scalars)
        self.nbytes = sum(f.numel() * f.element_size() for f in fields)

    def write(self, idx: np.ndarray, replay: FrameReplay, newest: int) -> None:
        rows = to_device(idx.astype(np.int64), self.device)
        self.positions[rows] = to_device(
            np.concatenate([replay._obs[idx], replay._next[idx]], axis=1), self.device
        ).long()
        self.oldest[rows] = to_device(replay._oldest[idx], self.device)
        self.actions[rows] = to_device(replay._actions[idx], self.device)
        self.rewards[rows] = to_device(replay._rewards[idx], self.device)
        self.discounts[rows] = to_device(replay._discounts[idx], self.device)
        kept = replay.frames_written - replay.frame_capacity
        self.scalars.copy_(to_device(np.array([len(replay), newest, kept], np.int64), self.device))

    def sample(self, n: int, frames, frame_shape: tuple[int, ...]) -> dict:
        t = self.torch
        size, newest, kept = self.scalars[0], self.scalars[1], self.scalars[2]

        # every draw at once (few kernels in a graph): the first of each column's draws that kept
        # its frames; float64: uniform ints below size (up to 2**53) with no visible bias
        draws = (t.rand((DEVICE_REDRAWS + 1, n), dtype=t.float64, device=self.device) * size).long()
        draws = draws.clamp_(max=size - 1)
        valid = self.oldest[draws] >= kept
        first = valid.byte().argmax(dim=0, keepdim=True)
        idx = t.where(valid.any(dim=0), draws.gather(0, first).squeeze(0), newest)
        k = self.stack
        positions = self.positions[idx]
        return {
            # gathered apart: each half contiguous, as a compiled learner was compiled for
            "obs": frames[positions[:, :k]].view(n, k, *frame_shape),
            "next_obs": frames[positions[:, k:]].view(n, k, *frame_shape),
            "actions": self.actions[idx],
            "rewards": self.rewards[idx],
            "discounts": self.discounts[idx],
            "indices": idx,
        }


class _HostFrames:
    """The frame ring as a numpy array."""

    def __init__(self, shape: tuple[int, ...]):
        self.array = np.zeros(shape, np.uint8)
        self.nbytes = self.array.nbytes

    def write(self, positions: np.ndarray, frames: np.ndarray) -> None:
        self.array[positions] = frames

    def gather(self, positions: np.ndarray) -> np.ndarray:
        return self.array[positions]


class _DeviceFrames:
    """The frame ring as a uint8 tensor on a torch device: frames go there once, stacks are
    gathered there."""

    def __init__(self, shape: tuple[int, ...], device: str):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.tensor = torch.zeros(shape, dtype=torch.uint8, device=self.device)
        self.nbytes = self.tensor.numel()

    def write(self, positions: np.ndarray, frames: np.ndarray) -> None:
        self.tensor[to_device(positions, self.device)] = to_device(frames, self.device)

    def gather(self, positions: np.ndarray):
        return self.tensor[to_device(positions, self.device)]


def _frame_ring(shape: tuple[int, ...], device: str | None) -> _HostFrames | _DeviceFrames:
    return _HostFrames(shape) if device is None else _DeviceFrames(shape, device)


def to_device(array: np.ndarray, device):
    """``array`` as a tensor on the torch ``device``. To CUDA through page-locked memory from
    torch's caching host allocator, asynchronously: unlike a copy from pageable memory it does
    not wait for the work queued on the device (the allocator keeps the staging block until the
    copy is done)."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(array))
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
