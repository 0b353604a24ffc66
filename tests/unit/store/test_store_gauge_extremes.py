"""A roll-up keeps the min and max of the gauges that keep extremes (`Metric.rollup_extremes`) besides their mean:
over generated histories, a coarse cell's min and max equal the least and largest of the finest tier's points its
bucket covers (to the roll-up's quantum), the finest tier answers min = max = its points, `min` of a counter and
`min` or `max` of a gauge that keeps no extremes are refused by name, and a file of schema 6
(no extremes) is migrated and answers its old buckets' mean as their min and max; the Prometheus backend
refuses min and max by name."""

from __future__ import annotations

import sqlite3
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwm.store import QueryError, RangeQuery
from gpuwm.store.base import EXTREMES_METRIC_NAMES, METRIC_INDEX, METRICS, Rollup
from gpuwm.store.codec import COLUMN_QUANTUM, RESOLUTION, minimum_column
from gpuwm.store.embedded import EmbeddedStore
from gpuwm.store.prometheus import PrometheusStore
from gpuwm.store.schema import SCHEMA_VERSION

from .old_schema import rewrite_as_schema
from .test_store_chunks import SMALL_TIERS, record

#: 15 s points, 1 min roll-ups; the fine tier keeps an hour so that both tiers answer the whole history
TIERS = ["15s:1h", "1m:1d"]
FINE, COARSE = 15, 60
#: the gauges that keep extremes, each on the store's exact resolution (values with 3 decimals)
GAUGES = EXTREMES_METRIC_NAMES
#: a top value of each unit those gauges may have
SCALE = {"percent": 100.0, "watts": 700.0, "bytes": 8e10}
#: the gauges whose roll-ups keep their mean only
MEAN_ONLY = tuple(metric.name for metric in METRICS if metric.rollup is Rollup.MEAN and not metric.rollup_extremes)
UID = "uid-w"


def _value(name: str) -> st.SearchStrategy[float | None]:
    resolution = RESOLUTION[METRIC_INDEX[name]]
    top = int(SCALE[METRICS[METRIC_INDEX[name]].unit] * resolution)
    return st.one_of(st.none(), st.integers(0, top).map(lambda units: units / resolution))


@st.composite
def histories(draw: st.DrawFn) -> dict[str, list[float | None]]:
    """Each gauge's points over one or two chunk spans of the finest tier (120 points each), gaps included."""
    points = 120 * draw(st.integers(1, 2))
    return {name: draw(st.lists(_value(name), min_size=points, max_size=points)) for name in GAUGES}


def _loaded(directory: str, history: dict[str, list[float | None]]) -> EmbeddedStore:
    store = EmbeddedStore(Path(directory) / "s.db", tiers=TIERS)
    series = store.register_series("workload", UID, {"workload_uid": UID, "project": "p"})
    points = len(history[GAUGES[0]])
    values = np.full((1, len(METRICS), points), np.nan)
    for name, column in history.items():
        values[0, METRIC_INDEX[name]] = [np.nan if value is None else value for value in column]
    store.load_history([series], 0, values)
    return store


def _answer(store: EmbeddedStore, step: int, points: int, aggregation: str) -> dict[str, list[float | None]]:
    query = RangeQuery("workload", UID, GAUGES, 0, (points - 1) * FINE // step * step, step,
                       aggregation=aggregation)  # type: ignore[arg-type]
    assert [stretch.step_seconds for stretch in store.resolution(query)] == [step]
    return {series.metric: [value for _, value in series.points] for series in store.query_range(query)}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories())
