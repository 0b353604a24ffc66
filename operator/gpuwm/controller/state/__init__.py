"""What survives a restart, and the process's memory: the state file, recovery, GC and malloc tuning.

`persistence` writes and reads the sectioned state file; `recovery` rebuilds the controller's
state from it and from the CRs already written; `gctuning` keeps the long-lived state out of
the garbage collector's way.
"""

from gpuwm.controller.state.gctuning import (
    collect_cycle_garbage,
    limit_malloc_arenas,
    release_free_memory,
    tune_garbage_collector,
)
from gpuwm.controller.state.persistence import (
    commit_state,
    encode_state_chunks,
    save_state,
    stage_state,
    state_path_for_store,
)

__all__ = [
    "collect_cycle_garbage",
    "commit_state",
    "encode_state_chunks",
    "limit_malloc_arenas",
    "release_free_memory",
    "save_state",
    "stage_state",
    "state_path_for_store",
    "tune_garbage_collector",
]
