"""Period figures through the Prometheus store, against a real Prometheus and a real VictoriaMetrics, and the
embedded store, from the same generated history: each workload's figures over random periods (edges on the
status interval, before the first data, at the last) equal the sum of its per-interval figures on all three,
periods add up, and peaks (a workload's, a group's) are the same."""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwm.model.figures import ClusterFigures
from gpuwm.store import PeriodSums, Store, WorkloadPeriod
from gpuwm.store.embedded import EmbeddedStore
from gpuwm.store.prometheus import PrometheusStore
from tests.integration.store.openmetrics_backfill import OpenMetricsBackfill
from tests.integration.store.prometheus_fixture import REAL_PROMETHEUS, backfill, running_prometheus
from tests.integration.store.victoria_fixture import import_openmetrics, running_victoria_metrics
from tests.unit.store.period_history import (
    FIGURES,
    STEP,
    History,
    Plan,
    intervals,
    label_groups,
    members,
    reference,
    reference_peak,
)

pytestmark = REAL_PROMETHEUS

#: before the machine's now (VictoriaMetrics refuses samples from the future), on the status interval
START = 1_790_000_100.0


@pytest.fixture(scope="module")
def history() -> History:
    plans = [
        Plan(name="train", namespace="team-a", project="alpha", first=0, units=[2.0] * 30 + [4.0] * 20,
             accrued=[(30.0, 20.0, 5.0, 600.5)] * 30 + [(60.0, 60.0, 0.0, 1500.25)] * 20, taken_back=[0.0] * 50,
             utilization=60.0),
        Plan(name="notebook", namespace="team-b", project="alpha", first=10, units=[1.0] * 25,
             accrued=[(15.0, 0.0, 15.0, 90.0)] * 12 + [(15.0, 5.0, 5.0, 95.0)] * 13, taken_back=[0.0] * 24 + [2.5],
             utilization=10.0),
        Plan(name="batch", namespace="team-b", project="beta", first=40, units=[0.5] * 8 + [0.0] * 2,
             accrued=[(7.5, 7.5, 0.0, 300.0)] * 8 + [(4.5, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0)],
             taken_back=[0.0] * 10, utilization=100.0),
    ]
    return History(start=START, plans=plans, intervals=64)


@pytest.fixture(scope="module")
def backends(history: History, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Store]]:
    """The history in an embedded store, a Prometheus (backfilled) and a VictoriaMetrics (imported)."""
    workdir = tmp_path_factory.mktemp("periods")
    embedded = EmbeddedStore(workdir / "gpuwm.db")
    samples = OpenMetricsBackfill()
    for t, workloads, projects in intervals(history):
        embedded.record(t, [], workloads, projects, ClusterFigures())
        samples.add(t, [], workloads, projects)
    text = io.StringIO()
    samples.write(text)
    (workdir / "data.om").write_text(text.getvalue())
    backfill(workdir / "data.om", workdir / "tsdb")
    latest = history.times()[-1]
    try:
        with running_prometheus(workdir / "tsdb", workdir) as prometheus, running_victoria_metrics(workdir) as victoria:
            import_openmetrics(victoria, text.getvalue())
            yield {"embedded": embedded,
                   "prometheus": PrometheusStore(prometheus, evaluation_time=latest),
                   "victoria-metrics": PrometheusStore(victoria, evaluation_time=latest)}
    finally:
        embedded.close()


def _by_uid(rows: list[WorkloadPeriod]) -> dict[str, WorkloadPeriod]:
    return {row.uid: row for row in rows}


def _assert_equal(found: PeriodSums, expected: PeriodSums, where: object) -> None:
    for name in FIGURES:
        assert getattr(found, name) == pytest.approx(getattr(expected, name), abs=2e-3), (name, where)


def _edges(history: History) -> st.SearchStrategy[float]:
    """Period edges on the status interval: before the first data, inside, at the last one and after it."""
    return st.integers(-4, history.intervals + 2).map(lambda index: history.start + STEP * index)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_each_backend_reads_the_engines_figures_over_any_period(
    data: st.DataObject, history: History, backends: dict[str, Store]
) -> None:
    start, end = sorted((data.draw(_edges(history)), data.draw(_edges(history))))
    expected = reference(history, start, end)
    for name, store in backends.items():
        rows = _by_uid(store.period(start, end))
        assert set(rows) == set(expected), (name, start, end)
        for uid, row in rows.items():
            _assert_equal(row.sums, expected[uid], (name, uid, start, end))
            assert row.peak_allocated_gpus == pytest.approx(reference_peak(history, start, end, [uid])), (name, uid)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_periods_add_up_and_group_peaks_agree_on_every_backend(
    data: st.DataObject, history: History, backends: dict[str, Store]
) -> None:
    cuts = sorted(set(data.draw(st.lists(_edges(history), min_size=3, max_size=5))))
    groups = label_groups()
    for name, store in backends.items():
        whole = _by_uid(store.period(cuts[0], cuts[-1]))
        parts = [_by_uid(store.period(low, high)) for low, high in itertools.pairwise(cuts)]
        for uid, row in whole.items():
            summed = PeriodSums()
            for part in parts:
                summed = summed.plus(part[uid].sums) if uid in part else summed
            _assert_equal(summed, row.sums, (name, uid, cuts))
        peaks = store.peak_allocated(cuts[0], cuts[-1], groups)
        for key, group in groups.items():
            expected = reference_peak(history, cuts[0], cuts[-1], members(history, group))
            assert peaks[key] == pytest.approx(expected), (name, key)


def test_the_latest_data_counts_in_a_period_that_ends_at_it(history: History, backends: dict[str, Store]) -> None:
    latest = history.times()[-1]
    expected = reference(history, history.start - 3600, latest)
    for name, store in backends.items():
        rows = _by_uid(store.period(0.0, latest))
        assert set(rows) == set(expected), name
        for uid, row in rows.items():
            _assert_equal(row.sums, expected[uid], (name, uid))


def test_a_workload_of_thousands_of_pods_is_one_query(tmp_path: Path) -> None:
    """A workload of 4,000 pods is read in one query naming them (no switch to whole namespaces past some
    count), sent by POST."""
    from gpuwm.store import RangeQuery
    from tests.integration.store.openmetrics_backfill import OpenMetricsBackfill as Backfill
    from tests.unit.store.store_data import workload

    job = workload("wide", [("gpu-0", 1.0, 50.0)])
    job = job.model_copy(update={"pods": [job.pods[0].model_copy(update={"name": f"wide-{index:05d}"})
                                          for index in range(4000)]})
    data = Backfill()
    data.add(START, [], [job], [])
    text = io.StringIO()
    data.write(text)
    (tmp_path / "data.om").write_text(text.getvalue())
    backfill(tmp_path / "data.om", tmp_path / "tsdb")
    with running_prometheus(tmp_path / "tsdb", tmp_path) as prometheus:
        store = PrometheusStore(prometheus, evaluation_time=START + 60)
        (series,) = store.query_range(RangeQuery("workload", job.uid, ("gpu_allocated",), START, START + 60, 15))
        assert series.labels == {"workload_uid": job.uid}
