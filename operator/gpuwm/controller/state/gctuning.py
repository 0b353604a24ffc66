"""Garbage-collector settings for the controller process, and handing the C heap's free pages back."""

from __future__ import annotations

import ctypes
import functools
import gc
from collections.abc import Callable

#: cyclic-GC thresholds for the controller process (CPython's default is (700, 10, 10)); young objects are
#: collected at the end of each status cycle (`collect_cycle_garbage`), this is the bound within one
GC_THRESHOLDS = (250_000, 20, 100)


def tune_garbage_collector() -> None:
    """Make cyclic garbage collection cheap for a process holding a large, long-lived engine state.

    With CPython's default thresholds young collections run every 700 allocations, promote each cycle's
    short-lived objects (samples, figures, store rows) and keep triggering full collections that rescan
    the whole state. So the objects alive now (modules, restored state) leave the collector's view
    (`gc.freeze`), and collections run after `GC_THRESHOLDS[0]` allocations or at each cycle's end
    (`collect_cycle_garbage`). Almost all garbage here is freed by reference counting anyway.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def collect_cycle_garbage() -> int:
    """Collect the youngest generation once a status cycle's objects are gone; how many objects it freed.

    The young threshold is above what one cycle holds at once, so no collection scans its objects while
    they are alive; this one scans only what outlived the cycle (the next cycle's offers and latest
    samples). Cyclic garbage lives one cycle.
    """
    return gc.collect(0)


@functools.cache
def _libc_function(name: str) -> Callable[..., int] | None:
    """A glibc function of this process (`malloc_trim`), or None where the C library has none (musl, macOS)."""
    try:
        function: Callable[..., int] = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    return function


def release_free_memory() -> bool:
    """Hand the C heap's free pages back to the OS after a status cycle; False where that is not possible.

    A cycle builds many short-lived objects (every workload's figures, the store's rows, the
    saved state); once freed, glibc keeps most of those pages, so RSS stays at the cycle's peak
    between cycles. `malloc_trim(0)` returns them for little CPU. The peak within a cycle is unchanged.
    """
    trim = _libc_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True
