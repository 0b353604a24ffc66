"""Garbage-collector settings for the controller process (issue 4: CPU per status cycle)."""

from __future__ import annotations

import gc

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
