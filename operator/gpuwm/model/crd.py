"""Spec and status of the gpuwm.io/v1alpha1 custom resources.

These models are the single source of the CRD schemas in `crds/` (see scripts/generate-crds.py);
a test checks the committed YAML against them field by field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "gpuwm.io"
VERSION = "v1alpha1"
#: RFC 3339 times: the API server checks the format (and `kubectl` shows them as dates)
DATE_TIME: dict[str, Any] = {"format": "date-time"}


class _CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class WorkloadRef(_CamelModel):
    """The workload these metrics describe: the top-level owner of its GPU pods."""

    api_version: str = Field(description="apiVersion of the workload, e.g. batch/v1.")
    kind: str = Field(description="Kind of the workload, e.g. Job, PyTorchJob, Pod.")
    name: str = Field(description="Name of the workload in this namespace.")
    uid: str = Field(description="UID of the workload object.")


class UtilizationWindows(BaseModel):
    """Allocation-weighted mean percent over the monitored part of each window; null where nothing was monitored."""

    # the field names are the JSON names already (a camelCase generator would write avg1M)
    model_config = ConfigDict(extra="forbid")

    current: float | None = Field(default=None, description="Percent in the latest sample of each device.")
    avg1m: float | None = Field(default=None, description="Mean percent over the last minute.")
    avg5m: float | None = Field(default=None, description="Mean percent over the last 5 minutes.")
    avg1h: float | None = Field(default=None, description="Mean percent over the last hour.")
    lifetime: float | None = Field(default=None, description="Mean percent over the workload's life.")


class GpuStatus(_CamelModel):
    """One device the workload holds, as of its latest sample."""

    node: str = Field(description="Node the device is on.")
    uuid: str = Field(description="GPU or MIG instance UUID.")
    index: int | None = Field(default=None, description="NVML index of the GPU on its node.")
    mig_profile: str | None = Field(default=None, description="MIG profile, e.g. 1g.10gb; null for a whole GPU.")
    pod: str = Field(description="Pod holding the device.")
    container: str | None = Field(default=None, description="Container holding the device, if known.")
    units: float = Field(description="GPU units the pod holds of this device.")
    utilization_percent: float | None = Field(default=None, description="The workload's utilisation of this device.")
    memory_used_bytes: float | None = Field(default=None, description="Device memory used.")
    memory_total_bytes: float | None = Field(default=None, description="Device memory total.")
    power_watts: float | None = Field(default=None, description="Device power draw.")
    healthy: bool = Field(default=True, description="False when the device's latest sample reported an error.")


class PodStatus(_CamelModel):
    """One pod of the workload that holds or held GPUs."""

    name: str = Field(description="Pod name.")
    uid: str = Field(description="Pod UID.")
    node: str | None = Field(default=None, description="Node the pod runs on.")
    phase: str = Field(description="Pod phase as last seen (Pending, Running, Succeeded, Failed, Deleted).")
    allocated_gpus: float = Field(description="GPU units the pod holds now.")


ConditionType = Literal["Sampling", "Idle", "Underutilized", "IdlePolicy"]


class Condition(_CamelModel):
    """A Kubernetes-style condition."""

    type: ConditionType = Field(description="Sampling, Idle, Underutilized or IdlePolicy.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason for the status.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str | None = Field(default=None, json_schema_extra=DATE_TIME, description="RFC 3339 time the status last changed.")


ActionType = Literal["warn", "scaleToZero", "suspend", "delete"]
ActionResult = Literal["Succeeded", "Failed", "Skipped", "DryRun"]
#: idle-policy actions kept on a GPUWorkloadMetrics (the newest)
MAX_WORKLOAD_ACTIONS = 20


class PolicyActionRecord(_CamelModel):
    """One action taken (or tried) on a workload."""

    time: str = Field(json_schema_extra=DATE_TIME, description="When.")
    policy: str = Field(description="The policy: NAMESPACE/NAME, or NAME for a ClusterGPUIdlePolicy.")
    action: ActionType = Field(description="The step.")
    result: ActionResult = Field(description="Succeeded, Failed, Skipped or DryRun.")
    message: str = Field(default="", description="What was done, or why it failed.")
    namespace: str | None = Field(default=None, description="Workload namespace (on a policy's status).")
    name: str | None = Field(default=None, description="Workload name (on a policy's status).")


class WorkloadMetricsSpec(_CamelModel):
    """What the GPUWorkloadMetrics describes (written by the controller)."""

    workload_ref: WorkloadRef = Field(description="The workload these metrics describe.")
    project: str = Field(description="The workload's project (label gpuwm.io/project on pod or namespace, else namespace).")


#: entries kept in status.pods and status.gpus: a 1,000-node job's full lists would pass etcd's
#: 1.5 MiB object limit and every status write would be refused
MAX_LISTED = 256

WorkloadPhase = Literal["Queued", "Pending", "Running", "Succeeded", "Failed", "Ended"]


class WorkloadMetricsStatus(_CamelModel):
    """GPU allocation, utilisation, idle time and energy of one workload (DESIGN §3 definitions)."""

    phase: WorkloadPhase | None = Field(
        default=None,
        description="Queued (held back: suspended, or its Kueue Workload not admitted), Pending (admitted, no GPU "
        "container running), Running, Succeeded, Failed or Ended.",
    )
    requested_gpus: float | None = Field(
        default=None,
        description="GPU units its pod templates ask for (replicas x per-pod request), read from the workload object; "
        "absent where the object's kind is not watched.",
    )
    allocated_gpus: float = Field(default=0, description="GPU units the workload holds now.")
    gpu_model: str | None = Field(default=None, description="GPU product name of its devices.")
    nodes: list[str] = Field(default_factory=list, description="Nodes its GPU pods run on.")
    pods: list[PodStatus] = Field(
        default_factory=list,
        description=f"Its GPU pods, by name: the first {MAX_LISTED} (podCount counts them all).",
        max_length=MAX_LISTED,
    )
    pod_count: int = Field(default=0, ge=0, description="How many GPU pods it has (pods lists at most the first ones).")
    gpus: list[GpuStatus] = Field(
        default_factory=list,
        description=f"Devices it holds now, by node and UUID: the first {MAX_LISTED} (gpuCount counts them all).",
        max_length=MAX_LISTED,
    )
    gpu_count: int = Field(default=0, ge=0, description="How many devices it holds now (gpus lists at most the first ones).")
    utilization: UtilizationWindows = Field(
        default_factory=UtilizationWindows, description="SM utilisation percent of its allocation."
    )
    memory_utilization: UtilizationWindows = Field(
        default_factory=UtilizationWindows, description="Memory used as percent of memory total of its devices."
    )
    idle_seconds: float = Field(
        default=0, description="now - max(lastActiveTime, start of the current allocation); 0 while active."
    )
    idle_since: str | None = Field(
        default=None, json_schema_extra=DATE_TIME,
        description="RFC 3339 time its current idle stretch began (now - idleSeconds); absent while active or ended. "
        "A date, so the Idle printer column stays current between status writes.",
    )
    last_active_time: str | None = Field(default=None, json_schema_extra=DATE_TIME, description="End of the latest interval in which it was active.")
    allocated_gpu_seconds: float = Field(default=0, description="Units x seconds held by running GPU containers.")
    active_gpu_seconds: float = Field(default=0, description="Part of allocatedGpuSeconds that was active.")
    idle_gpu_seconds: float = Field(default=0, description="Part of allocatedGpuSeconds that was monitored and idle.")
    unmonitored_gpu_seconds: float = Field(default=0, description="Part of allocatedGpuSeconds not covered by samples.")
    wasted_gpu_hours: float = Field(default=0, description="idleGpuSeconds / 3600, for the printer column.")
    energy_joules: float = Field(default=0, description="Energy of its devices, split by units.")
    queued_seconds: float = Field(
        default=0, description="Seconds held back (suspended or not admitted) since creation, again after a preemption."
    )
    wait_seconds: float = Field(
        default=0,
        description="Workload creation to its first running GPU container; after a preemption it counts on until the "
        "next run.",
    )
    run_seconds: float = Field(default=0, description="Time with at least one running GPU container.")
    start_time: str | None = Field(default=None, json_schema_extra=DATE_TIME, description="RFC 3339 time its first GPU container started.")
    end_time: str | None = Field(default=None, json_schema_extra=DATE_TIME, description="RFC 3339 time its last GPU pod ended.")
    conditions: list[Condition] = Field(default_factory=list, description="Sampling, Idle, Underutilized, IdlePolicy.")
    cost_per_hour: float | None = Field(
        default=None, description="Price of the GPU units it holds now, per hour (pricing); absent where unpriced."
    )
    cost: float | None = Field(
        default=None, description="allocatedGpuSeconds priced, plus energyCost; absent where unpriced."
    )
    idle_cost: float | None = Field(default=None, description="idleGpuSeconds priced: GPUs held and not used.")
    energy_cost: float | None = Field(default=None, description="energyJoules priced by the kWh.")
    currency: str | None = Field(default=None, description="Currency of the cost figures.")
    policy_actions: list[PolicyActionRecord] = Field(
        default_factory=list, max_length=MAX_WORKLOAD_ACTIONS,
        description=f"Idle-policy actions taken on the workload, newest first (at most {MAX_WORKLOAD_ACTIONS}).",
    )
    observed_generation: int | None = Field(default=None, description="metadata.generation this status was written for.")
    last_update_time: str | None = Field(default=None, json_schema_extra=DATE_TIME, description="RFC 3339 time the controller wrote this status.")


class ProjectMetricsSpec(_CamelModel):
    """Which project the GPUProjectMetrics describes."""

    project: str = Field(description="Project name (the object name is a DNS-safe form of it).")


class ProjectMetricsStatus(_CamelModel):
    """Sums over a project's workloads (utilisation allocation-weighted)."""

    workloads: int = Field(default=0, description="Workloads of the project with figures.")
    running_workloads: int = Field(default=0, description="Workloads holding GPUs now.")
    namespaces: list[str] = Field(default_factory=list, description="Namespaces the project's workloads are in.")
    allocated_gpus: float = Field(default=0, description="GPU units held now.")
    quota: float | None = Field(default=None, description="GPU quota from the namespace annotation gpuwm.io/gpu-quota.")
    requested_gpus: float = Field(
        default=0, description="GPU units its queued and pending workloads ask for: demand not met yet."
    )
    queued_workloads: int = Field(default=0, ge=0, description="Workloads held back (phase Queued).")
    longest_queued_seconds: float = Field(default=0, description="queuedSeconds of its longest-queued workload now.")
    idle_gpus: float = Field(default=0, description="Units held now whose latest sample was inactive.")
    utilization: UtilizationWindows = Field(default_factory=UtilizationWindows, description="SM utilisation percent.")
    memory_utilization: UtilizationWindows = Field(
        default_factory=UtilizationWindows, description="Memory used percent."
    )
    allocated_gpu_seconds: float = Field(default=0, description="Sum of workloads' allocatedGpuSeconds.")
    active_gpu_seconds: float = Field(default=0, description="Sum of workloads' activeGpuSeconds.")
    idle_gpu_seconds: float = Field(default=0, description="Sum of workloads' idleGpuSeconds.")
    unmonitored_gpu_seconds: float = Field(default=0, description="Sum of workloads' unmonitoredGpuSeconds.")
    wasted_gpu_hours: float = Field(default=0, description="idleGpuSeconds / 3600, for the printer column.")
    energy_joules: float = Field(default=0, description="Sum of workloads' energyJoules.")
    cost_per_hour: float | None = Field(default=None, description="Sum of workloads' costPerHour; absent where unpriced.")
    cost: float | None = Field(default=None, description="Sum of workloads' cost.")
    idle_cost: float | None = Field(
        default=None, description="Sum of workloads' idleCost: the cost of GPUs it held and did not use."
    )
    idle_cost_per_hour: float | None = Field(
        default=None, description="Price per hour of the units it holds now whose latest sample was inactive."
    )
    energy_cost: float | None = Field(default=None, description="Sum of workloads' energyCost.")
    currency: str | None = Field(default=None, description="Currency of the cost figures.")
    conditions: list[Condition] = Field(default_factory=list, description="Idle, Underutilized.")
    observed_generation: int | None = Field(default=None, description="metadata.generation this status was written for.")
    last_update_time: str | None = Field(default=None, json_schema_extra=DATE_TIME, description="RFC 3339 time the controller wrote this status.")
