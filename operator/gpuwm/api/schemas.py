"""JSON bodies of the metrics API (DESIGN §5); the OpenAPI document is generated from these."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gpuwm.model import ProjectFigures, WorkloadFigures


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: what went wrong and, for a bad parameter, which one."""

    error: str = Field(description="bad_parameter, not_found, unauthorized, forbidden or unavailable.")
    message: str = Field(description="What is wrong and how to fix it.")
    parameter: str | None = Field(default=None, description="The query parameter at fault (400 only).")


#: the `continue` of a paged list (`continue` is a Python keyword, hence the alias)
CONTINUE = Field(
    default=None, alias="continue",
    description="Where the list was cut at `limit`: pass it as `continue` for the next page; null on the last.",
)


class WorkloadList(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    workloads: list[WorkloadFigures]
    continue_: str | None = CONTINUE


class ProjectList(BaseModel):
    projects: list[ProjectFigures]


class SeriesBody(BaseModel):
    """One metric of one series; a missing point is `null`."""

    metric: str = Field(description="Metric name, e.g. gpu_utilization_percent.")
    labels: dict[str, str] = Field(
        description="Breakdown labels (gpu, pod, node, ...); empty for the scope total."
    )
    points: list[tuple[float, float | None]] = Field(
        description="[epoch seconds, value or null] on the step grid."
    )


class PodIdentity(BaseModel):
    """One pod (task) of a workload run, as of its latest figures."""

    name: str
    uid: str
    node: str | None = None
    phase: str
    rank: int | None = Field(
        default=None,
        description="0 for the leader (master, chief, launcher, head), then workers by index: from the operators' "
        "rank labels (Kubeflow replica type/index, Job completion index, JobSet job index, Ray node type), "
        "else from the pod's name.",
    )
    role: str | None = Field(
        default=None, description="The replica type its labels or name carry (master, worker, head, ...)."
    )


class WorkloadIdentity(BaseModel):
    """The run a workload's range answer is about: its UID names it among runs that reused the name."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    namespace: str
    name: str
    uid: str
    kind: str
    project: str
    phase: str | None = Field(default=None, description="Pending, Running, Succeeded, Failed, ... as of its latest figures.")
    created_time: float | None = Field(default=None, description="Epoch seconds; the default range starts here.")
    start_time: float | None = Field(default=None, description="Its first running GPU container, epoch seconds.")
    end_time: float | None = Field(default=None, description="Epoch seconds; null while it runs.")
    failure_reason: str | None = Field(
        default=None,
        description="Why it failed: its object's Failed condition message (a Job's), else a failed pod's reason.",
    )
    pods: list[PodIdentity] = Field(default_factory=list, description="Its pods (tasks) with their phases.")


class ResolutionStretch(BaseModel):
    """A stretch [start, end) of the grid whose values really have `step` seconds between them, read from
    `tier` (the embedded store's `STEP:KEEP`; null where the backend has no tiers)."""

    start: float
    end: float
    step: float
    tier: str | None = None


class MetricsBody(BaseModel):
    """A time-series answer: `{workload, step, series: [{metric, labels, points}]}`."""

    model_config = ConfigDict(populate_by_name=True)

    scope: str = Field(description="workload, project, node or cluster.")
    workload: WorkloadIdentity | None = Field(default=None, description="The workload (workload scope only).")
    project: str | None = Field(default=None, description="The project (project scope only).")
    node: str | None = Field(default=None, description="The node (node scope only).")
    start: float = Field(description="First point, epoch seconds.")
    end: float = Field(description="Last point at or before this, epoch seconds.")
    step: float = Field(description="Seconds between points.")
    step_seconds: float = Field(
        alias="stepSeconds",
        description="The resolution the values really have: `step`, or the coarsest tier's step where only a "
        "coarser tier still holds part of the range (its points answer every cell they overlap; see `resolution`).",
    )
    requested_step: float | None = Field(
        default=None,
        alias="requestedStep",
        description="The step asked for, where it was finer than the store keeps: the answer is at `step`.",
    )
    aggregation: str = Field(
        default="mean",
        description="What each point holds of the values in its step: mean, min or max (the `aggregation` asked for).",
    )
    resolution: list[ResolutionStretch] = Field(
        default_factory=list,
        description="Which step each stretch's values really have: `step` where the store keeps points that "
        "fine, a coarser tier's step where only it still covers the stretch (each of its points answers every "
        "cell it overlaps).",
    )
    series: list[SeriesBody]


class Health(BaseModel):
    status: str
