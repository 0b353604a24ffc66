"""Render intervals as timestamped OpenMetrics, for `promtool tsdb create-blocks-from openmetrics` (test support).

Writes what Prometheus would have scraped: the agent's `gpuwm_gpu_*` / pod series and the
controller's `/metrics` (rendered by the real `WorkloadMetricsCollector`). The real-Prometheus tests
use it to give a Prometheus exactly the data the embedded store holds (bench/api.py loads through
remote write instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from prometheus_client.registry import Collector

from gpuwm.api.prom_metrics import WorkloadMetricsCollector
from gpuwm.model import LatestSample, PodStatsSample
from gpuwm.model.figures import ClusterFigures, ProjectFigures, WorkloadFigures
from gpuwm.model.metrics import EXPORTED, Source
from gpuwm.store import RangeQuery, Series, Store

#: the agent's per-device series read off a sample's field, and its per-pod series (the catalogue's)
_AGENT_GPU = tuple(metric for metric in EXPORTED if metric.source is Source.GPU and metric.field is not None)
_AGENT_POD = tuple(metric for metric in EXPORTED if metric.source is Source.POD and metric.field is not None)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in sorted(pairs.items())) + "}"


class _Snapshot(Store):
    """A store holding one interval's figures, so the real collector can render them."""

    def __init__(self, workloads: Sequence[WorkloadFigures], projects: Sequence[ProjectFigures]) -> None:
        self._workloads = list(workloads)
        self._projects = list(projects)

    def record(
        self,
        at: float,
        samples: Sequence[LatestSample],
        workloads: Sequence[WorkloadFigures],
        projects: Sequence[ProjectFigures],
        cluster: ClusterFigures,
        pod_stats: Sequence[PodStatsSample] = (),
    ) -> None:
        raise NotImplementedError("a snapshot is read-only")

    def workloads(self) -> list[WorkloadFigures]:
        return self._workloads

    def workload(self, namespace: str, name: str) -> WorkloadFigures | None:
        return next((w for w in self._workloads if (w.namespace, w.name) == (namespace, name)), None)

    def projects(self) -> list[ProjectFigures]:
        return self._projects

    def project(self, name: str) -> ProjectFigures | None:
        return next((p for p in self._projects if p.name == name), None)

    def cluster(self) -> ClusterFigures | None:
        return None

    def nodes(self) -> list[str]:
        return []

    def latest_time(self) -> float | None:
        return None

    def earliest_time(self) -> float | None:
        return None

    def query_range(self, query: RangeQuery) -> list[Series]:
        return []


class OpenMetricsBackfill:
    """Collects intervals; `write` emits one OpenMetrics file with every family contiguous, times ascending."""

    def __init__(self) -> None:
        # family -> (type, help, series labels text -> [(t, value)])
        self._families: dict[str, tuple[str, dict[str, list[tuple[float, float]]]]] = {}

    def _add(self, family: str, kind: str, labels: str, t: float, value: float) -> None:
        entry = self._families.setdefault(family, (kind, {}))
        entry[1].setdefault(labels, []).append((t, value))

    def add(
        self,
        at: float,
        samples: Sequence[LatestSample],
        workloads: Sequence[WorkloadFigures],
        projects: Sequence[ProjectFigures],
        pod_stats: Sequence[PodStatsSample] = (),
    ) -> None:
        holders: dict[str, list[tuple[str, str, str, float]]] = {}
        for workload in workloads:
            for gpu in workload.gpus:
                holders.setdefault(gpu.uuid, []).append(
                    (workload.namespace, gpu.pod or "", gpu.container or "", gpu.units)
                )
        for sample in samples:
            held = holders.get(sample.uuid, [])
            namespace, pod, container = (
                (held[0][0], held[0][1], held[0][2]) if len(held) == 1 else ("", "", "")
            )
            base = {
                "node": sample.node,
                "gpu": "" if sample.index is None else str(sample.index),
                "uuid": sample.uuid,
                "model": sample.model or "",
                "mig_profile": sample.mig_profile or "",
            }
            labels = _labels({**base, "namespace": namespace, "pod": pod, "container": container})
            for metric in _AGENT_GPU:
                value = getattr(sample, str(metric.field))
                if value is not None:
                    self._add(f"gpuwm_{metric.name}", metric.kind, labels, at, float(value))
            for holder_namespace, holder_pod, holder_container, units in held:
                holder = _labels(
                    {**base, "namespace": holder_namespace, "pod": holder_pod, "container": holder_container}
                )
                self._add("gpuwm_gpu_allocated", "gauge", holder, at, units)
        for stats in pod_stats:
            labels = _labels({"node": stats.node, "namespace": stats.namespace, "pod": stats.pod})
            for metric in _AGENT_POD:
                value = getattr(stats, str(metric.field))
                if value is not None:
                    self._add(f"gpuwm_{metric.name}", metric.kind, labels, at, float(value))
        self.add_collected(at, WorkloadMetricsCollector(_Snapshot(workloads, projects)))

    def add_collected(self, at: float, collector: Collector) -> None:
        """What `collector` exports now, as scraped at `at` (the controller's other collectors: cost, policies)."""
        for family in collector.collect():
            for metric_sample in family.samples:
                name = (
                    metric_sample.name.removesuffix("_total")
                    if family.type == "counter"
                    else metric_sample.name
                )
                if metric_sample.name.endswith("_created"):
                    continue
                self._add(name, family.type, _labels(dict(metric_sample.labels)), at, metric_sample.value)

    def write(self, handle: TextIO) -> int:
        """Write everything; returns the number of samples written."""
        count = 0
        for family, (kind, series) in sorted(self._families.items()):
            handle.write(f"# TYPE {family} {kind}\n")
            suffix = "_total" if kind == "counter" else ""
            for labels, points in series.items():
                for t, value in sorted(points):
                    handle.write(f"{family}{suffix}{labels} {value!r} {t:.3f}\n")
                    count += 1
        handle.write("# EOF\n")
        return count
