"""Pure attribution: NVML readings + pod-resources assignments + process cgroups -> who holds what.

No I/O here, so the decisions (replica units, which container a process belongs to, the GPU
state) are tested directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from gpuwm.agent.cgroup import PodRef
from gpuwm.agent.nvml import Reading
from gpuwm.agent.podresources import Assignment
from gpuwm.model import AgentDevice, DeviceState, GpuSample

_SAMPLES = TypeAdapter(list[GpuSample])


@dataclass(frozen=True)
class Attributed:
    """A poll's samples with processes attributed, and the device list for `/v1/snapshot`."""

    samples: list[GpuSample]
    devices: list[AgentDevice]


def classify(sample: GpuSample, allocated: bool, idle_threshold_percent: float) -> DeviceState:
    """The GPU's state now (DESIGN §3): active / idle-held / allocated-empty / unallocated."""
    has_processes = bool(sample.processes)
    if not sample.healthy:
        return "unknown"
    if not allocated and not has_processes:
        return "unallocated"
    if sample.sm_percent is None:
        return "allocated-empty" if sample.processes == [] else "unknown"
    if sample.sm_percent >= idle_threshold_percent:
        return "active"
    return "idle-held" if has_processes else "allocated-empty"


def _resolve_uuid(device_id_uuid: str, by_index: dict[str, str]) -> str:
    """Device plugins with `deviceIDStrategy: index` name GPUs `0`, `1`, ...: map them to UUIDs."""
    return by_index.get(device_id_uuid, device_id_uuid)


def attribute(
    readings: Iterable[Reading],
    assignments: list[Assignment],
    replicas: dict[str, int],
    default_replicas: int,
    pod_of_pid: Callable[[int], PodRef | None],
    known_uids: dict[tuple[str, str], str],
    idle_threshold_percent: float,
    device_cache: dict[tuple[Any, ...], list[AgentDevice]] | None = None,
) -> Attributed:
    """Attribute each reading's processes to pods, build its `GpuSample`, and list every device's holder.

    `known_uids` maps (namespace, pod) to UID (from the kubelet stats summary); it is updated here
    with what process cgroups reveal about pods that pod-resources names.
    """
    readings = list(readings)
    by_index = {
        str(r.fields["index"]): r.uuid
        for r in readings
        if r.fields.get("index") is not None and r.fields.get("parent_uuid") is None
    }
    held: dict[str, list[Assignment]] = {}
    for assignment in assignments:
        held.setdefault(_resolve_uuid(assignment.uuid, by_index), []).append(assignment)

    payloads: list[dict[str, Any]] = []
    found: list[tuple[list[Assignment], set[str]]] = []
    no_holders: list[Assignment] = []
    for reading in readings:
        holders = held.get(reading.uuid, no_holders)
        processes: list[dict[str, Any]] | None = None
        cgroup_pods: set[str] = set()
        if reading.processes is not None:
            containers = _containers_by_uid(holders, known_uids)
            processes = []
            for raw in reading.processes:
                reference = pod_of_pid(raw.pid)
                uid = None if reference is None else reference.pod_uid
                if uid is not None:
                    cgroup_pods.add(uid)
                processes.append({
                    "pid": raw.pid, "pod_uid": uid, "container": containers.get(uid),
                    "sm_percent": raw.sm_percent, "memory_used_bytes": raw.memory_used_bytes,
                })
        # one holder and one pod seen in its processes: that is the holder's UID
        if len(holders) == 1 and len(cgroup_pods) == 1:
            only = holders[0]
            uid = known_uids.setdefault((only.namespace, only.pod), next(iter(cgroup_pods)))
            for process in processes or []:
                if process["pod_uid"] == uid and process["container"] is None:
                    process["container"] = only.container
        payloads.append({**reading.fields, "processes": processes})
        found.append((holders, cgroup_pods))

    samples = _SAMPLES.validate_python(payloads)  # one call for the poll: less overhead than one per sample
    devices: list[AgentDevice] = []
    used: dict[tuple[Any, ...], list[AgentDevice]] = {}
    for sample, (holders, cgroup_pods) in zip(samples, found, strict=True):
        state = classify(sample, bool(holders) or bool(cgroup_pods), idle_threshold_percent)
        key = (
            sample.uuid, sample.index, sample.model, sample.parent_uuid, sample.mig_profile, sample.device_units,
            sample.healthy, sample.error, state, tuple(holders), frozenset(cgroup_pods),
            replicas.get(sample.uuid, default_replicas),
            tuple(known_uids.get((h.namespace, h.pod)) for h in holders),
            tuple(uid in known_uids.values() for uid in cgroup_pods),
        )
        # the device list rarely changes between polls: rebuild (and revalidate) it only when it does
        entries = device_cache.get(key) if device_cache is not None else None
        if entries is None:
            entries = _device_entries(sample, state, holders, replicas, default_replicas, known_uids, cgroup_pods)
        if device_cache is not None:
            used[key] = entries
        devices.extend(entries)
    if device_cache is not None:
        device_cache.clear()
        device_cache.update(used)
    return Attributed(samples, devices)


def _containers_by_uid(holders: list[Assignment], known_uids: dict[tuple[str, str], str]) -> dict[str | None, str | None]:
    """Pod UID -> the container name of the holders in that pod (None when they name several)."""
    names: dict[str | None, set[str]] = {}
    for holder in holders:
        uid = known_uids.get((holder.namespace, holder.pod))
        if uid is not None:
            names.setdefault(uid, set()).add(holder.container)
    return {uid: next(iter(found)) if len(found) == 1 else None for uid, found in names.items()}


def _device_entries(
    sample: GpuSample,
    state: DeviceState,
    holders: list[Assignment],
    replicas: dict[str, int],
    default_replicas: int,
    known_uids: dict[tuple[str, str], str],
    cgroup_pods: set[str],
) -> list[AgentDevice]:
    common = {
        "uuid": sample.uuid, "index": sample.index, "model": sample.model, "parent_uuid": sample.parent_uuid,
        "mig_profile": sample.mig_profile, "state": state, "healthy": sample.healthy, "error": sample.error,
    }
    entries = []
    for holder in holders:
        if holder.replica is not None:
            units = 1.0 / max(1, replicas.get(sample.uuid, default_replicas))
        else:
            units = sample.device_units
        profile = sample.mig_profile
        if profile is None and holder.resource_name.startswith("nvidia.com/mig-"):
            profile = holder.resource_name.removeprefix("nvidia.com/mig-")
        entries.append(AgentDevice(**{
            **common, "mig_profile": profile, "device_id": holder.device_id, "units": units,
            "resource_name": holder.resource_name, "namespace": holder.namespace, "pod": holder.pod,
            "pod_uid": known_uids.get((holder.namespace, holder.pod)), "container": holder.container,
            "attributed_by": "pod-resources",
        }))
    if entries:
        return entries
    if cgroup_pods:  # no pod-resources answer: the processes' pods hold it, as far as we can tell
        units = sample.device_units / len(cgroup_pods)
        names = {uid: key for key, uid in known_uids.items()}
        return [
            AgentDevice(**{**common, "device_id": sample.uuid, "units": units, "pod_uid": uid,
                           "namespace": names.get(uid, (None, None))[0], "pod": names.get(uid, (None, None))[1],
                           "attributed_by": "cgroup"})
            for uid in sorted(cgroup_pods)
        ]
    return [AgentDevice(**{**common, "device_id": sample.uuid, "units": sample.device_units})]