def test_a_coarse_cells_min_and_max_are_its_buckets_least_and_largest_fine_points(
    history: dict[str, list[float | None]],
) -> None:
    points = len(history[GAUGES[0]])
    with tempfile.TemporaryDirectory() as directory:
        store = _loaded(directory, history)
        try:
            coarse = {aggregation: _answer(store, COARSE, points, aggregation) for aggregation in ("mean", "min", "max")}
            fine = {aggregation: _answer(store, FINE, points, aggregation) for aggregation in ("mean", "min", "max")}
        finally:
            store.close()
    factor = COARSE // FINE
    for name in GAUGES:
        # the finest tier: each point is its own min and max
        assert fine["min"][name] == fine["max"][name] == fine["mean"][name] == history[name]
        # the extremes' declared quantum (codec.COLUMN_QUANTUM), coarser than the mean's
        half = COLUMN_QUANTUM[minimum_column(METRIC_INDEX[name])] / RESOLUTION[METRIC_INDEX[name]] / 2
        for bucket in range(points // factor):
            present = [v for v in history[name][bucket * factor : (bucket + 1) * factor] if v is not None]
            least, mean, largest = (coarse[kind][name][bucket] for kind in ("min", "mean", "max"))
            if not present:
                assert least is None and mean is None and largest is None
                continue
            assert least is not None and mean is not None and largest is not None
            assert least == pytest.approx(min(present), abs=half * (1 + 1e-9))
            assert largest == pytest.approx(max(present), abs=half * (1 + 1e-9))
            assert least - half <= mean <= largest + half  # each rounded to its own quantum


def test_min_of_a_counter_is_refused_by_name_and_max_is_its_latest_value(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)
    try:
        record(store, [float(t) for t in range(0, 480, 15)])
        store.compact(everything=True)
        for name in ("gpu_energy_joules", "gpu_idle_seconds", "allocated_gpu_seconds"):
            with pytest.raises(QueryError) as refused:
                store.query_range(RangeQuery("workload", "uid-train", (name,), 0, 420, 60, aggregation="min"))
            assert refused.value.parameter == "aggregation" and name in str(refused.value)
        with pytest.raises(QueryError) as unknown:
            store.query_range(RangeQuery("workload", "uid-train", ("gpu_power_watts",), 0, 420, 60,
                                         aggregation="median"))  # type: ignore[arg-type]
        assert unknown.value.parameter == "aggregation" and "median" in str(unknown.value)
        # a counter's cells hold its largest value, whether a mean or the max is asked for
        energy = ("gpu_energy_joules",)
        (mean,) = store.query_range(RangeQuery("workload", "uid-train", energy, 0, 420, 60))
        (largest,) = store.query_range(RangeQuery("workload", "uid-train", energy, 0, 420, 60, aggregation="max"))
        assert largest.points == mean.points and any(value is not None for _, value in mean.points)
    finally:
        store.close()


def test_the_catalogue_keeps_extremes_for_utilisation_and_not_for_every_gauge() -> None:
    assert "gpu_utilization_percent" in GAUGES and MEAN_ONLY  # the test below has gauges to ask of


@pytest.mark.parametrize("aggregation", ["min", "max"])
def test_min_or_max_of_a_gauge_without_extremes_is_refused_naming_those_with_them(
    tmp_path: Path, aggregation: str
) -> None:
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)
    try:
        record(store, [float(t) for t in range(0, 480, 15)])
        store.compact(everything=True)
        for name in MEAN_ONLY:
            asked = ("gpu_utilization_percent", name)  # one metric without extremes refuses the whole query
            with pytest.raises(QueryError) as refused:
                store.query_range(RangeQuery("workload", "uid-train", asked, 0, 420, 60,
                                             aggregation=aggregation))  # type: ignore[arg-type]
            message = str(refused.value)
            assert refused.value.parameter == "aggregation" and name in message
            assert all(kept in message for kept in GAUGES)
            (mean,) = store.query_range(RangeQuery("workload", "uid-train", (name,), 0, 420, 60))
            assert mean.metric == name  # its mean still answers
    finally:
        store.close()


def test_a_schema_6_file_is_migrated_and_its_buckets_mean_is_their_min_and_max(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = EmbeddedStore(path, tiers=SMALL_TIERS)
    query = RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 0, 420, 60)
    try:
        record(store, [float(t) for t in range(0, 480, 15)])
        store.compact(everything=True)
        (before,) = store.query_range(query)
    finally:
        store.close()
    rewrite_as_schema(path, 6)
    connection = sqlite3.connect(path)
    assert "device_extremes_payload" not in {row[1] for row in connection.execute("PRAGMA table_info(chunks)")}
    connection.close()
    store = EmbeddedStore(path, tiers=SMALL_TIERS)
    try:
        assert store._reader().execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (7,)
        (mean,) = store.query_range(query)
        assert mean.points == before.points
        for aggregation in ("min", "max"):
            (extreme,) = store.query_range(replace(query, aggregation=aggregation))
            assert extreme.points == before.points
        # the buckets written after the migration keep their extremes: a minute of 15 s points that differ
        record(store, [float(t) for t in range(480, 735, 15)])
        store.compact(everything=True)
        later = RangeQuery("workload", "uid-train", ("gpu_utilization_percent",), 480, 660, 60)
        (least,) = store.query_range(replace(later, aggregation="min"))
        (largest,) = store.query_range(replace(later, aggregation="max"))
        pairs = [(low, high) for (_, low), (_, high) in zip(least.points, largest.points, strict=True)]
        assert pairs and all(low is not None and high is not None and low < high for low, high in pairs)
    finally:
        store.close()



@pytest.mark.parametrize("aggregation", ["min", "max"])
def test_the_prometheus_backend_refuses_min_and_max_by_name(aggregation: str) -> None:
    store = PrometheusStore("http://127.0.0.1:9")  # refused before any request is made
    query = RangeQuery("workload", UID, ("gpu_utilization_percent",), 0, 60, 15,
                       aggregation=aggregation)  # type: ignore[arg-type]
    with pytest.raises(QueryError) as refused:
        store.query_range(query)
    assert refused.value.parameter == "aggregation" and "Prometheus" in str(refused.value)
