"""Spec and status of GPUIdlePolicy (namespaced) and ClusterGPUIdlePolicy (cluster-wide platform defaults).

A policy selects workloads, says when one counts as idle (observed idle time, or utilisation below a
floor over a window) and what to do then: actions in order, each after its own delay. These models are
the source of both CRDs' schemas (scripts/generate-crds.py) and what the pure evaluator
(`gpuwm.accounting.policy`) and `gpuwm replay --policy` read.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gpuwm.model.crd import DATE_TIME, ActionType, PolicyActionRecord, WorkloadPhase

#: a duration as the other options write it: 30s, 90m, 2h, 1h30m, 7d
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d|w))+$"
_DURATION: dict[str, Any] = {"pattern": DURATION_PATTERN}

#: the workload annotation that exempts it from every idle policy; the second one, optional, ends the exemption
EXEMPT_ANNOTATION = "gpuwm.io/idle-policy"
EXEMPT_VALUE = "exempt"
EXEMPT_UNTIL_ANNOTATION = "gpuwm.io/idle-policy-exempt-until"

UtilizationWindow = Literal["1m", "5m", "1h"]
#: at most this many entries in a status list: a policy over thousands of idle workloads must stay under etcd's limit
MAX_POLICY_LISTED = 100


class _CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class WorkloadSelector(_CamelModel):
    """Which workloads the policy covers; every field given must match, an empty one matches all."""

    namespaces: list[str] = Field(
        default_factory=list, description="Namespaces (a ClusterGPUIdlePolicy only; a GPUIdlePolicy covers its own)."
    )
    exclude_namespaces: list[str] = Field(default_factory=list, description="Namespaces never touched.")
    projects: list[str] = Field(default_factory=list, description="Projects (DESIGN §3: label gpuwm.io/project).")
    kinds: list[str] = Field(default_factory=list, description="Workload kinds, e.g. Notebook, Deployment, Job.")
    match_labels: dict[str, str] = Field(default_factory=dict, description="Labels the workload object carries.")
    phases: list[WorkloadPhase] = Field(default_factory=list, description="Workload phases (idleness needs Running).")


class ExemptWorkload(_CamelModel):
    """A workload the policy leaves alone, until `until` where given."""

    namespace: str | None = Field(default=None, description="Its namespace; any where unset.")
    name: str = Field(min_length=1, description="Workload name.")
    kind: str | None = Field(default=None, description="Workload kind; any where unset.")
    until: str | None = Field(default=None, json_schema_extra=DATE_TIME, description="RFC 3339 end of the exemption.")


class SecretKeyRef(_CamelModel):
    """A key of a Secret in the controller's own namespace."""

    name: str = Field(min_length=1, description="Secret name.")
    key: str = Field(default="url", min_length=1, description="Key holding the value.")


class PolicyAction(_CamelModel):
    """One step: done once the one before it was done (the first: once the trigger holds) and `after` has passed."""

    type: ActionType = Field(
        description="warn (Event, condition, metric, webhook); scaleToZero (Deployment, StatefulSet, Notebook, "
        "RayCluster workers, InferenceService); suspend (Job, JobSet, Kubeflow jobs, RayJob, TrainJob; Kueue "
        "Workload spec.active=false where Kueue admitted it); delete (only when named).",
    )
    after: str = Field(default="0s", json_schema_extra=_DURATION, description="Delay after the step before it.")
    webhook_secret: SecretKeyRef | None = Field(
        default=None, description="warn: also POST to the URL this Secret key holds (needs idlePolicies.webhooks)."
    )


class IdlePolicySpec(_CamelModel):
    """Select, trigger, act; a dry run unless dryRun is false."""

    selector: WorkloadSelector = Field(default_factory=WorkloadSelector, description="Which workloads.")
    exempt: list[ExemptWorkload] = Field(default_factory=list, description="Workloads left alone.")
    idle_for: str = Field(
        json_schema_extra=_DURATION,
        description="Observed idle time (from the Idle condition's idleSince; unmonitored time never counts) that "
        "triggers the policy.",
    )
    utilization_below_percent: float | None = Field(
        default=None, ge=0, le=100,
        description="Also trigger when the mean utilisation over `window` is below this (the under-used case), once "
        "the whole window was observed.",
    )
    window: UtilizationWindow = Field(default="1h", description="Window of utilizationBelowPercent: 1m, 5m or 1h.")
    min_allocated_gpus: float = Field(default=0, ge=0, description="Only workloads holding at least this many GPU units.")
    actions: list[PolicyAction] = Field(min_length=1, description="Steps in order, each after its own delay.")
    dry_run: bool = Field(default=True, description="List what would be done, to whom and when; change nothing.")


class PlannedAction(_CamelModel):
    """A step the policy would take (dry run) or will take next, and when."""

    namespace: str = Field(description="Workload namespace.")
    name: str = Field(description="Workload name.")
    kind: str = Field(description="Workload kind.")
    action: ActionType = Field(description="The step.")
    at: str | None = Field(default=None, json_schema_extra=DATE_TIME, description="When it is (or was) due.")
    state: Literal["Pending", "Due", "WouldHaveRun"] = Field(description="Pending, Due, or WouldHaveRun (dry run).")


class PolicyCondition(_CamelModel):
    """A Kubernetes-style condition of a policy."""

    type: Literal["Ready", "PermissionsMissing"] = Field(description="Ready or PermissionsMissing.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason for the status.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str | None = Field(default=None, json_schema_extra=DATE_TIME, description="When it changed.")


class IdlePolicyStatus(_CamelModel):
    """What the policy matches, would do, did and could not do."""

    matched_workloads: int = Field(default=0, ge=0, description="Workloads the selector covers now.")
    idle_workloads: int = Field(default=0, ge=0, description="Of those, how many trigger it now.")
    planned: list[PlannedAction] = Field(
        default_factory=list, max_length=MAX_POLICY_LISTED,
        description=f"Steps due or coming, soonest first (at most {MAX_POLICY_LISTED}).",
    )
    recent_actions: list[PolicyActionRecord] = Field(
        default_factory=list, max_length=MAX_POLICY_LISTED,
        description=f"The latest actions and failures, newest first (at most {MAX_POLICY_LISTED}).",
    )
    actions_taken: int = Field(default=0, ge=0, description="Actions that succeeded since the controller started.")
    actions_failed: int = Field(default=0, ge=0, description="Actions that failed since the controller started.")
    missing_permissions: list[str] = Field(
        default_factory=list, description="VERB GROUP/RESOURCE the controller lacks for this policy's actions."
    )
    conditions: list[PolicyCondition] = Field(default_factory=list, description="Ready, PermissionsMissing.")
    observed_generation: int | None = Field(default=None, description="metadata.generation this status is for.")
    last_update_time: str | None = Field(default=None, json_schema_extra=DATE_TIME, description="When written.")
