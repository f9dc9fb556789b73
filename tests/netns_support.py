"""Nodes with network stacks of their own for tests (``jobqueue/netns_nodes.py``). Tests that
need them skip where namespaces cannot be made (not root, no ``ip``), and fail instead when
``TIANJI_REQUIRE_NETNS=1`` (CI sets it): a skip there would hide a broken set-up.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jobqueue"))

from netns_nodes import PREFIX, NetnsError, Nodes, address, link_bytes

__all__ = ["PREFIX", "Nodes", "address", "link_bytes", "nodes_up", "require_netns"]


def _unavailable(reason: str):
    if os.environ.get("TIANJI_REQUIRE_NETNS") == "1":
        pytest.fail(f"TIANJI_REQUIRE_NETNS=1 but network namespaces cannot be made here: {reason}", pytrace=False)
    pytest.skip(f"network namespaces cannot be made here: {reason}")


def require_netns() -> None:
    if os.geteuid() != 0:
        _unavailable("not root")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        _unavailable("no ip/tc command")


def nodes_up(count: int, tmp_path: Path, rate: str | None = None) -> Nodes:
    require_netns()
    try:
        return Nodes.up(count, tmp_path, rate)
    except NetnsError as exc:
        _unavailable(str(exc))
        raise
