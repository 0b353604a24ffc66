"""What the accounting engine reports: per workload, project, GPU and cluster.

Times are float seconds on the engine's clock (epoch seconds in the controller); the
controller turns them into RFC 3339 strings for CR status. JSON field names are the
CR status names (camelCase), which is also what `gpuwm replay` prints.
"""

from __future__ import annotations

import sys
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gpuwm.model.podstats import PodResources

_Model = TypeVar("_Model", bound=BaseModel)
_new_object = object.__new__
#: BaseModel's slots, set through their descriptors: what `object.__setattr__` does for them, without looking
#: the name up along the class's MRO each time
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
#: per model class: every field name -> its plain default, in field order (see `trusted`)
_TEMPLATES: dict[type[BaseModel], dict[str, Any]] = {}
#: per model class: the set of all its field names (see `trusted_complete`)
_ALL_FIELDS: dict[type[BaseModel], set[str]] = {}


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


class GpuFigures(_Figures):
    """One device as of its latest sample, with the workload holding it (if any)."""

    node: str
    uuid: str
    index: int | None = None
    model: str | None = None
    mig_profile: str | None = None
    parent_uuid: str | None = None
    device_units: float = 1.0
    namespace: str | None = None
    workload: str | None = None
    workload_uid: str | None = None
    pod: str | None = None
    pod_uid: str | None = None
    container: str | None = None
    units: float = 0.0
    utilization_percent: float | None = Field(default=None, description="The holder's utilisation (device SM % if none).")
    sm_percent: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    healthy: bool = True
    error: str | None = None
    last_sample_time: float | None = None
    monitored: bool = Field(default=False, description="Whether its latest sample is recent enough (<= 3 poll intervals).")
    active: bool | None = Field(default=None, description="Whether the holder was active in the latest sample.")


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
        " not explain a busy GPU (DESIGN §3, rule of 2026-11-27).",
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


def _template(cls: type[BaseModel]) -> dict[str, Any]:
    # required fields and those with a default factory must be given: a missing one stays PydanticUndefined
    template = _TEMPLATES[cls] = {name: field.default for name, field in cls.model_fields.items()}
    return template


def _all_fields(cls: type[BaseModel]) -> set[str]:
    fields = _ALL_FIELDS[cls] = set(cls.model_fields)
    return fields


def shared_keys_fields(cls: type[BaseModel]) -> dict[str, Any]:
    """A dict of every field of `cls` (None each, in field order) whose `copy()`s share one table of keys.

    CPython keeps an instance `__dict__` of a plain class as values over a key table shared by
    the class ("split" dicts, up to 30 keys), and `dict.copy()` of one keeps it so. Filled by
    assigning each field in turn (no key is added, the order stays the field order), a copy is
    smaller than a plain dict and faster to build; a cycle builds one per device and workload.
    With more keys (WorkloadFigures has 34) or elsewhere (another interpreter) the holder's dict is an
    ordinary one, grown key by key to about twice the size of one made at once: the smaller is returned.
    """
    holder = type(f"_{cls.__name__}Fields", (), {})()
    for name in cls.model_fields:
        setattr(holder, name, None)
    shared: dict[str, Any] = holder.__dict__
    plain = dict.fromkeys(cls.model_fields)
    return shared if sys.getsizeof(shared) <= sys.getsizeof(plain) else plain


def trusted(cls: type[_Model], values: dict[str, Any]) -> _Model:
    """`cls(**values)` without validation, for figures the engine computed itself (several times cheaper).

    A report builds one per workload, pod and device each status interval; validating numbers
    the engine made costs more than computing them. `values` must already hold each field's type
    (float, not int, for a float field: `float()` where a sum may be empty) and every field
    that is required or has a default factory (lists, windows; a shared default would be
    mutated). The `__dict__` is in field order, as validation leaves it, so dumps are the same
    to the byte; tests check this against validated construction.
    """
    template = _TEMPLATES.get(cls) or _template(cls)
    return trusted_complete(cls, {**template, **values}, set(values))


def trusted_complete(cls: type[_Model], values: dict[str, Any], fields_set: set[str] | None = None) -> _Model:
    """As `trusted` for `values` that hold every field of `cls` in field order (no defaults to merge).

    `fields_set`: the fields given (as validation would record them); by default every field,
    as one set per class shared by its instances: pydantic only ever adds field names to it
    (on assignment), which it holds already, so it never changes. A report keeps one of
    these models per device and workload; one set less each is fewer objects for the garbage
    collector to scan.
    """
    instance = _new_object(cls)
    _set_dict(instance, values)
    if fields_set is None:
        fields_set = _ALL_FIELDS.get(cls) or _all_fields(cls)
    _set_fields_set(instance, fields_set)
    _set_extra(instance, None)
    _set_private(instance, None)
    return instance
