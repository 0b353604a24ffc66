"""Pydantic models shared by every layer: samples, trace events, CR spec/status."""

from gpuwm.model.crd import (
    Condition,
    GpuStatus,
    PodStatus,
    ProjectMetricsSpec,
    ProjectMetricsStatus,
    UtilizationWindows,
    WorkloadMetricsSpec,
    WorkloadMetricsStatus,
    WorkloadRef,
)
from gpuwm.model.podstats import PodResources, PodStatsSample
from gpuwm.model.sample import GpuSample, ProcessSample
from gpuwm.model.trace import (
    DeviceAllocation,
    NamespaceEvent,
    PodEvent,
    PodPhase,
    SampleEvent,
    TraceEvent,
    TraceWorkload,
    WorkloadEvent,
    parse_trace_line,
)

__all__ = [
    "Condition",
    "DeviceAllocation",
    "GpuSample",
    "GpuStatus",
    "NamespaceEvent",
    "PodEvent",
    "PodPhase",
    "PodResources",
    "PodStatsSample",
    "PodStatus",
    "ProcessSample",
    "ProjectMetricsSpec",
    "ProjectMetricsStatus",
    "SampleEvent",
    "TraceEvent",
    "TraceWorkload",
    "UtilizationWindows",
    "WorkloadEvent",
    "WorkloadMetricsSpec",
    "WorkloadMetricsStatus",
    "WorkloadRef",
    "parse_trace_line",
]
