"""Engine state file: atomic, versioned, unreadable files are ignored (the CRs are the fallback)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwm.controller.persistence import load_state, save_state, state_path_for_store


def test_state_path_next_to_the_store() -> None:
    assert state_path_for_store("/var/lib/gpuwm/gpuwm.db") == Path("/var/lib/gpuwm/gpuwm.db.engine.json")
    assert state_path_for_store("http://prometheus:9090").name == "gpuwm-controller.engine.json"


def test_round_trip_and_no_leftovers(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.json"
    save_state(path, {"engine": {"a": [1, 2]}, "saved_at": 5.0})
    save_state(path, {"engine": {"a": [3]}, "saved_at": 6.0})
    assert load_state(path) == {"version": 1, "engine": {"a": [3]}, "saved_at": 6.0}
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]


def test_missing_corrupt_or_foreign_state_is_none(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    assert load_state(path) is None
    path.write_text('{"version": 1, "engine": ')  # a torn write from another tool
    assert load_state(path) is None
    path.write_text('{"version": 99}')
    assert load_state(path) is None


def test_state_goes_elsewhere_when_the_store_directory_is_not_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWM_STATE_DIR", str(tmp_path))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        path = state_path_for_store(str(locked / "sub" / "gpuwm.db"))
        if os.access(locked, os.W_OK):  # running as root: permissions do not stop us
            assert path == locked / "sub" / "gpuwm.db.engine.json"
        else:
            assert path == tmp_path / "gpuwm-controller.engine.json"
    finally:
        locked.chmod(0o700)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert state_path_for_store(str(blocker / "gpuwm.db")) == tmp_path / "gpuwm-controller.engine.json"
