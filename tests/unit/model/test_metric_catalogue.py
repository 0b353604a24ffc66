"""Every consumer of the metric catalogue covers every entry: a metric added to `gpuwm.model.metrics` that
the store's rows, the PromQL translation, the agent's `/metrics`, the OpenMetrics backfill or the Run:ai names leave out
fails here."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwm.agent.core import Agent, DeviceCounters
from gpuwm.agent.metrics import MetricsRenderer
from gpuwm.api.runai_metrics import RunaiOptions, runai_metrics
from gpuwm.config import Settings
from gpuwm.feed import AgentDevice
from gpuwm.model import GpuSample, PodResources, PodStatsSample
from gpuwm.model.figures import WorkloadFigures
from gpuwm.model.metrics import CATALOGUE, EXPORTED, RUNAI_NAMES, STORED, Metric, Rollup, Source
from gpuwm.store.base import METRIC_NAMES, METRICS
from gpuwm.store.codec import METRIC_COUNT, RESOLUTION, ROLLUP_QUANTUM
from gpuwm.store.embedded import EmbeddedStore
from gpuwm.store.promql import promql
from gpuwm.store.rows import RowBuilder
from tests.integration.store.openmetrics_backfill import OpenMetricsBackfill

from ..store.store_data import cluster, project, sample, workload

T = 1_700_000_000.0
#: the store's columns as schema 5 lays them out on disk: a stored metric goes after these, never among them
SCHEMA5_COLUMNS = (
    "gpu_utilization_percent", "gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_memory_utilization_percent",
    "gpu_power_watts", "gpu_power_limit_watts", "gpu_energy_joules", "gpu_temperature_celsius", "gpu_sm_clock_mhz",
    "gpu_memory_clock_mhz", "gpu_pcie_rx_bytes_per_second", "gpu_pcie_tx_bytes_per_second", "gpu_allocated",
    "gpu_idle_seconds", "cpu_usage_cores", "memory_used_bytes", "network_rx_bytes_per_second",
    "network_tx_bytes_per_second", "ephemeral_storage_used_bytes", "cpu_request_cores", "cpu_limit_cores",
    "cpu_usage_percent_of_request", "cpu_usage_percent_of_limit", "memory_request_bytes", "memory_limit_bytes",
    "disk_read_bytes_per_second", "disk_write_bytes_per_second", "ephemeral_storage_limit_bytes",
)


def _full_sample() -> GpuSample:
    """A sample with every GPU field of the catalogue set."""
    fields: dict[str, object] = {
        metric.field: 1.0 for metric in CATALOGUE if metric.source is Source.GPU and metric.field
    }
    fields.pop("memory_percent")  # a property: memory used over total
    fields["healthy"] = True
    return GpuSample.model_validate({**sample(T, "gpu-0").model_dump(), **fields})


def _full_stats(pod: str = "a-0", pod_uid: str = "pod-uid-a") -> PodStatsSample:
    fields = {str(metric.field): 1.0 for metric in CATALOGUE if metric.source is Source.POD and metric.field}
    return PodStatsSample(t=T, node="node-a", namespace="team-a", pod=pod, pod_uid=pod_uid, **fields)


def _full_workload() -> WorkloadFigures:
    resources = PodResources(**{str(m.field): 2.0 for m in CATALOGUE if m.source is Source.POD_SPEC})
    figures = workload("a", [("gpu-0", 1.0, 50.0)], idle_seconds=5.0, energy_joules=10.0)
    return figures.model_copy(update={"pods": [pod.model_copy(update={"resources": resources}) for pod in figures.pods]})


def test_the_store_keeps_the_stored_entries_in_the_files_column_order() -> None:
    assert METRICS == STORED and METRIC_NAMES[: len(SCHEMA5_COLUMNS)] == SCHEMA5_COLUMNS
    # every stored unit has a resolution in the file (a unit the codec does not know fails at import)
    assert METRIC_COUNT == len(RESOLUTION) == len(ROLLUP_QUANTUM) == len(STORED)


@pytest.mark.parametrize("kind", ["workload", "pod", "node", "cluster"])
def test_rows_give_every_stored_metric_a_value(kind: str) -> None:
    figures = _full_workload()
    rows = RowBuilder().build([_full_sample()], [figures], [project("alpha", [figures])], cluster(1), [_full_stats()])
    row = rows.values[[key[0] for key in rows.keys].index(kind)]
    missing = [name for name, value in zip(METRIC_NAMES, row, strict=True) if np.isnan(value)]
    # energy is the workload's and project's own figure, or the devices' counters: a pod has none; the engine's
    # cumulative figures are the workload's, project's and cluster's own
    engines = [metric.name for metric in STORED if metric.source is Source.FIGURES]
    assert missing == {"pod": ["gpu_energy_joules", *engines], "node": engines}.get(kind, [])


@pytest.mark.parametrize("metric", STORED, ids=lambda metric: metric.name)
@pytest.mark.parametrize("scope", ["workload", "project", "node", "cluster"])
def test_promql_translates_every_stored_metric(metric: Metric, scope: str) -> None:
    expression = promql(metric.name, scope, "key", None)
    # the engine's cumulative figures are a workload's, project's or the cluster's: a node has none
    assert (expression is None) == (metric.source is Source.FIGURES and scope == "node")
    assert expression is None or "gpuwm_" in expression
    per_gpu = promql(metric.name, scope, "key", "gpu")
    # a pod's figures are not split among its devices; the engine's own figures have no breakdown
    assert (per_gpu is None) == (metric.source in (Source.POD, Source.POD_SPEC, Source.FIGURES)
                                 or (scope in ("workload", "project") and metric.rollup is Rollup.MAX))


def _agent_text() -> dict[str, int]:
    agent = Agent(Settings(pod_resources_socket="/nonexistent/pod-resources.sock", proc_root="/nonexistent"), "node-a")
    agent.state.samples = [_full_sample()]
    agent.state.devices = [AgentDevice(uuid="gpu-0", device_id="gpu-0", units=1.0, state="active",
                                       namespace="team-a", pod="a-0", container="main")]
    agent.state.counters = {"gpu-0": DeviceCounters(first_seen_t=T - 10)}
    agent.state.pod_stats = [_full_stats()]
    text = MetricsRenderer(agent, process_metrics=False, clock=lambda: T).render().decode()
    return {family.name: len(family.samples) for family in text_string_to_metric_families(text)}


def test_the_agent_exports_every_exported_entry_with_its_type() -> None:
    families = _agent_text()
    assert {f"gpuwm_{metric.name}": 1 for metric in EXPORTED}.items() <= families.items()


def test_the_backfill_writes_every_agent_series_the_promql_reads() -> None:
    figures = _full_workload()
    backfill = OpenMetricsBackfill()
    backfill.add(T, [_full_sample()], [figures], [project("alpha", [figures])], [_full_stats()])
    handle = io.StringIO()
    backfill.write(handle)
    text = handle.getvalue()
    read = {metric.name for metric in EXPORTED if metric.field is not None or metric.name == "gpu_allocated"}
    written = {family.name.removeprefix("gpuwm_") for family in text_string_to_metric_families(text)}
    assert read <= written
    assert all(f"gpuwm_pod_{metric.name}" in text for metric in STORED if metric.source is Source.POD_SPEC)


def test_the_runai_names_are_served(tmp_path: Path) -> None:
    figures = _full_workload()
    projects = [project("alpha", [figures])]
    store = EmbeddedStore(tmp_path / "s.db")
    try:
        store.record(T, [_full_sample()], [figures], projects, cluster(1), [_full_stats()])
        families = {family.name for family in runai_metrics(store, RunaiOptions(), [figures], projects)}
    finally:
        store.close()
    assert set(RUNAI_NAMES.values()) <= families


def test_only_stored_gauges_keep_rollup_extremes_and_the_store_lays_out_exactly_theirs() -> None:
    from dataclasses import replace

    from gpuwm.model.metrics import _check
    from gpuwm.store.codec import EXTREMES

    keeping = [metric.name for metric in CATALOGUE if metric.rollup_extremes]
    assert [METRIC_NAMES[index] for index in EXTREMES] == keeping
    energy = next(metric for metric in CATALOGUE if metric.rollup is Rollup.MAX)
    with pytest.raises(ValueError, match="only a stored gauge"):
        _check((replace(energy, rollup_extremes=True),))
    unstored = next(metric for metric in CATALOGUE if metric.rollup is Rollup.MEAN and not metric.stored)
    with pytest.raises(ValueError, match="only a stored gauge"):
        _check((replace(unstored, rollup_extremes=True),))
