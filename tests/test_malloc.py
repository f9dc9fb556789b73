"""The allocator fit for large messages: after it, a 512 KiB buffer comes from the heap instead
of a fresh mmap (checked with glibc's own counters, in a fresh process started the way Dask
starts workers, with MALLOC_TRIM_THRESHOLD_ set)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tianji_dask.channels import malloc

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")

PROBE = textwrap.dedent("""
    import ctypes, json
    from tianji_dask.channels.malloc import fit_allocator

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2

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
    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    assert r["small"] == 0  # small messages keep Dask's setting
    assert r["before"] == 1  # with Dask's trim threshold, 512 KiB is a fresh mmap
    assert r["threshold"] == 1 << 20
    assert r["after"] == [0] * 5  # served from the heap from then on
    assert r["again"] == 1 << 20


def test_threshold_rounds_up_and_is_capped():
    assert malloc.threshold_for(128 << 10) == 256 << 10
    assert malloc.threshold_for(600_000) == 2 << 20
    assert malloc.threshold_for(4 << 20) == 8 << 20
    assert malloc.threshold_for(64 << 20) == 32 << 20
