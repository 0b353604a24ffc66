"""What the accounting engine reports: per workload, project, GPU and cluster.

Times are float seconds on the engine's clock (epoch seconds in the controller); the
controller turns them into RFC 3339 strings for CR status. JSON field names are the
CR status names (camelCase), which is also what `gpuwm replay` prints.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gpuwm.model.podstats import PodResources

_Model = TypeVar("_Model", bound=BaseModel)


class _Figures(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class Windows(BaseModel):
    """Allocation-weighted mean percent over the monitored part of each window; None where nothing was monitored."""

    # the field names are the JSON names already (a camelCase generator would write avg1M)
    model_config = ConfigDict(populate_by_name=True)

    current: float | None = None
    avg1m: float | None = None
    avg5m: float | None = None
    avg1h: float | None = None
    lifetime: float | None = None


class PodFigures(_Figures):
    name: str
    uid: str
    node: str | None = None
    phase: str
    allocated_gpus: float = 0.0
    labels: dict[str, str] | None = Field(default=None, description="The labels the controller keeps (project, rank).")
    resources: PodResources | None = None
    failure_reason: str | None = None


class GpuIdentity(_Figures):
    """Which device this is: its node, UUID and index, its model, and for a MIG instance its profile and
    parent GPU; `device_units` is its size in GPU units (a MIG slice's share of its GPU)."""

    node: str
    uuid: str
    index: int | None = None
    model: str | None = None
    mig_profile: str | None = None
    parent_uuid: str | None = None
    device_units: float = 1.0


class GpuHolding(_Figures):
    """Who holds a device, or its share of it: the workload, its pod and container, the GPU units held, and
    whether the holder was active in the device's latest sample; all None where nobody holds it."""

    namespace: str | None = None
    workload: str | None = None
    workload_uid: str | None = None
    pod: str | None = None
    container: str | None = None
    units: float = 0.0
    active: bool | None = Field(default=None, description="Whether the holder was active in the latest sample.")


# pydantic lists the fields of the last base first: the identity's, then the holding's, then its own
class GpuFigures(GpuHolding, GpuIdentity):
    """One device as of its latest sample, with the workload holding it (if any)."""

    pod_uid: str | None = None
    utilization_percent: float | None = Field(default=None, description="The holder's utilisation (device SM % if none).")
    sm_percent: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    healthy: bool = True
    error: str | None = None
    last_sample_time: float | None = None
    monitored: bool = Field(default=False, description="Whether its latest sample is recent enough (<= 3 poll intervals).")


class WorkloadFigures(_Figures):
    """Every DESIGN §3 figure of one workload at time `at`."""

    uid: str
    namespace: str
    name: str
    kind: str
    api_version: str
    project: str
    phase: str
    allocated_gpus: float = 0.0
    allocated_gpu_seconds: float = 0.0
    active_gpu_seconds: float = 0.0
    idle_gpu_seconds: float = 0.0
    unmonitored_gpu_seconds: float = 0.0
    idle_gpus: float = Field(default=0.0, description="Units held now whose latest sample was inactive.")
    unattributed_gpu_seconds: float = Field(
        default=0.0,
        description="Monitored GPU-seconds whose utilisation came from the device because the processes seen could"
        " not explain a busy GPU (DESIGN §3, attribution).",
    )
    last_active_time: float | None = None
    idle_seconds: float = 0.0
    wait_seconds: float = 0.0
    run_seconds: float = 0.0
    energy_joules: float = 0.0
    utilization: Windows = Field(default_factory=Windows)
    memory_utilization: Windows = Field(default_factory=Windows)
    requested_gpus: float | None = Field(
        default=None, description="GPU units its pod templates ask for (from the workload object; None: not watched)."
    )
    queued_seconds: float = Field(default=0.0, description="Seconds held back (suspended / not admitted) since creation.")
    local_queue: str | None = None
    cluster_queue: str | None = None
    failure_reason: str | None = Field(
        default=None,
        description="Why it failed as its object says (a Job's Failed condition message); the API falls back to a"
        " failed pod's reason.",
    )
    created_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    sampling: bool = Field(default=False, description="Every device it holds now has a recent sample.")
    gpu_model: str | None = None
    nodes: list[str] = Field(default_factory=list)
    pods: list[PodFigures] = Field(default_factory=list)
    gpus: list[GpuFigures] = Field(default_factory=list)


class ProjectFigures(_Figures):
    """Sums over a project's workloads (utilisation allocation-weighted)."""

    name: str
    workloads: int = 0
    running_workloads: int = 0
    namespaces: list[str] = Field(default_factory=list)
    allocated_gpus: float = 0.0
    idle_gpus: float = 0.0
    quota: float | None = None
    requested_gpus: float = Field(default=0.0, description="GPU units its queued and pending workloads ask for: unmet demand.")
    queued_workloads: int = 0
    longest_queued_seconds: float = 0.0
    allocated_gpu_seconds: float = 0.0
    active_gpu_seconds: float = 0.0
    idle_gpu_seconds: float = 0.0
    unmonitored_gpu_seconds: float = 0.0
    energy_joules: float = 0.0
    utilization: Windows = Field(default_factory=Windows)
    memory_utilization: Windows = Field(default_factory=Windows)


class ClusterFigures(_Figures):
    """The whole cluster: devices seen, units held, idle, and the sums over all workloads."""

    gpus: int = 0
    healthy_gpus: int = 0
    total_gpu_units: float = 0.0
    allocated_gpus: float = 0.0
    idle_gpus: float = 0.0
    workloads: int = 0
    running_workloads: int = 0
    allocated_gpu_seconds: float = 0.0
    active_gpu_seconds: float = 0.0
    idle_gpu_seconds: float = 0.0
    unmonitored_gpu_seconds: float = 0.0
    energy_joules: float = 0.0
    utilization: Windows = Field(default_factory=Windows)
    memory_utilization: Windows = Field(default_factory=Windows)


def trusted(cls: type[_Model], values: dict[str, Any]) -> _Model:
    """A `cls` of `values` its caller computed itself, without validation (pydantic's `model_construct`)."""
    return cls.model_construct(**values)

