"""Pydantic models shared by every layer: samples, trace events, figures, the metric catalogue, CR spec/status.

The other packages import these names from here, not from the modules below (an import-linter contract in
pyproject.toml holds them to it).
"""

from gpuwm.model.compact import intern_strings, share_fields_set
from gpuwm.model.crd import (
    GROUP,
    MAX_LISTED,
    VERSION,
    Condition,
    ConditionType,
    GpuStatus,
    PodStatus,
    ProjectMetricsSpec,
    ProjectMetricsStatus,
    UtilizationWindows,
    WorkloadMetricsSpec,
    WorkloadMetricsStatus,
    WorkloadPhase,
    WorkloadRef,
)
from gpuwm.model.figures import (
    ClusterFigures,
    GpuFigures,
    PodFigures,
    ProjectFigures,
    Windows,
    WorkloadFigures,
    complete,
    trusted,
)
from gpuwm.model.jsonfast import model_json
from gpuwm.model.metrics import (
    BY_NAME,
    CATALOGUE,
    EXPORTED,
    RUNAI_NAMES,
    STORED,
    Aggregation,
    Metric,
    Rollup,
    Source,
)
from gpuwm.model.podstats import PodResources, PodStatsSample
from gpuwm.model.sample import GpuSample, ProcessSample
from gpuwm.model.trace import (
    ENDED_POD_PHASES,
    DeviceAllocation,
    NamespaceEvent,
    PodEvent,
    PodPhase,
    SampleEvent,
    TraceEvent,
    TraceLineError,
    TraceWorkload,
    WorkloadEvent,
    gpu_quota,
    parse_trace_line,
)

__all__ = [
    "BY_NAME", "CATALOGUE", "ENDED_POD_PHASES", "EXPORTED", "GROUP", "MAX_LISTED", "RUNAI_NAMES", "STORED",
    "VERSION", "Aggregation", "ClusterFigures", "Condition", "ConditionType", "DeviceAllocation", "GpuFigures",
    "GpuSample", "GpuStatus", "Metric", "NamespaceEvent", "PodEvent", "PodFigures", "PodPhase", "PodResources",
    "PodStatsSample", "PodStatus", "ProcessSample", "ProjectFigures", "ProjectMetricsSpec", "ProjectMetricsStatus",
    "Rollup", "SampleEvent", "Source", "TraceEvent", "TraceLineError", "TraceWorkload", "UtilizationWindows",
    "Windows", "WorkloadEvent", "WorkloadFigures", "WorkloadMetricsSpec", "WorkloadMetricsStatus", "WorkloadPhase",
    "WorkloadRef", "complete", "gpu_quota", "intern_strings", "model_json", "parse_trace_line",
    "share_fields_set", "trusted",
]
