"""GPU pods as the controller tracks them, and the PodEvents it feeds the engine.

The Pod object says what a container asks for; only the agent knows which device it got
(from the kubelet's pod-resources). A pod's engine event joins the two: requested units
from the spec, device UUIDs from the agents' attribution. Before the agent has reported, a
running GPU pod has no known device; once it has, the pod's event is sent again from the
time the pod started, and the engine places it there (within its late-event window).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Collection, Container, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuwm.accounting import parse_time
from gpuwm.controller.pull import DeviceHolder
from gpuwm.controller.watch.units import NodeSharing, requested_units
from gpuwm.model import ENDED_POD_PHASES, DeviceAllocation, PodEvent, PodPhase, PodResources, TraceWorkload

_PHASES: frozenset[str] = frozenset({"Pending", "Running", "Succeeded", "Failed", "Unknown"})
#: labels the operators of distributed jobs put on their pods to say which replica each one is: kept
#: beside `labels_kept` whatever it says, since the API ranks a workload's pods by them
RANK_LABELS: frozenset[str] = frozenset({
    "training.kubeflow.org/replica-type",
    "training.kubeflow.org/replica-index",
    "batch.kubernetes.io/job-completion-index",
    "jobset.sigs.k8s.io/job-index",
    "jobset.sigs.k8s.io/replicatedjob-name",
    "ray.io/node-type",
})
#: how long a failure reason may be (a container's termination message can be 4 KiB; a finished pod is
#: held for the retention)
FAILURE_REASON_MAX_CHARS = 512
_BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkKMGTPE]?)")
_DECIMAL_SUFFIXES = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                     "P": 1e15, "E": 1e18}


class MalformedPodError(ValueError):
    """A pod body the controller cannot use; the message names the pod and the field."""


@dataclass
class TrackedPod:
    """One GPU pod: what the engine needs from its Pod object."""

    namespace: str
    name: str
    uid: str
    phase: PodPhase
    node: str | None
    labels: dict[str, str]
    units_by_container: dict[str, float]
    workload: TraceWorkload
    phase_since: float | None = None
    created: float | None = None
    deletion_time: float | None = None  # metadata.deletionTimestamp: the kubelet has killed it by then
    resources: PodResources | None = None
    failure_reason: str | None = None

    @property
    def requested_units(self) -> float:
        return sum(self.units_by_container.values())


def _first_time(times: Iterable[float | None], latest: bool = False) -> float | None:
    known = [t for t in times if t is not None]
    return max(known, default=None) if latest else min(known, default=None)


def phase_start_time(pod: Mapping[str, Any], phase: str) -> float | None:
    """When the pod entered `phase`: container start for Running, finish for Succeeded/Failed."""
    status = pod.get("status") or {}
    container_states = [cs.get("state") or {} for cs in status.get("containerStatuses") or []]
    if phase == "Running":
        started = _first_time(parse_time((s.get("running") or {}).get("startedAt")) for s in container_states)
        if started is not None:
            return started
        condition = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        return parse_time(status.get("startTime")) or (
            parse_time(condition.get("lastTransitionTime")) if condition else None
        )
    if phase in {"Succeeded", "Failed"}:
        return _first_time(
            (parse_time((s.get("terminated") or {}).get("finishedAt")) for s in container_states), latest=True
        )
    if phase == "Pending":
        return parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    return None


def parse_quantity(value: object) -> float:
    """A Kubernetes quantity ("500m", "2", "1.5Gi", "1e3") as a float; ValueError naming it otherwise."""
    match = _QUANTITY.fullmatch(str(value).strip())
    if match is None:
        raise ValueError(f"quantity {value!r} is not a Kubernetes quantity (such as 500m, 2, 1.5Gi)")
    number, suffix = match.groups()
    return float(number) * (_BINARY_SUFFIXES.get(suffix) or _DECIMAL_SUFFIXES[suffix])


def pod_resources(spec: Mapping[str, Any]) -> PodResources | None:
    """The pod's CPU, memory and ephemeral-storage requests and limits, summed over its containers.

    A request missing on a container adds nothing; a limit missing on any container leaves the pod
    without that limit (the container may use the node's). Init containers run before the others and
    are left out. None when no container sets any of them."""
    containers = [c for c in spec.get("containers") or [] if isinstance(c, Mapping)]
    figures: dict[str, float | None] = {}
    for resource, name in (("cpu", "cpu"), ("memory", "memory"), ("ephemeral-storage", "ephemeral_storage")):
        unit = "cores" if resource == "cpu" else "bytes"
        for kind in ("requests", "limits"):
            # a container with a limit and no request is given the limit as its request (Kubernetes' defaulting)
            values = [((c.get("resources") or {}).get(kind) or {}).get(resource)
                      or (((c.get("resources") or {}).get("limits") or {}).get(resource) if kind == "requests" else None)
                      for c in containers]
            given = [parse_quantity(v) for v in values if v is not None]
            unknown = not given or (kind == "limits" and len(given) < len(values))
            figures[f"{name}_{kind[:-1]}_{unit}"] = None if unknown else sum(given)
    return None if all(value is None for value in figures.values()) else PodResources.model_validate(figures)


def failure_reason(pod: Mapping[str, Any]) -> str | None:
    """Why a Failed pod failed: the first terminated container with a non-zero exit (its reason and
    message), else the pod's own reason and message (Evicted, DeadlineExceeded ...). None otherwise."""
    status = pod.get("status") or {}
    if status.get("phase") != "Failed":
        return None
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated and terminated.get("exitCode") not in (0, None):
            words = [f"container {container.get('name')}: {terminated.get('reason') or 'Error'}",
                     f"exit code {terminated.get('exitCode')}"]
            if terminated.get("message"):
                words.append(str(terminated["message"]).strip())
            return ", ".join(words)[:FAILURE_REASON_MAX_CHARS]
    words = [str(status[key]).strip() for key in ("reason", "message") if status.get(key)]
    return ": ".join(words)[:FAILURE_REASON_MAX_CHARS] if words else "Failed"


def track_pod(
    pod: Mapping[str, Any],
    workload: TraceWorkload,
    resource_patterns: Iterable[str],
    *,
    deleted: bool,
    replicas: int | NodeSharing = 1,
    shared_replicas: int = 4,
    labels_kept: Collection[str] | None = None,
) -> TrackedPod:
    """A TrackedPod from a Pod body; raises MalformedPodError naming what is missing.

    `labels_kept`: the only labels the pod keeps (the controller keeps the project label: the
    engine reads no other, and a finished pod is held for the retention, labels and all).
    """
    metadata = pod.get("metadata")
    if not isinstance(metadata, Mapping) or not metadata.get("name") or not metadata.get("uid"):
        raise MalformedPodError("pod without metadata.name/uid")
    where = f"pod {metadata.get('namespace')}/{metadata['name']}"
    if not metadata.get("namespace"):
        raise MalformedPodError(f"{where}: metadata.namespace is missing")
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise MalformedPodError(f"{where}: spec is missing")
    try:
        units = requested_units(spec, resource_patterns, replicas=replicas, shared_replicas=shared_replicas)
    except (ValueError, AttributeError, TypeError) as error:
        raise MalformedPodError(f"{where}: GPU resource request unreadable: {error}") from None
    try:
        resources = pod_resources(spec)
    except (ValueError, AttributeError, TypeError) as error:
        raise MalformedPodError(f"{where}: CPU, memory or ephemeral-storage request unreadable: {error}") from None
    raw_phase = str((pod.get("status") or {}).get("phase") or "Pending")
    phase: PodPhase = "Deleted" if deleted else (raw_phase if raw_phase in _PHASES else "Unknown")  # type: ignore[assignment]
    labels = metadata.get("labels") or {}
    return TrackedPod(
        namespace=str(metadata["namespace"]),
        name=str(metadata["name"]),
        uid=str(metadata["uid"]),
        phase=phase,
        node=str(spec["nodeName"]) if spec.get("nodeName") else None,
        labels={str(k): str(v) for k, v in labels.items()
                if labels_kept is None or k in labels_kept or k in RANK_LABELS}
        if isinstance(labels, Mapping) else {},
        units_by_container=units,
        workload=workload,
        phase_since=phase_start_time(pod, raw_phase),
        created=parse_time(metadata.get("creationTimestamp")),
        deletion_time=parse_time(metadata.get("deletionTimestamp")),
        resources=resources,
        failure_reason=failure_reason(pod),
    )


def ended_by_deletion(pod: TrackedPod, now: float) -> TrackedPod | None:
    """The pod as ended at its deletionTimestamp, once that has passed and the object still exists.

    The API server sets deletionTimestamp to the request time plus the grace period; by then the
    kubelet has killed the containers, so the GPUs are free even when the object lingers
    (finalizers, a node that is gone, a cluster without kubelets). Counting on until the object is
    removed would bill a pod stuck Terminating forever.
    """
    if pod.deletion_time is None or now < pod.deletion_time or pod.phase in ENDED_POD_PHASES:
        return None
    return replace(pod, phase="Deleted", phase_since=pod.deletion_time)


def as_of(pod: TrackedPod, now: float) -> tuple[TrackedPod, float]:
    """The pod as the engine should see it at `now`, and when its latest change happened.

    Past its deletionTimestamp it has ended there (`ended_by_deletion`). A phase cannot start before
    the pod exists: the kubelet stamps container starts with the node's clock, the API server the
    creation with its own; a node a second behind would put Running before Pending in the engine's
    timeline, and the pod would end up Pending.
    """
    ended = ended_by_deletion(pod, now)
    if ended is not None:
        return ended, ended.deletion_time or now
    at = now if pod.phase in {"Deleted", "Unknown"} else (pod.phase_since or now)
    if pod.created is not None and at < pod.created:
        at = pod.created
    return pod, at


def device_allocations(
    pod: TrackedPod, holders: Iterable[DeviceHolder], known_uids: Container[str] = ()
) -> list[DeviceAllocation]:
    """The devices the agents saw this pod hold, each with its units.

    The agent's own units win where it gives them: it knows the MIG slice size from NVML and the
    time-slicing replica count from the kubelet's allocatable devices. Otherwise a container's
    requested units are split evenly over the devices it holds (2 GPUs -> 1 each; one MIG slice ->
    its fraction; one time-sliced replica -> 1/replicas). Two replicas of one GPU add up.
    A holder matches by UID, or by namespace/name when its UID is unknown (pod-resources gives none).
    """
    unique = {id(holder): holder for holder in holders}.values()
    mine = [
        holder for holder in unique
        if holder.pod_uid == pod.uid
        # by name where the agent had no UID, or a UID of no pod we know (a stale or test-made one)
        or (holder.namespace == pod.namespace and holder.pod == pod.name
            and (holder.pod_uid is None or holder.pod_uid not in known_uids))
    ]
    named = {holder.container for holder in mine}
    unnamed = [] if None in named else unnamed_devices(pod, exclude=named)
    if not mine:
        return unnamed
    per_container = Counter(holder.container for holder in mine)
    total_units = pod.requested_units
    units_by_device: dict[tuple[str, str | None], float] = {}
    for holder in mine:
        if holder.units is not None:
            units = holder.units
        elif holder.container in pod.units_by_container:
            units = pod.units_by_container[holder.container] / per_container[holder.container]
        elif total_units > 0:
            units = total_units / len(mine)
        else:
            units = 1.0
        key = (holder.uuid, holder.container)
        units_by_device[key] = units_by_device.get(key, 0.0) + units
    return [
        DeviceAllocation(uuid=uuid, units=min(1.0, max(units, 1e-9)), container=container)
        for (uuid, container), units in sorted(units_by_device.items(), key=_by_device_and_container)
    ] + unnamed


#: the UUID prefix of a device Kubernetes gave a container that no agent has named yet
UNNAMED_DEVICE_PREFIX = "unnamed/"


def _by_device_and_container(item: tuple[tuple[str, str | None], float]) -> tuple[str, str]:
    (uuid, container), _ = item
    return uuid, container or ""


def unnamed_devices(pod: TrackedPod, exclude: Container[str | None] = ()) -> list[DeviceAllocation]:
    """Stand-ins for the devices of a running pod's containers that no agent has named yet.

    DESIGN §3: a running container's GPU units count from its requests from the
    moment it runs, whether or not an agent reports its node (the DaemonSet not scheduled there,
    its image not pulled); that time is unmonitored until samples cover it. A container's request
    becomes devices of at most one unit each (`unnamed/<pod uid>/<container>/<n>`), which no
    sample ever names; once an agent names the real devices, the pod's event is sent again from
    its start and the engine puts the real devices in their place.
    """
    if pod.phase != "Running":
        return []
    devices: list[DeviceAllocation] = []
    for container, units in sorted(pod.units_by_container.items()):
        if container in exclude or not units > 0:
            continue
        left, number = units, 0
        while left > 1e-9:
            share = min(1.0, left)
            devices.append(DeviceAllocation(
                uuid=f"{UNNAMED_DEVICE_PREFIX}{pod.uid}/{container}/{number}", units=share, container=container,
            ))
            left -= share
            number += 1
    return devices


def pod_event(pod: TrackedPod, devices: list[DeviceAllocation], at: float) -> PodEvent:
    """The engine event for the pod's current state, from `at` on."""
    held = devices if pod.phase == "Running" else []
    return PodEvent(
        t=at, event="pod", namespace=pod.namespace, name=pod.name, uid=pod.uid, phase=pod.phase,
        node=pod.node, labels=pod.labels, workload=pod.workload, devices=held, resources=pod.resources,
        failure_reason=pod.failure_reason,
    )


def state_key(pod: TrackedPod, devices: list[DeviceAllocation]) -> str:
    """What the engine has been told about the pod, as JSON (the state file keeps it); a change means a new event."""
    resources = None if pod.resources is None else pod.resources.model_dump()
    return json.dumps((
        pod.phase, pod.node, tuple(sorted(pod.labels.items())), pod.workload.uid, resources, pod.failure_reason,
        tuple((d.uuid, round(d.units, 6), d.container) for d in devices) if pod.phase == "Running" else (),
    ))


def workload_uid_of(key: str) -> str:
    """The workload a pod belonged to when the engine was told `key` (`state_key`)."""
    _phase, _node, _labels, workload_uid, *_ = json.loads(key)
    return str(workload_uid)
