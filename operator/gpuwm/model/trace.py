"""Events of a replay trace (one JSON object per line) and of the controller's feed to the engine."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gpuwm.model.sample import GpuSample

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Deleted", "Unknown"]


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    t: float = Field(description="Event time, seconds.")


class NamespaceEvent(_Event):
    """A namespace's labels (for the project) and annotations (for the GPU quota)."""

    event: Literal["namespace"]
    name: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class TraceWorkload(BaseModel):
    """The top-level owner of a pod (the pod itself when it has none)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    api_version: str = Field(alias="apiVersion", min_length=1)
    kind: str = Field(min_length=1)
    name: str = Field(min_length=1)
    uid: str = Field(min_length=1)
    created: float | None = Field(default=None, description="Workload creation time, seconds.")


class DeviceAllocation(BaseModel):
    """A device a pod holds and how many GPU units of it (1, a MIG fraction, 1/replicas)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    uuid: str = Field(min_length=1)
    units: float = Field(gt=0, le=1)
    container: str | None = None


class PodEvent(_Event):
    """The state of a GPU pod from `t` on; a later event for the same uid replaces it."""

    event: Literal["pod"]
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    uid: str = Field(min_length=1)
    phase: PodPhase
    node: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    workload: TraceWorkload
    devices: list[DeviceAllocation] = Field(default_factory=list)


class SampleEvent(GpuSample):
    """A GPU sample as a trace line."""

    event: Literal["sample"]


TraceEvent = Annotated[NamespaceEvent | PodEvent | SampleEvent, Field(discriminator="event")]
_trace_event_adapter: TypeAdapter[NamespaceEvent | PodEvent | SampleEvent] = TypeAdapter(TraceEvent)


class TraceLineError(ValueError):
    """A trace line that is not a valid event; names the line and the field at fault."""

    def __init__(self, line_number: int, field: str, message: str) -> None:
        self.line_number = line_number
        self.field = field
        super().__init__(f"line {line_number}: field '{field}': {message}")


def parse_trace_line(text: str, line_number: int) -> NamespaceEvent | PodEvent | SampleEvent:
    """Parse one trace line, raising TraceLineError that names the line and the field."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise TraceLineError(line_number, "<json>", f"not valid JSON: {error.msg} at column {error.colno}") from None
    if not isinstance(raw, dict):
        raise TraceLineError(line_number, "<json>", "expected a JSON object")
    if "event" not in raw:
        raise TraceLineError(line_number, "event", "missing; expected one of namespace, pod, sample")
    try:
        return _trace_event_adapter.validate_python(raw)
    except ValidationError as error:
        first = error.errors()[0]
        location = [str(part) for part in first["loc"]]
        if location and location[0] == raw.get("event"):
            location = location[1:]
        field = ".".join(location) or "event"
        raise TraceLineError(line_number, field, first["msg"]) from None
