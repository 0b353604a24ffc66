"""Series rows whose points have all passed retention are deleted: the table does not grow for ever."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from gpuwm.store import RangeQuery, embedded
from gpuwm.store.embedded import EmbeddedStore

from .store_data import cluster, project, sample, workload

#: 15 s points kept 4 minutes in 2-minute chunks; 1 min roll-ups kept 10 minutes in 4-minute chunks
SMALL_TIERS = ["15s:4m", "1m:10m"]


def _interval(store: EmbeddedStore, t: float, names: list[str]) -> None:
    jobs = [workload(name, [(f"gpu-{index}", 1.0, 40.0)]) for index, name in enumerate(names)]
    store.record(t, [sample(t, f"gpu-{index}") for index in range(len(names))], jobs,
                 [project("alpha", jobs)], cluster(len(names)))


def _series(store: EmbeddedStore) -> dict[tuple[str, str], int]:
    rows = store._writer.execute("SELECT kind, key, id FROM series")
    return {(kind, key): series_id for kind, key, series_id in rows}


def _workload_series(store: EmbeddedStore, uid: str) -> set[tuple[str, str]]:
    return {(kind, key) for (kind, key) in _series(store) if uid in key}


def test_a_finished_workloads_series_go_when_their_points_have(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)
    try:
        for t in range(0, 300, 15):
            _interval(store, float(t), ["train", "serve"])
        train = _workload_series(store, "uid-train")
        assert train and _workload_series(store, "uid-serve")
        t = 300
        while t < 1200:  # "train" ended at 300; its 1 min roll-ups are kept 10 minutes (4-minute chunks)
            _interval(store, float(t), ["serve"])
            t += 15
            if not _workload_series(store, "uid-train"):
                break
        gone_at = t
        assert not _workload_series(store, "uid-train"), "the ended workload's series were never deleted"
        assert gone_at > 300 + 600  # not before its roll-ups had passed their retention
        assert store.forgotten_series >= len(train)
        assert not any("uid-train" in key for _, key in store._series_ids)
        assert _workload_series(store, "uid-serve")  # the live workload keeps its series
        (util,) = store.query_range(
            RangeQuery("workload", "uid-serve", ("gpu_utilization_percent",), t - 480, t - 15, 60)
        )
        assert all(value == 40.0 for _, value in util.points)  # and its points: roll-ups, then 15 s ones
        # the name comes back: new series, with their labels (found by workload and by project)
        for later in range(t, t + 120, 15):
            _interval(store, float(later), ["serve", "train"])
        assert _workload_series(store, "uid-train")
        (again,) = store.query_range(
            RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), t, t + 105, 15)
        )
        assert [value for _, value in again.points] == [40.0] * 8
        labels = store._writer.execute(
            "SELECT workload_uid, project FROM series WHERE kind = 'workload' AND key LIKE '%uid-train%'"
        ).fetchall()
        assert labels == [("uid-train", "alpha")]
        # a deleted id is never handed out again: the newest row is never deleted
        ids = sorted(_series(store).values())
        assert len(ids) == len(set(ids))
    finally:
        store.close()


def test_series_with_points_only_in_the_head_stay(tmp_path: Path) -> None:
    """A series written again after its old points passed retention holds points in the head only,
    also when the store was reopened meanwhile (this process did not write them)."""
    path = tmp_path / "s.db"
    store = EmbeddedStore(path, tiers=SMALL_TIERS)
    try:
        for t in range(0, 120, 15):
            _interval(store, float(t), ["serve", "train"])
        for t in range(120, 1500, 15):
            _interval(store, float(t), ["serve"])
        assert not _workload_series(store, "uid-train")
        for t in range(1500, 1530, 15):
            _interval(store, float(t), ["serve", "train"])
        back = _workload_series(store, "uid-train")
        assert back
    finally:
        store.close()
    store = EmbeddedStore(path, tiers=SMALL_TIERS)
    try:
        for t in range(1530, 1530 + 1200, 15):  # many compaction rounds (2-minute spans), "train" silent
            _interval(store, float(t), ["serve"])
            if t < 1500 + 600:  # its two points are kept 10 minutes as a roll-up: its series stay
                assert _workload_series(store, "uid-train") == back, t
                (util,) = store.query_range(
                    RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 1500, 1515, 15)
                )
                assert [value for _, value in util.points] == [40.0, 40.0] or t >= 1500 + 240, t
        assert not _workload_series(store, "uid-train")  # and then they go
    finally:
        store.close()


def test_a_series_written_in_the_round_that_expires_its_last_chunk_stays(tmp_path: Path) -> None:
    """The head point written in the same interval as the round that drops its last chunk is kept."""

    def run(path: Path, back_at: float | None) -> tuple[float, EmbeddedStore]:
        store = EmbeddedStore(path, tiers=SMALL_TIERS)
        for t in range(0, 120, 15):
            _interval(store, float(t), ["serve", "train"])
        t = 120
        while t < 2000:
            _interval(store, float(t), ["serve", "train"] if t == back_at else ["serve"])
            if t == back_at or not _workload_series(store, "uid-train"):
                return float(t), store
            t += 15
        raise AssertionError("the ended workload's series were never deleted")

    deleted_at, dry = run(tmp_path / "dry.db", None)
    dry.close()
    at, store = run(tmp_path / "s.db", deleted_at)  # "train" is back in exactly that interval
    try:
        assert at == deleted_at
        assert _workload_series(store, "uid-train")
        for t in range(int(at) + 15, int(at) + 300, 15):
            _interval(store, float(t), ["serve"])
        (util,) = store.query_range(RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), at, at, 15))
        assert [value for _, value in util.points] == [40.0]
    finally:
        store.close()


def test_a_long_backlog_is_deleted_over_several_rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "FORGET_SERIES_PER_ROUND", 2)
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)
    try:
        for t in range(0, 120, 15):
            _interval(store, float(t), ["serve", "train"])
        counts = []
        for t in range(120, 2400, 15):
            _interval(store, float(t), ["serve"])
            counts.append(len(_workload_series(store, "uid-train")))
        assert counts[-1] == 0 and store.forgotten_series == counts[0]
        drops = [before - after for before, after in pairwise(counts) if before != after]
        assert len(drops) >= 2 and max(drops) <= 2  # two a round
    finally:
        store.close()
