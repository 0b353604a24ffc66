"""A store written by the schema before the engine's counters (schema 5) is migrated in place and never
misread: what its workloads accrued before the migration is spread over their lives before it (inexact, and
said so), not read as the first interval after it; all time still equals each workload's figures, and periods
still add up. The same holds for a new store beside a controller whose workloads began long before."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwm.model.figures import ClusterFigures, Windows, WorkloadFigures
from gpuwm.store import WorkloadPeriod
from gpuwm.store.embedded import EmbeddedStore

from .old_schema import rewrite_as_schema
from .store_data import project, workload

START = 1_800_000_000.0
STEP = 15.0
#: (name, units held, the interval it begins at)
JOBS = (("a", 1.0, 0), ("b", 2.0, 10), ("c", 0.5, 30))


def _figures(name: str, units: float, first: int, index: int) -> WorkloadFigures:
    intervals = index - first + 1
    allocated = units * STEP * intervals
    figures = workload(name, [(f"gpu-{name}", units, 40.0)], created=START + STEP * first - 15)
    return figures.model_copy(update={
        "allocated_gpus": units, "allocated_gpu_seconds": allocated, "active_gpu_seconds": allocated * 0.75,
        "idle_gpu_seconds": allocated * 0.25, "energy_joules": 300.0 * allocated, "utilization": Windows(lifetime=40.0),
    })


def _record(store: EmbeddedStore, indexes: range, jobs: tuple[tuple[str, float, int], ...] = JOBS) -> None:
    for index in indexes:
        reported = [_figures(name, units, first, index) for name, units, first in jobs if first <= index]
        store.record(START + STEP * index, [], reported, [project("alpha", reported)], ClusterFigures())


def _by_name(rows: list[WorkloadPeriod]) -> dict[str, WorkloadPeriod]:
    return {row.name: row for row in rows}


def test_a_schema_5_store_is_migrated_and_its_history_never_misread(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = EmbeddedStore(path)
    _record(store, range(0, 20))
    store.close()
    rewrite_as_schema(path, 5)  # as the gpuwm before the counters left it: no counters, holdings or openings
    store = EmbeddedStore(path)
    try:
        migrated = START + STEP * 20
        _record(store, range(20, 40))
        final = {name: _figures(name, units, first, 39) for name, units, first in JOBS}
        everything = _by_name(store.period(0.0, 1e12))
        assert set(everything) == {"a", "b", "c"}
        for name, row in everything.items():  # all time: each workload's own figures
            assert row.sums.allocated_gpu_seconds == pytest.approx(final[name].allocated_gpu_seconds, abs=1e-3)
            assert row.sums.energy_joules == pytest.approx(final[name].energy_joules, abs=1e-3)
        before = _by_name(store.period(0.0, migrated))
        after = _by_name(store.period(migrated, 1e12))
        # before the migration: what a and b had accrued then, spread over their lives, and saying so
        assert set(before) == {"a", "b"}
        for name in ("a", "b"):
            assert before[name].apportioned_gpu_seconds == pytest.approx(before[name].sums.allocated_gpu_seconds)
            held = _figures(name, *dict((n, (u, f)) for n, u, f in JOBS)[name], 19).allocated_gpu_seconds
            assert before[name].sums.allocated_gpu_seconds == pytest.approx(held, rel=0.1)
            total = before[name].sums.plus(after[name].sums)
            assert total.allocated_gpu_seconds == pytest.approx(everything[name].sums.allocated_gpu_seconds, abs=1e-6)
        # the first interval after the migration is one interval's worth, not the whole history before it
        first = _by_name(store.period(migrated, migrated + STEP))
        for name, units, _ in JOBS[:2]:
            assert first[name].sums.allocated_gpu_seconds < units * STEP * 1.2
        # c began after the migration: exact throughout
        assert after["c"].apportioned_gpu_seconds == 0.0
        assert after["c"].sums.allocated_gpu_seconds == pytest.approx(final["c"].allocated_gpu_seconds, abs=1e-3)
    finally:
        store.close()


def test_a_new_store_beside_running_workloads_spreads_what_they_had(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db")
    try:
        _record(store, range(25, 40))  # a began 25 intervals before the store's first, b 15 before
        opened = START + STEP * 25
        everything = _by_name(store.period(0.0, 1e12))
        for name, units, first in JOBS:
            assert everything[name].sums.allocated_gpu_seconds == pytest.approx(units * STEP * (40 - first), abs=1e-3)
        earlier = _by_name(store.period(0.0, opened))
        assert set(earlier) == {"a", "b"} and all(row.apportioned_gpu_seconds > 0 for row in earlier.values())
        # spread evenly over [began, the end of its first bucket): a's 390 GPU-s then over 395 s from START - 5
        opening, spread_seconds = 1.0 * STEP * 26, STEP * 26 + 5
        assert earlier["a"].sums.allocated_gpu_seconds == pytest.approx(opening * (opened - (START - 5)) / spread_seconds)
        quarter = _by_name(store.period(START, START + 90))
        assert quarter["a"].sums.allocated_gpu_seconds == pytest.approx(opening * 90 / spread_seconds)
        assert quarter["a"].peak_allocated_gpus == 1.0  # its units when the store first saw it stand for then
    finally:
        store.close()
