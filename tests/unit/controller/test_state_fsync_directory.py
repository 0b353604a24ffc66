"""The state file's folder is fsynced after the rename: until its entries reach the disk, a power
cut can bring back the old name, or no file at all, however well the file itself was synced."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpuwm.controller.state import persistence


def test_folder_is_synced_after_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state" / "gpuwm-state.json"
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor: int) -> None:
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(descriptor).st_mode) else "fsync file")
        real_fsync(descriptor)

    def replace(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        events.append(f"rename to {Path(target).name}")
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    persistence.save_state(path, {"version": 1})
    assert events[0] == "fsync file" and "rename to gpuwm-state.json" in events
    assert events[-1] == "fsync folder"
    assert events.index("fsync folder") > events.index("rename to gpuwm-state.json")
    # a second save (the first kept as the state before last) syncs the folder after both renames
    events.clear()
    persistence.save_state(path, {"version": 2})
    assert events[-1] == "fsync folder" and events.count("fsync folder") == 1
    assert path.exists() and persistence.previous_path(path).exists()
