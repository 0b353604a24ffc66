"""Period figures over generated histories: for random periods (edges on and off bucket boundaries, before the
first data, after the last) each workload's figures equal the sum of its per-interval figures, periods add
up over random splits, peaks equal a brute-force maximum for any group, and tiers aged out one by one
change no total."""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwm.store import PeriodSums, WorkloadPeriod
from gpuwm.store.embedded import EmbeddedStore

from .period_history import (
    FIGURES,
    STEP,
    History,
    histories,
    label_groups,
    members,
    record,
    record_frozen,
    reference,
    reference_peak,
)

#: the store keeps 1 ms and 1 mJ: two cumulative values, each rounded to it
TOLERANCE = 2e-3
_SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@contextmanager
def recorded(history: History, tiers: tuple[str, ...] = ("15s:2d", "5m:30d")) -> Iterator[EmbeddedStore]:
    with tempfile.TemporaryDirectory() as directory:
        store = EmbeddedStore(Path(directory) / "s.db", tiers=tiers)
        try:
            record(store, history)
            yield store
        finally:
            store.close()


def edges(history: History) -> st.SearchStrategy[float]:
    """Period edges: before the first data, at or between intervals (on and off the step), after the last."""
    first, last = history.start, history.start + STEP * (history.intervals - 1)
    return st.one_of(
        st.sampled_from([0.0, first - 3600, first, last, last + 1, last + 3600]),
        st.integers(0, history.intervals).map(lambda index: history.start + STEP * index),
        st.floats(first - 2 * STEP, last + 2 * STEP, allow_nan=False),
    )


def by_uid(rows: list[WorkloadPeriod]) -> dict[str, WorkloadPeriod]:
    return {row.uid: row for row in rows}


def assert_sums(found: PeriodSums, expected: PeriodSums, tolerance: float = TOLERANCE, note: str = "") -> None:
    for name in FIGURES:
        assert getattr(found, name) == pytest.approx(getattr(expected, name), abs=tolerance), (name, note)


@_SETTINGS
@given(data=st.data(), history=histories())
def test_a_period_is_the_sum_of_the_engines_interval_figures(data: st.DataObject, history: History) -> None:
    with recorded(history) as store:
        for _ in range(6):
            start, end = sorted((data.draw(edges(history)), data.draw(edges(history))))
            rows = by_uid(store.period(start, end))
            expected = reference(history, start, end)
            assert set(rows) == set(expected), (start, end)
            for uid, row in rows.items():
                assert_sums(row.sums, expected[uid])
                assert row.apportioned_gpu_seconds == 0.0  # every edge in the finest tier: exact
                assert row.peak_allocated_gpus == pytest.approx(reference_peak(history, start, end, [uid]))


@_SETTINGS
@given(data=st.data(), history=histories())
def test_periods_add_up_over_random_splits(data: st.DataObject, history: History) -> None:
    with recorded(history) as store:
        cuts = sorted(data.draw(st.lists(edges(history), min_size=3, max_size=6)))
        whole = by_uid(store.period(cuts[0], cuts[-1]))
        parts = [by_uid(store.period(low, high)) for low, high in itertools.pairwise(cuts)]
        for uid, row in whole.items():
            summed = PeriodSums()
            for part in parts:
                if uid in part:
                    summed = summed.plus(part[uid].sums)
            assert_sums(summed, row.sums, 1e-6)
        assert all(uid in whole for part in parts for uid in part)


@_SETTINGS
@given(data=st.data(), history=histories())
def test_group_peaks_are_the_most_units_held_together(data: st.DataObject, history: History) -> None:
    with recorded(history) as store:
        start, end = sorted((data.draw(edges(history)), data.draw(edges(history))))
        groups = label_groups()
        peaks = store.peak_allocated(start, end, groups)
        for key, group in groups.items():
            assert peaks[key] == pytest.approx(reference_peak(history, start, end, members(history, group))), key


@_SETTINGS
@given(history=histories())
def test_a_start_before_the_first_data_is_the_start_at_it(history: History) -> None:
    with recorded(history) as store:
        earliest = store.earliest_time()
        assert earliest == history.start
        answers = [by_uid(store.period(start, history.start + 1e6)) for start in (0.0, earliest - 86400, earliest)]
        assert answers[0] == answers[1] == answers[2]
        assert store.period(history.start + STEP * history.intervals + 1, history.start + 1e6) == []
        for plan in history.plans:  # all time: the workload's own figures, as its last interval says
            row = answers[0][plan.uid] if plan.totals[-1][0] > 0 else None
            if row is not None:
                assert row.sums.allocated_gpu_seconds == pytest.approx(plan.totals[-1][0], abs=TOLERANCE)


AGING_TIERS = ("15s:2m", "1m:6m", "5m:40m")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), history=histories(max_intervals=30, max_workloads=3))
def test_tiers_aged_out_one_by_one_change_no_total(data: st.DataObject, history: History) -> None:
    """The same periods read while the finest tier holds them, once only the 1 min tier does, and once only the
    5 min tier does: a period whose edges are on the 5 min boundaries (and that ended when first read) never
    changes, nor does all time, and a partition of all time into periods cut anywhere still sums to each
    workload's whole figures (apportioned where a cut falls inside a coarse bucket, and saying so)."""
    with recorded(history, AGING_TIERS) as store:
        last = history.start + STEP * (history.intervals - 1)
        boundaries = [t for t in range(int(history.start) // 300 * 300, int(last), 300)]
        closed = [*itertools.pairwise([0.0, *boundaries]), (0.0, 1e12)]  # an open period changes as data comes
        cuts = sorted({0.0, 1e12, *data.draw(st.lists(edges(history), min_size=1, max_size=4))})
        first = [by_uid(store.period(low, high)) for low, high in closed]
        totals = by_uid(store.period(0.0, 1e12))
        recorded_until = last
        for minutes in (4, 12):  # the 15 s tier is gone, then the 1 min tier
            times = _steps_after(recorded_until, last + minutes * 60)
            record_frozen(store, history, times)
            recorded_until = times[-1]
            store.compact()
            again = [by_uid(store.period(low, high)) for low, high in closed]
            for (low, high), before, after in zip(closed, first, again, strict=True):
                assert set(before) == set(after), (low, high, minutes, history)
                for uid, row in before.items():
                    assert_sums(after[uid].sums, row.sums, note=f"{low} {high} {minutes} {history}")
                    assert after[uid].apportioned_gpu_seconds == 0.0  # on the coarse boundaries: exact
            parts = [by_uid(store.period(low, high)) for low, high in itertools.pairwise(cuts)]
            for uid, row in totals.items():
                summed = PeriodSums()
                for part in parts:
                    if uid in part:
                        summed = summed.plus(part[uid].sums)
                assert_sums(summed, row.sums, note=f"{history} {cuts} {parts} {totals}")
            assert all(row.apportioned_gpu_seconds >= 0 for part in parts for row in part.values())


def _steps_after(t: float, until: float) -> list[float]:
    count = int((until - t) // STEP)
    return [t + STEP * (index + 1) for index in range(count)]
