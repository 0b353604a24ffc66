"""Events of a replay trace (one JSON object per line) and of the controller's feed to the engine.

A trace line is read strictly: a field the format does not know is an error (a typo such as
`smpercent` would otherwise leave a busy GPU without utilisation, silently unmonitored), and
so is NaN or ±Infinity in any number (`NaN` and `Infinity` tokens, which Python's JSON reader
accepts, and numbers such as 1e999 that overflow to infinity). The models themselves ignore
unknown fields, so the agent's feed and saved engine state stay readable across versions.
"""

from __future__ import annotations

import difflib
import json
import math
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gpuwm.model.podstats import PodResources
from gpuwm.model.sample import GpuSample

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Deleted", "Unknown"]
#: the phases after which a pod holds nothing and never runs again
ENDED_POD_PHASES: tuple[PodPhase, ...] = ("Succeeded", "Failed", "Deleted")


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True, allow_inf_nan=False)

    t: float = Field(description="Event time, seconds.")


class NamespaceEvent(_Event):
    """A namespace's labels (for the project) and annotations (for the GPU quota)."""

    event: Literal["namespace"]
    name: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


def gpu_quota(text: str) -> float:
    """The GPU units a namespace's quota annotation gives; ValueError saying why for anything but a finite number
    (`float` reads "nan", "inf" and "1e999" as numbers: a NaN quota would make the project's figures NaN)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


class TraceWorkload(BaseModel):
    """The top-level owner of a pod (the pod itself when it has none)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True, allow_inf_nan=False)

    api_version: str = Field(alias="apiVersion", min_length=1)
    kind: str = Field(min_length=1)
    name: str = Field(min_length=1)
    uid: str = Field(min_length=1)
    created: float | None = Field(default=None, description="Workload creation time, seconds.")


