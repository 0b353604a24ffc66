"""Engine state file: atomic, versioned, unreadable files are ignored (the CRs are the fallback)."""

from __future__ import annotations

from pathlib import Path

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
