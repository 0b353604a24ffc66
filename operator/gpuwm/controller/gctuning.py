"""Garbage-collector settings for the controller process (issue 4: CPU per status cycle)."""

from __future__ import annotations

import ctypes
import functools
import gc
from collections.abc import Callable

#: cyclic-GC thresholds for the controller process (CPython's default is (700, 10, 10))
GC_THRESHOLDS = (50_000, 20, 100)


def tune_garbage_collector() -> None:
    """Make cyclic garbage collection cheap for a process holding a large, long-lived engine state.

    Each cycle creates ~10^5 objects that live for the cycle (samples, figures, store rows) on top
    of the engine's long-lived state. With CPython's default thresholds young collections run every
    700 allocations, promote the cycle's objects and keep triggering full collections that rescan
    the whole state: measured at ~40 % of the store's row building at 8,000 GPUs. Objects alive now
    (modules, restored state) are moved out of the collector's view (`gc.freeze`), and collections
    run after 50,000 allocations instead of 700. Almost all garbage here is freed by reference
    counting anyway; cycles are still collected, later.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(None)
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def release_free_memory() -> bool:
    """Hand the C heap's free pages back to the OS after a status cycle; False where that is not possible.

    A cycle builds tens of MiB of short-lived objects (4,000 workloads' figures, the store's
    rows, the saved state); once freed, glibc keeps most of those pages, so RSS stays at the
    cycle's peak between cycles. `malloc_trim(0)` returns them (~40 MiB at 4,000 workloads,
    a few ms of CPU). The peak within a cycle is unchanged.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
