"""What the controller keeps of written conditions (ConditionMemo): enough for the next write's transition times."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuwm.config import Settings
from gpuwm.controller.kube.client import KubeClient
from gpuwm.controller.runtime import ControllerRuntime
from gpuwm.controller.state import recovery
from gpuwm.controller.status.build import ConditionMemo, build_conditions, memo_from_json, remembered, rfc3339

from .test_status import NOW, figures


def test_memos_carry_transition_times_as_the_whole_conditions_did() -> None:
    first = build_conditions(figures(idle_seconds=0.0), NOW)
    memos = remembered(first)
    assert all(isinstance(memo, ConditionMemo) for memo in memos)
    for later, idle_seconds in ((NOW + 60, 5.0), (NOW + 120, 900.0)):
        from_memos = build_conditions(figures(idle_seconds=idle_seconds), later, previous=memos,
                                      idle_condition_after_seconds=600, observed_idle_seconds=idle_seconds)
        from_conditions = build_conditions(figures(idle_seconds=idle_seconds), later, previous=first,
                                           idle_condition_after_seconds=600, observed_idle_seconds=idle_seconds)
        assert from_memos == from_conditions
    idle = next(c for c in from_memos if c.type == "Idle")
    assert idle.status == "True" and idle.last_transition_time == rfc3339(NOW + 120)
    unchanged = next(c for c in from_memos if c.type == "Sampling")
    assert unchanged.last_transition_time == rfc3339(NOW)  # kept from the first write


@pytest.mark.parametrize("bad", [
    {"type": "Ready", "status": "True"},
    {"type": "Idle", "status": "Maybe"},
    {"type": "Idle", "status": "True", "lastTransitionTime": 12},
])
def test_a_memo_that_is_not_a_gpuwm_condition_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=str(bad["type"])):
        memo_from_json(bad)


def _runtime(tmp_path: Path) -> ControllerRuntime:
    settings = Settings(store=str(tmp_path / "gpuwm.db"), agents="static:n1=http://127.0.0.1:9")
    return ControllerRuntime(settings, KubeClient("http://127.0.0.1:9"))


def test_saved_memos_come_back_and_states_saved_with_whole_conditions_still_restore(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    conditions = build_conditions(figures(idle_seconds=900.0), NOW, idle_condition_after_seconds=600,
                                  observed_idle_seconds=900.0)
    runtime.state.conditions["w1"] = remembered(conditions)
    state = json.loads(json.dumps(runtime.snapshot(NOW)))
    assert state["conditions"]["w1"] == [
        {"type": c.type, "status": c.status, "lastTransitionTime": c.last_transition_time} for c in conditions
    ]
    restored = _runtime(tmp_path)
    restored.restore_saved(state)
    assert restored.state.conditions == {"w1": remembered(conditions)}
    # a state saved before the memos: each condition whole, reason and message too
    state["conditions"] = {"w1": [c.model_dump(mode="json", by_alias=True) for c in conditions]}
    older = _runtime(tmp_path)
    older.restore_saved(state)
    assert older.state.conditions == {"w1": remembered(conditions)}


def test_conditions_written_on_the_crs_become_memos_and_mark_idle_announced(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    written = build_conditions(figures(idle_seconds=900.0), NOW, idle_condition_after_seconds=600,
                               observed_idle_seconds=900.0)
    items: list[dict[str, Any]] = [
        {"spec": {"workloadRef": {"uid": "w1"}},
         "status": {"conditions": [c.model_dump(mode="json", by_alias=True) for c in written]}},
        {"spec": {"workloadRef": {"uid": "w2"}}, "status": {"conditions": [{"type": "Idle"}]}},  # not ours: skipped
    ]
    recovery.conditions_from_crs(runtime.state, items)
    assert runtime.state.conditions == {"w1": remembered(written)}
    assert runtime.idle_events.announced == {"w1"}


def test_a_save_cut_off_by_shutdown_finishes_before_the_last_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cycle cancelled while its save renames in a thread: the final save waits for that rename, then
    writes over the file before last; the state read back is the final one, whole."""
    import asyncio
    import threading

    from gpuwm.controller import runtime as runtime_module
    from gpuwm.controller.state.persistence import commit_state, load_state, previous_path

    runtime = _runtime(tmp_path)
    runtime.save(NOW - 120)  # two saves before: the file before last exists, as after any minute of running
    runtime.save(NOW - 60)
    renaming, release = threading.Event(), threading.Event()
    def slow_commit(staged: Path, path: Path) -> None:
        renaming.set()
        release.wait(10)
        commit_state(staged, path)

    monkeypatch.setattr(runtime_module, "commit_state", slow_commit)

    async def shutdown() -> None:
        cycle = asyncio.create_task(runtime.save_in_background(NOW))
        while not renaming.is_set():
            await asyncio.sleep(0.01)
        cycle.cancel()  # what kopf's cleanup does to the cycles task
        with pytest.raises(asyncio.CancelledError):
            await cycle
        waiting = asyncio.create_task(runtime.finish_saving())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # the rename is still running: the final save must not start
        release.set()
        await waiting
        runtime.save(NOW + 1)

    asyncio.run(shutdown())
    state = load_state(runtime.state_path)
    assert state is not None and state["saved_at"] == NOW + 1
    previous = load_state(previous_path(runtime.state_path))
    assert previous is not None and previous["saved_at"] == NOW
