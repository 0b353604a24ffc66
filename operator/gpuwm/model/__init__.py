"""Pydantic models shared by every layer: samples, trace events, figures, the metric catalogue, CR spec/status.

The other packages import these names from here, not from the modules below (an import-linter contract in
pyproject.toml holds them to it).
"""

from gpuwm.model.compact import intern_strings, share_fields_set
from gpuwm.model.crd import (
    GROUP,
    MAX_LISTED,
    MAX_WORKLOAD_ACTIONS,
    VERSION,
    ActionResult,
    ActionType,
    Condition,
    ConditionType,
    GpuStatus,
    PodStatus,
    PolicyActionRecord,
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
    GpuHolding,
    GpuIdentity,
    PodFigures,
    ProjectFigures,
    Windows,
    WorkloadFigures,
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
from gpuwm.model.policy import (
    DURATION_PATTERN,
    EXEMPT_ANNOTATION,
    EXEMPT_UNTIL_ANNOTATION,
    EXEMPT_VALUE,
    MAX_POLICY_LISTED,
    ExemptWorkload,
    IdlePolicySpec,
    IdlePolicyStatus,
    PlannedAction,
    PolicyAction,
    PolicyCondition,
    SecretKeyRef,
    UtilizationWindow,
    WorkloadSelector,
)
from gpuwm.model.sample import DeviceReading, GpuSample, LatestSample, ProcessSample
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
    "BY_NAME", "CATALOGUE", "DURATION_PATTERN", "ENDED_POD_PHASES", "EXEMPT_ANNOTATION",
    "EXEMPT_UNTIL_ANNOTATION", "EXEMPT_VALUE", "EXPORTED", "GROUP", "MAX_LISTED", "MAX_POLICY_LISTED",
    "MAX_WORKLOAD_ACTIONS", "RUNAI_NAMES", "STORED", "VERSION", "ActionResult", "ActionType", "Aggregation",
    "ClusterFigures", "Condition", "ConditionType", "DeviceAllocation", "DeviceReading", "ExemptWorkload",
    "GpuFigures", "GpuHolding", "GpuIdentity", "GpuSample", "GpuStatus", "IdlePolicySpec", "IdlePolicyStatus",
    "LatestSample", "Metric", "NamespaceEvent", "PlannedAction", "PodEvent", "PodFigures", "PodPhase",
    "PodResources", "PodStatsSample", "PodStatus", "PolicyAction", "PolicyActionRecord", "PolicyCondition",
    "ProcessSample", "ProjectFigures", "ProjectMetricsSpec", "ProjectMetricsStatus", "Rollup", "SampleEvent",
    "SecretKeyRef", "Source", "TraceEvent", "TraceLineError", "TraceWorkload", "UtilizationWindow",
    "UtilizationWindows", "Windows", "WorkloadEvent", "WorkloadFigures", "WorkloadMetricsSpec",
    "WorkloadMetricsStatus", "WorkloadPhase", "WorkloadRef", "WorkloadSelector", "gpu_quota",
    "intern_strings", "model_json", "parse_trace_line", "share_fields_set", "trusted",
]