class DeviceAllocation(BaseModel):
    """A device a pod holds and how many GPU units of it (1, a MIG fraction, 1/replicas)."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

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
    resources: PodResources | None = Field(
        default=None, description="CPU, memory and ephemeral-storage requests and limits from the pod spec."
    )
    failure_reason: str | None = Field(
        default=None, description="Why a Failed pod failed: its terminated container's reason and message."
    )


class WorkloadEvent(_Event):
    """A workload object's own state from `t` on (a Job, PyTorchJob, JobSet, RayJob, Kueue Workload ...).

    What gpuwm reads from the object itself rather than from its pods, so a workload exists from its
    creation, queued or pending with no pod yet: whether it is held back (`suspended`: `spec.suspend`,
    `runPolicy.suspend`, a Kueue Workload not admitted), the GPU units its pod templates ask for, the
    Kueue queues it waits in, and whether it has finished or been deleted. A later event for the same
    uid replaces its state from its time on; pods roll up to it by uid.
    """

    event: Literal["workload"]
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    uid: str = Field(min_length=1)
    kind: str = Field(min_length=1)
    api_version: str = Field(alias="apiVersion", min_length=1)
    created: float | None = Field(default=None, description="The object's creationTimestamp, seconds.")
    suspended: bool = Field(default=False, description="Held back: suspended, or a Kueue Workload not admitted.")
    requested_gpus: float = Field(default=0.0, ge=0, description="GPU units its pod templates ask for in all.")
    finished: Literal["Succeeded", "Failed"] | None = Field(
        default=None, description="The object says it has finished (a Job's Complete or Failed condition)."
    )
    message: str | None = Field(
        default=None, description="Why it failed, as the object says (its Failed condition's reason and message)."
    )
    deleted: bool = Field(default=False, description="The object is gone (deleted) from `t` on.")
    labels: dict[str, str] = Field(default_factory=dict)
    local_queue: str | None = Field(default=None, description="Kueue LocalQueue (label kueue.x-k8s.io/queue-name).")
    cluster_queue: str | None = Field(default=None, description="Kueue ClusterQueue it was admitted to or waits in.")


class SampleEvent(GpuSample):
    """A GPU sample as a trace line."""

    event: Literal["sample"]


TraceEvent = Annotated[NamespaceEvent | PodEvent | WorkloadEvent | SampleEvent, Field(discriminator="event")]
_trace_event_adapter: TypeAdapter[NamespaceEvent | PodEvent | WorkloadEvent | SampleEvent] = TypeAdapter(TraceEvent)
_EVENT_MODELS: dict[str, type[BaseModel]] = {
    "namespace": NamespaceEvent, "pod": PodEvent, "workload": WorkloadEvent, "sample": SampleEvent,
}


class TraceLineError(ValueError):
    """A trace line that is not a valid event; names the line and the field at fault."""

    def __init__(self, line_number: int, field: str, message: str) -> None:
        self.line_number = line_number
        self.field = field
        super().__init__(f"line {line_number}: field '{field}': {message}")


def parse_trace_line(text: str, line_number: int) -> NamespaceEvent | PodEvent | WorkloadEvent | SampleEvent:
    """Parse one trace line, raising TraceLineError that names the line and the field."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise TraceLineError(line_number, "<json>", f"not valid JSON: {error.msg} at column {error.colno}") from None
    if not isinstance(raw, dict):
        raise TraceLineError(line_number, "<json>", "expected a JSON object")
    if "event" not in raw:
        raise TraceLineError(line_number, "event", "missing; expected one of namespace, pod, workload, sample")
    model = _EVENT_MODELS.get(raw["event"]) if isinstance(raw["event"], str) else None
    if model is not None:  # an unknown kind of event: validation names it
        unknown = unknown_field(raw, model)
        if unknown is not None:
            path, known = unknown
            guess = difflib.get_close_matches(path.rpartition(".")[2], known, n=1)
            hint = f"did you mean '{guess[0]}'?" if guess else f"known fields: {', '.join(sorted(known))}"
            raise TraceLineError(line_number, path, f"not a field of the trace format; {hint}")
    try:
        return _trace_event_adapter.validate_python(raw)
    except ValidationError as error:
        first = error.errors()[0]
        location = [str(part) for part in first["loc"]]
        if location and location[0] == raw.get("event"):
            location = location[1:]
        field = ".".join(location) or "event"
        message = first["msg"]
        if first["type"] == "finite_number":  # say what was there: NaN, inf or -inf
            message = f"{message}, got {first['input']!r}"
        raise TraceLineError(line_number, field, message) from None


def _field_names(model: type[BaseModel]) -> set[str]:
    """The keys a model reads: each field's name and its alias (a trace may use either where both are allowed)."""
    names = set()
    for name, info in model.model_fields.items():
        names.add(info.alias or name)
        if info.alias is None or model.model_config.get("populate_by_name"):
            names.add(name)
    return names


def _nested(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """(the model a field holds, whether as a list) for `Model`, `list[Model]` and either `| None`; else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = get_origin(annotation)
    if origin is list:
        inner = get_args(annotation)[0]
        return (inner, True) if isinstance(inner, type) and issubclass(inner, BaseModel) else None
    if origin in (Union, types.UnionType):
        for option in get_args(annotation):
            found = _nested(option)
            if found is not None:
                return found
    return None


def unknown_field(raw: dict[str, Any], model: type[BaseModel], prefix: str = "") -> tuple[str, set[str]] | None:
    """The first key of `raw` (or of a model nested in it: a pod's `workload` and `devices`, a sample's
    `processes`) that `model` does not read, as a dotted path with list positions, and the keys known there."""
    known = _field_names(model)
    for key, value in raw.items():
        if key not in known:
            return f"{prefix}{key}", known
        info = model.model_fields.get(key) or next(
            (field for field in model.model_fields.values() if field.alias == key), None
        )
        nested = None if info is None else _nested(info.annotation)
        if nested is None:
            continue
        inner, as_list = nested
        items = enumerate(value) if as_list and isinstance(value, list) else [(None, value)] if not as_list else []
        for position, item in items:
            if isinstance(item, dict):
                where = f"{prefix}{key}." if position is None else f"{prefix}{key}.{position}."
                found = unknown_field(item, inner, where)
                if found is not None:
                    return found
    return None
