"""Files replaced only by complete ones: written under a temporary name beside their path, then
renamed over it (a rename within one directory is atomic), so a reader or a crash never meets
half a file."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_write(path: str | os.PathLike, *, suffix: str = ".tmp", fsync: bool = False) -> Iterator[Path]:
    """A fresh name beside ``path`` (``.<name>.<12 hex digits><suffix>``) for the block to write
    to; when the block ends without an error that file is renamed over ``path`` (flushed to disk
    first with ``fsync``), and when it raises, the file is removed and ``path`` left as it was.

    The block creates the file itself: mkstemp's 0600 mode would stick to the result, a unique
    name leaves the default mode. ``suffix`` keeps an extension a writer picks its format by."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}{suffix}")
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
