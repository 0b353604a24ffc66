"""What survives a restart, and the process's memory: the state, its file, recovery, GC tuning.

`model` is the `ControllerState` the status cycle changes, saved and restored whole;
`persistence` writes and reads the sectioned state file; `kept` keeps a copy of it in a Secret for
a replica in another pod; `recovery` rebuilds the state from it and from the CRs already written; `gctuning` keeps the long-lived state out of the garbage
collector's way. Nothing here imports the runtime: the runtime hands recovery what it needs.
"""

from gpuwm.controller.state.gctuning import (
    collect_cycle_garbage,
    release_free_memory,
    tune_garbage_collector,
)
from gpuwm.controller.state.kept import KeptState
from gpuwm.controller.state.model import ControllerState
from gpuwm.controller.state.persistence import (
    commit_state,
    encode_state_chunks,
    save_state,
    stage_state,
    state_path_for_store,
)
from gpuwm.controller.state.recovery import (
    Restored,
    projects_with_baselines,
    restore,
    restore_saved,
    with_baseline,
)

__all__ = [
    "ControllerState", "KeptState", "Restored", "collect_cycle_garbage", "commit_state",
    "encode_state_chunks", "projects_with_baselines", "release_free_memory", "restore", "restore_saved",
    "save_state", "stage_state", "state_path_for_store", "tune_garbage_collector", "with_baseline",
]
