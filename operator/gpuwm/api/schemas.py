"""JSON bodies of the metrics API (DESIGN §5); the OpenAPI document is generated from these."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpuwm.model.figures import ProjectFigures, WorkloadFigures


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: what went wrong and, for a bad parameter, which one."""

    error: str = Field(description="bad_parameter, not_found, unauthorized, forbidden or unavailable.")
    message: str = Field(description="What is wrong and how to fix it.")
    parameter: str | None = Field(default=None, description="The query parameter at fault (400 only).")


class WorkloadList(BaseModel):
    workloads: list[WorkloadFigures]


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


class WorkloadIdentity(BaseModel):
    namespace: str
    name: str
    uid: str
    kind: str
    project: str


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
    series: list[SeriesBody]


class Health(BaseModel):
    status: str
