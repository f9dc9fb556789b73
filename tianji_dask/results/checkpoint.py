"""Checkpoints: plain tensors plus JSON metadata with a format version, no pickled classes.

A checkpoint is a directory holding ``tensors.pt`` (``torch.save`` of
``{component: {name: cpu_tensor}}``, loaded back with ``weights_only=True``) and
``checkpoint.json`` (``format_version``, ``created``, versions, plus the caller's metadata,
e.g. counters and the config). A save is built in a temporary sibling directory and renamed into
place, so a crash mid-save leaves the previous checkpoint as it was.

A learner sends its state to the driver packed (:func:`pack_state`: the bytes of ``tensors.pt``),
so the driver of a distributed run writes checkpoints, and hands snapshots to re-created
learners, without importing torch.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from tianji_dask.errors import CheckpointError
from tianji_dask.results.atomic import atomic_write
from tianji_dask.results.provenance import package_version

if TYPE_CHECKING:
    import torch

FORMAT_VERSION = 1
TENSORS_FILE = "tensors.pt"
METADATA_FILE = "checkpoint.json"
_RESERVED = ("format_version", "created", "tianji_dask_version", "torch_version")


def pack_state(state: dict[str, dict[str, torch.Tensor]]) -> bytes:
    """``state`` (component -> name -> tensor) as the bytes of ``tensors.pt``: detached, on CPU."""
    import torch

    buffer = io.BytesIO()
    torch.save(_plain_state(state), buffer)
    return buffer.getvalue()


def unpack_state(packed: bytes) -> dict[str, dict[str, torch.Tensor]]:
    """What :func:`pack_state` packed, on CPU."""
    import torch

    return torch.load(io.BytesIO(packed), map_location="cpu", weights_only=True)


def save_checkpoint(directory: Path, state: dict[str, dict[str, torch.Tensor]] | bytes, metadata: dict) -> Path:
    """Write ``state`` (component -> name -> tensor, or :func:`pack_state`'s bytes of it) and
    ``metadata`` into ``directory``.

    Tensors are detached and copied to CPU. ``metadata`` must be JSON-serializable and must not
    use the reserved keys ``format_version``, ``created``, ``tianji_dask_version``,
    ``torch_version``. An existing checkpoint in ``directory`` is replaced only once the new one
    is complete. Not safe for two concurrent saves to the same directory. Returns ``directory``.
    """
    directory = Path(directory)
    packed = state if isinstance(state, bytes) else pack_state(state)
    clash = [k for k in _RESERVED if k in metadata]
    if clash:
        raise ValueError(f"checkpoint metadata may not set the reserved keys {clash}; rename them")
    meta = {
        "format_version": FORMAT_VERSION,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "tianji_dask_version": package_version("tianji-dask"),
        "torch_version": package_version("torch"),
        **metadata,
    }
    try:
        meta_text = json.dumps(meta, indent=2, allow_nan=True) + "\n"
    except (TypeError, ValueError) as e:
        raise TypeError(f"checkpoint metadata must be JSON-serializable: {e}") from e

    parent = directory.parent
    parent.mkdir(parents=True, exist_ok=True)
    _recover(directory)
    # Not mkdtemp: its 0700 mode would stick to the checkpoint; a unique name with default mode.
    tmp = parent / f".{directory.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        _write_file(tmp / TENSORS_FILE, lambda f: f.write(packed))
        _write_file(tmp / METADATA_FILE, lambda f: f.write(meta_text.encode()))
        _fsync_dir(tmp)
        if directory.exists():
            # Two renames: the old checkpoint stays whole under .old-* until the new one is in place.
            old = parent / f".{directory.name}.old-{uuid.uuid4().hex[:12]}"
            os.replace(directory, old)
            os.replace(tmp, directory)
            _fsync_dir(parent)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, directory)
            _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def load_checkpoint(directory: Path) -> tuple[dict[str, dict[str, torch.Tensor]], dict]:
    """Read a checkpoint written by :func:`save_checkpoint`: ``(state, metadata)``.

    Tensors load on CPU with ``weights_only=True``. Raises :class:`CheckpointError` when the
    directory or a file is missing, unreadable, or of another ``format_version``.
    """
    directory = Path(directory)
    if not directory.is_dir():
        left = sorted(directory.parent.glob(f".{directory.name}.old-*")) if directory.parent.is_dir() else []
        hint = (
            f"; an interrupted save left the previous checkpoint in {left[-1]}: rename it to {directory} to use it"
            if left
            else ""
        )
        raise CheckpointError(f"no checkpoint directory at {directory}{hint}")
    meta_path, tensors_path = directory / METADATA_FILE, directory / TENSORS_FILE
    for p in (meta_path, tensors_path):
        if not p.is_file():
            raise CheckpointError(f"incomplete checkpoint in {directory}: {p.name} is missing")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {meta_path}: {e}") from e
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if version != FORMAT_VERSION:
        by = meta.get("tianji_dask_version", "an unknown version") if isinstance(meta, dict) else "?"
        raise CheckpointError(
            f"checkpoint {directory} has format_version {version!r} (written by tianji_dask {by}); "
            f"this tianji_dask {package_version('tianji-dask')} reads format_version {FORMAT_VERSION}. "
            "Load it with the tianji_dask version that wrote it."
        )
    import torch

    try:
        state = torch.load(tensors_path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError... on bad files
        raise CheckpointError(f"cannot load tensors from {tensors_path}: {e}") from e
    if not (
        isinstance(state, dict)
        and all(isinstance(c, dict) and all(isinstance(t, torch.Tensor) for t in c.values()) for c in state.values())
    ):
        raise CheckpointError(f"{tensors_path} does not hold {{component: {{name: tensor}}}}")
    return state, meta


def load_run_checkpoint(
    run_dir: Path, algo: str, env_id: str, name: str = "checkpoint"
) -> tuple[dict[str, dict[str, torch.Tensor]], dict]:
    """The learner checkpoint in ``run_dir/name`` (:func:`load_checkpoint`), which must be
    of ``algo`` on ``env_id`` (the run's config): :class:`CheckpointError` otherwise."""
    state, meta = load_checkpoint(Path(run_dir) / name)
    if (meta.get("algo"), meta.get("env_id")) != (algo, env_id):
        raise CheckpointError(
            f"its checkpoint is of {meta.get('algo')} on {meta.get('env_id')}, the config of {algo} on {env_id}; "
            "the directory holds files of two runs"
        )
    return state, meta


def _plain_state(state: dict) -> dict[str, dict[str, torch.Tensor]]:
    import torch

    if not isinstance(state, dict):
        raise TypeError(f"checkpoint state must be a dict of dicts of tensors, got {type(state).__name__}")
    out: dict[str, dict[str, torch.Tensor]] = {}
    for comp, tensors in state.items():
        if not isinstance(comp, str) or not isinstance(tensors, dict):
            raise TypeError(
                f"checkpoint state[{comp!r}] must be a dict of tensors keyed by str, got {type(tensors).__name__}"
            )
        out[comp] = {}
        for name, t in tensors.items():
            if not isinstance(name, str) or not isinstance(t, torch.Tensor):
                raise TypeError(
                    f"checkpoint state[{comp!r}][{name!r}] must be a torch.Tensor keyed "
                    f"by str, got {type(t).__name__}; put non-tensor values in metadata"
                )
            out[comp][name] = t.detach().cpu()
    return out


def _recover(directory: Path) -> None:
    """Tidy leftovers of an interrupted save before a new one (ours, by name only)."""
    parent = directory.parent
    olds = sorted(parent.glob(f".{directory.name}.old-*"))
    if olds and not directory.exists():
        os.replace(olds.pop(), directory)  # crashed between the two renames: put the old one back
    for p in [*olds, *parent.glob(f".{directory.name}.tmp-*")]:
        shutil.rmtree(p, ignore_errors=True)


def _write_file(path: Path, write) -> None:
    with atomic_write(path, fsync=True) as tmp, open(tmp, "wb") as f:
        write(f)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not supported on some platforms/filesystems
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
