"""Running workloads' latest rows are refreshed in turns (`latest_rows_per_interval`); news goes at once.

A running workload's figures move every interval (its counters and windows), so every row used to be
rewritten each interval: at 4,000 workloads ~95 % of the store's disk writes. With a budget, of the rows
that only have counters to update the longest unwritten go first, and new workloads, phase changes and
finished workloads are written at once (counted against the budget).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from gpuwm.model.figures import WorkloadFigures
from gpuwm.store.embedded import EmbeddedStore

from .store_data import cluster, project, workload

START = 1_790_000_000.0


def _jobs(t: float, count: int, phases: dict[int, str] | None = None) -> list[WorkloadFigures]:
    """`count` workloads, each in its phase (Running by default); running ones' counters move with `t`
    (energy), ended ones' figures are settled (the same each interval)."""
    phases = phases or {}
    jobs = []
    for k in range(count):
        phase = phases.get(k, "Running")
        ended = phase in ("Succeeded", "Failed")
        jobs.append(workload(f"job-{k}", [(f"gpu-{k}", 1.0, 50.0)], energy_joules=float(k) if ended else t + k,
                             phase=phase, end_time=START if ended else None))
    return jobs


def _record(store: EmbeddedStore, t: float, jobs: list[WorkloadFigures]) -> None:
    store.record(t, [], jobs, [project("alpha", jobs)], cluster(len(jobs)))


def _rows(path: Path) -> dict[str, tuple[float, str, float]]:
    """uid -> (at, phase, energy) of each latest_workloads row in the file."""
    with sqlite3.connect(path) as connection:
        return {uid: (at, json.loads(figures)["phase"], json.loads(figures)["energy_joules"])
                for uid, at, figures in connection.execute("SELECT uid, at, figures FROM latest_workloads")}


def test_running_rows_take_turns_within_the_budget(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db", latest_rows_per_interval=3)
    try:
        _record(store, START, _jobs(START, 10))
        assert {at for at, _, _ in _rows(tmp_path / "s.db").values()} == {START}  # new rows: all written at once
        for step in range(1, 13):
            t = START + 15 * step
            before = _rows(tmp_path / "s.db")
            _record(store, t, _jobs(t, 10))
            after = _rows(tmp_path / "s.db")
            refreshed = {uid for uid in after if after[uid][0] == t}
            assert len(refreshed) == 3
            oldest = sorted(before, key=lambda uid: (before[uid][0], uid))[:3]  # the longest unwritten go first
            assert refreshed == set(oldest)
            assert all(after[uid][2] == t + int(uid.rsplit("-", 1)[1]) for uid in refreshed)  # with this interval's figures
            assert all(t - at <= 15 * 4 for at, _, _ in after.values())  # every row at most ceil(10 / 3) intervals old
    finally:
        store.close()


def test_news_is_written_at_once_and_counts_against_the_budget(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db", latest_rows_per_interval=3)
    try:
        _record(store, START, _jobs(START, 10))
        t = START + 15
        # two finish, one is new (job-10): three rows of news fill this interval's budget
        _record(store, t, _jobs(t, 11, {2: "Succeeded", 7: "Succeeded"}))
        rows = _rows(tmp_path / "s.db")
        assert {uid for uid in rows if rows[uid][0] == t} == {"uid-job-2", "uid-job-7", "uid-job-10"}
        assert rows["uid-job-2"][1] == rows["uid-job-7"][1] == "Succeeded"
        t += 15
        # four news over the budget of three: all of them go, and no refresh this interval
        _record(store, t, _jobs(t, 11, {2: "Succeeded", 7: "Succeeded", 0: "Failed", 1: "Failed", 3: "Pending",
                                         4: "Failed"}))
        rows = _rows(tmp_path / "s.db")
        assert {uid for uid in rows if rows[uid][0] == t} == {"uid-job-0", "uid-job-1", "uid-job-3", "uid-job-4"}
        assert rows["uid-job-3"][1] == "Pending"
    finally:
        store.close()


def test_without_a_budget_every_changed_row_is_written(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db")
    try:
        for step in range(3):
            t = START + 15 * step
            _record(store, t, _jobs(t, 10))
            assert {at for at, _, _ in _rows(tmp_path / "s.db").values()} == {t}
    finally:
        store.close()


def test_a_rolled_back_phase_change_is_written_again_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The phase a row says is what the file holds: a rolled-back write of a new phase is news again."""
    store = EmbeddedStore(tmp_path / "s.db", latest_rows_per_interval=1)
    try:
        _record(store, START, _jobs(START, 3, {0: "Pending", 1: "Pending", 2: "Pending"}))
        t = START + 15

        def fail(*_: object) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        with monkeypatch.context() as patched:  # the latest rows are written, then the transaction fails
            patched.setattr(store, "_set_meta", fail)
            with pytest.raises(sqlite3.OperationalError):
                _record(store, t, _jobs(t, 3))
        assert {phase for _, phase, _ in _rows(tmp_path / "s.db").values()} == {"Pending"}  # rolled back
        t += 15
        _record(store, t, _jobs(t, 3))  # Running is news against the file: all three, over the budget of one
        assert {(at, phase) for at, phase, _ in _rows(tmp_path / "s.db").values()} == {(t, "Running")}
    finally:
        store.close()
