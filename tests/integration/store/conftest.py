"""The real-Prometheus tests' shared setup: the same intervals recorded into an embedded store and backfilled into
the Debian `prometheus` (through `promtool`), so each test asks both backends the same question.

A test module defines the module-scoped fixture `intervals` (what to record: `prometheus_fixture.Interval`s)
and may override `evaluation_time` (the Prometheus store's "now"; None: the wall clock); `stores` yields both
backends.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from gpuwm.model.figures import ClusterFigures
from gpuwm.store.embedded import EmbeddedStore
from gpuwm.store.prometheus import PrometheusStore
from tests.integration.store.openmetrics_backfill import OpenMetricsBackfill
from tests.integration.store.prometheus_fixture import Interval, backfill, running_prometheus


@pytest.fixture(scope="module")
def evaluation_time() -> float | None:
    return None


@pytest.fixture(scope="module")
def stores(
    intervals: Sequence[Interval], evaluation_time: float | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[EmbeddedStore, PrometheusStore]]:
    """`intervals` in an embedded store and in a Prometheus on loopback (stopped after the module)."""
    workdir = tmp_path_factory.mktemp("prometheus")
    embedded = EmbeddedStore(workdir / "gpuwm.db")
    metrics = OpenMetricsBackfill()
    for each in intervals:
        embedded.record(each.t, each.samples, each.workloads, each.projects, ClusterFigures(gpus=each.gpus),
                        each.pod_stats)
        metrics.add(each.t, each.samples, each.workloads, each.projects, each.pod_stats)
    with (workdir / "data.om").open("w") as handle:
        metrics.write(handle)
    backfill(workdir / "data.om", workdir / "tsdb")
    try:
        with running_prometheus(workdir / "tsdb", workdir) as base:
            yield embedded, PrometheusStore(base, evaluation_time=evaluation_time)
    finally:
        embedded.close()
