"""The allocator fit for large messages: after it, a 512 KiB buffer comes from the heap instead
of a fresh mmap, and the heap a channel's capacity of them took stays mapped once they are freed
(checked with glibc's own counters, in a fresh process started the way Dask starts workers, with
MALLOC_TRIM_THRESHOLD_ set)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tianji_dask.channels import wire

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")

MALLINFO = textwrap.dedent("""
    import ctypes, json, sys
    from tianji_dask.channels.wire import fit_allocator

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
""")


def run_probe(body: str, *args: str) -> dict:
    """What ``body`` (after MALLINFO's set-up) prints as JSON, in a fresh process started with
    Dask's MALLOC_TRIM_THRESHOLD_."""
    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="65536")
    cmd = [sys.executable, "-c", MALLINFO + body, *args]
    return json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)


PROBE = textwrap.dedent("""
    def mmapped_while_held(n):
        before = libc.mallinfo2().hblks
        buf = bytearray(n)
        during = libc.mallinfo2().hblks
        del buf
        return during - before

    n = 512 << 10
    out = {"small": fit_allocator(12_000), "before": mmapped_while_held(n)}
    out["threshold"] = fit_allocator(n)
    out["after"] = [mmapped_while_held(n) for _ in range(5)]
    out["again"] = fit_allocator(n)
    print(json.dumps(out))
""")


def test_large_buffers_leave_mmap_after_fit():
    r = run_probe(PROBE)
    assert r["small"] == 0  # small messages keep Dask's setting
    assert r["before"] == 1  # with Dask's trim threshold, 512 KiB is a fresh mmap
    assert r["threshold"] == 1 << 20
    assert r["after"] == [0] * 5  # served from the heap from then on
    assert r["again"] == 1 << 20


def test_threshold_rounds_up_and_is_capped():
    assert wire.threshold_for(128 << 10) == 256 << 10
    assert wire.threshold_for(600_000) == 2 << 20
    assert wire.threshold_for(4 << 20) == 8 << 20
    assert wire.threshold_for(64 << 20) == 32 << 20


TRIM_PROBE = textwrap.dedent("""
    n, in_flight = 512 << 10, int(sys.argv[1])
    fit_allocator(n, in_flight)
    held = [bytearray(n) for _ in range(48)]  # 24 MiB, as a channel's window fills
    grown = libc.mallinfo2().arena
    del held  # a consumer catching up: all of it free again
    print(json.dumps({"grown": grown, "after": libc.mallinfo2().arena}))
""")


@pytest.mark.parametrize("in_flight", [0, 32 << 20])
def test_freed_heap_of_a_channels_capacity_stays_mapped(in_flight):
    """With the trim threshold of a few buffers (no capacity told), freeing 24 MiB of 512 KiB
    buffers hands the heap back to the system, and the next messages fault it in again; with a
    32 MiB channel's capacity told, it stays."""
    r = run_probe(TRIM_PROBE, str(in_flight))
    assert r["grown"] >= 24 << 20
    if in_flight:
        assert r["after"] == r["grown"]
    else:
        assert r["after"] <= r["grown"] - (8 << 20)


def test_trim_threshold_keeps_what_is_in_flight_within_bounds():
    assert wire.trim_threshold_for(1 << 20, 0) == 8 << 20
    assert wire.trim_threshold_for(1 << 20, 16 << 20) == 24 << 20
    assert wire.trim_threshold_for(32 << 20, 4 << 30) == 512 << 20
