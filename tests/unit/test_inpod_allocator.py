"""The node proxy's allocator settings: large transient buffers stay on the heap instead of being trimmed each time.

Each case runs in a child interpreter, so this test process keeps glibc's default behaviour. The child frees one
300 KiB block (glibc then serves smaller large blocks from the heap), and then, 50 times, allocates and touches
three 260 KiB blocks (a relayed chunk's read, frames and TLS output) and frees them, noting whether the program
break went down afterwards (the heap returned those pages, to fault them in afresh next time).
"""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

CHILD = textwrap.dedent(
    """
    import ctypes, sys
    from ambit.inpod.allocator import tune_allocator
    libc = ctypes.CDLL("libc.so.6")
    libc.sbrk.restype, libc.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_long]
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    if sys.argv[1] == "tuned":
        assert tune_allocator()
    first = libc.malloc(300 * 1024)
    libc.memset(first, 1, 300 * 1024)
    libc.free(first)
    trimmed = 0
    for _ in range(50):
        blocks = [libc.malloc(260 * 1024) for _ in range(3)]
        for block in blocks:
            libc.memset(block, 1, 260 * 1024)
        peak = libc.sbrk(0)
        for block in reversed(blocks):
            libc.free(block)
        trimmed += libc.sbrk(0) < peak
    print(trimmed)
    """
)


def cycles_trimmed(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True, timeout=60)
    return int(done.stdout)


def test_with_glibc_defaults_the_heap_gives_back_and_refaults_the_relay_buffers_every_cycle() -> None:
    assert cycles_trimmed("default") == 50  # the pathology the settings exist for


def test_once_tuned_the_heap_keeps_and_reuses_them() -> None:
    assert cycles_trimmed("tuned") == 0


def test_tuning_reports_success_and_can_be_repeated() -> None:
    script = "from ambit.inpod.allocator import tune_allocator; print(tune_allocator(), tune_allocator())"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.split() == ["True", "True"]
