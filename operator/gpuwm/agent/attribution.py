"""Pure attribution: NVML readings + pod-resources assignments + process cgroups -> who holds what.

No I/O here, so the decisions (replica units, which container a process belongs to, the GPU
state) are tested directly. The state of each holder follows DESIGN §3's attribution rule
(`utilization_by_holder`): activity is never lost to attribution. NVML's process list can be empty while a GPU computes (the processes
run in another PID namespace, a MIG instance hides them, a cgroup cannot be read), so a busy device
is never `allocated-empty` or `unallocated` for want of processes. The samples still carry the
process list as NVML gave it: the controller's engine applies the same rule to them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from gpuwm.agent.cgroup import PodRef
from gpuwm.agent.nvml import DEFAULT_MIG_SLICES
from gpuwm.agent.podresources import Assignment
from gpuwm.agent.readings import Reading
from gpuwm.feed import AgentDevice, DeviceState
from gpuwm.model import GpuSample

_SAMPLES = TypeAdapter(list[GpuSample])


@dataclass(frozen=True)
class Attributed:
    """A poll's samples with processes attributed, and the device list for `/v1/snapshot`.

    `unexplained`: UUIDs of the devices that were busy while their holders' processes explained
    less than the idle threshold of it (`utilization_by_holder`); the agent counts them.
    """

    samples: list[GpuSample]
    devices: list[AgentDevice]
    unexplained: frozenset[str] = frozenset()


@dataclass(frozen=True)
class HolderShare:
    """A pod holding part of a device: its share (its units ÷ the device's) and its UID where known."""

    share: float
    pod_uid: str | None


def utilization_by_holder(
    device_sm_percent: float | None,
    holders: list[HolderShare],
    processes: list[tuple[str | None, float | None]] | None,
    idle_threshold_percent: float,
) -> tuple[list[float | None], bool]:
    """Each holder's SM % of the device by DESIGN §3's attribution rule, and whether the processes fell short.

    `processes`: (pod UID, SM %) of each process NVML listed, None when it gave no list; a list none
    of whose processes has an SM figure is no per-process data either (the sampler reads none for a
    sole holder's device), as the engine reads it (`accounting.state.sample_values`).
    - one holder: all the device's activity is its own, device SM % ÷ its share (capped at 100),
      whatever the process list says;
    - several: each gets its processes' SM % ÷ its share (capped at 100), unless the device is busy
      (at or above the threshold) while the processes of its holders sum below it (an empty list,
      processes with no pod, a pod that holds no part of it, no SM figure), or there is no list:
      then each gets the device SM %. An empty list on an idle device still says 0 %.
    The flag is true when the device was busy and its holders' processes explained less than the
    threshold of it (with no holder at all, nothing explains it): the figures came from the device.
    """
    if device_sm_percent is None:
        return [None] * len(holders), False
    if processes and all(sm_percent is None for _, sm_percent in processes):
        processes = None
        if len(holders) == 1:  # its figure is the device's whatever the processes say: nothing fell short
            return [min(100.0, device_sm_percent / holders[0].share)], False
    uids = {holder.pod_uid for holder in holders if holder.pod_uid is not None}
    by_uid: dict[str, float] = {}
    for uid, sm_percent in processes or []:
        if uid is not None and uid in uids:
            by_uid[uid] = by_uid.get(uid, 0.0) + (sm_percent or 0.0)
    unexplained = device_sm_percent >= idle_threshold_percent and sum(by_uid.values()) < idle_threshold_percent
    if len(holders) == 1:
        return [min(100.0, device_sm_percent / holders[0].share)], unexplained
    if processes is None or unexplained:
        return [device_sm_percent] * len(holders), unexplained
    return [
        min(100.0, by_uid.get(holder.pod_uid, 0.0) / holder.share) if holder.pod_uid is not None else 0.0
        for holder in holders
    ], False


def classify(sample: GpuSample, allocated: bool, idle_threshold_percent: float) -> DeviceState:
    """The device's state now (DESIGN §3): active / idle-held / allocated-empty / unallocated.

    A busy device is `active` whether or not anyone is known to hold it or NVML lists a process:
    an empty list is what a process in another PID namespace looks like, not an idle GPU.
    """
    has_processes = bool(sample.processes)
    if not sample.healthy:
        return "unknown"
    if sample.sm_percent is not None and sample.sm_percent >= idle_threshold_percent:
        return "active"
    if not allocated and not has_processes:
        return "unallocated"
    if sample.sm_percent is None:
        return "allocated-empty" if sample.processes == [] else "unknown"
    return "idle-held" if has_processes else "allocated-empty"


def holder_state(
    sample: GpuSample, utilization_percent: float | None, has_processes: bool, idle_threshold_percent: float
) -> DeviceState:
    """A holder's state on the device: by its utilisation from `utilization_by_holder` (the device's without one)."""
    if not sample.healthy:
        return "unknown"
    if utilization_percent is None:
        return classify(sample, True, idle_threshold_percent)
    if utilization_percent >= idle_threshold_percent:
        return "active"
    return "idle-held" if has_processes else "allocated-empty"


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
    `known_uids` ((namespace, pod) -> UID, from the kubelet stats summary) learns here what process
    cgroups reveal about pods that pod-resources names."""
    readings = list(readings)
    held = _held_by_uuid(readings, assignments)
    payloads: list[dict[str, Any]] = []
    found: list[tuple[list[Assignment], set[str]]] = []
    for reading in readings:
        holders = held.get(reading.uuid, [])
        payload, cgroup_pods = _payload(reading, holders, pod_of_pid, known_uids)
        payloads.append(payload)
        found.append((holders, cgroup_pods))
    samples = _SAMPLES.validate_python(payloads)  # one call for the poll: less overhead than one per sample
    devices: list[AgentDevice] = []
    unexplained: set[str] = set()
    used: dict[tuple[Any, ...], list[AgentDevice]] = {}
    for sample, (holders, cgroup_pods) in zip(samples, found, strict=True):
        states, fell_short = _states(sample, holders, cgroup_pods, replicas, default_replicas, known_uids,
                                     idle_threshold_percent)
        if fell_short and sample.healthy:
            unexplained.add(sample.uuid)
        key = (
            sample.uuid, sample.index, sample.model, sample.parent_uuid, sample.mig_profile, sample.device_units,
            sample.healthy, sample.error, states, tuple(holders), frozenset(cgroup_pods),
            replicas.get(sample.uuid, default_replicas),
            tuple(known_uids.get((h.namespace, h.pod)) for h in holders),
            tuple(uid in known_uids.values() for uid in cgroup_pods),
        )
        # the device list rarely changes between polls: rebuild (and revalidate) it only when it does
        entries = device_cache.get(key) if device_cache is not None else None
        if entries is None:
            entries = _device_entries(sample, states, holders, replicas, default_replicas, known_uids, cgroup_pods)
        used[key] = entries
        devices.extend(entries)
    if device_cache is not None:
        device_cache.clear()
        device_cache.update(used)
    read = {sample.uuid for sample in samples}
    for uuid, holders in held.items():
        if uuid not in read:
            devices.extend(_unread_entries(uuid, holders, replicas, default_replicas, known_uids))
    return Attributed(samples, devices, frozenset(unexplained))


def _held_by_uuid(readings: list[Reading], assignments: list[Assignment]) -> dict[str, list[Assignment]]:
    """The pod-resources assignments by the UUID of the device they name (an index names a whole GPU: device
    plugins with `deviceIDStrategy: index` name GPUs `0`, `1`, ...)."""
    by_index = {
        str(r.fields["index"]): r.uuid
        for r in readings
        if r.fields.get("index") is not None and r.fields.get("parent_uuid") is None
    }
    held: dict[str, list[Assignment]] = {}
    for assignment in assignments:
        held.setdefault(by_index.get(assignment.uuid, assignment.uuid), []).append(assignment)
    return held


def _payload(
    reading: Reading, holders: list[Assignment], pod_of_pid: Callable[[int], PodRef | None],
    known_uids: dict[tuple[str, str], str],
) -> tuple[dict[str, Any], set[str]]:
    """The reading's `GpuSample` fields with its processes' pods (from their cgroups), and the pods seen so."""
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
    return {**reading.fields, "processes": processes}, cgroup_pods


_MIG_SLICES = re.compile(r"^nvidia\.com/mig-(\d+)g\.")


def _unread_entries(
    uuid: str, holders: list[Assignment], replicas: dict[str, int], default_replicas: int,
    known_uids: dict[tuple[str, str], str],
) -> list[AgentDevice]:
    """Holders of a device NVML does not list (a GPU it cannot open, whose UUID it cannot read): listed unhealthy.

    Their allocation stays known to the controller, and with no sample of the device their time
    is unmonitored, never idle. A MIG slice's units come from its resource name (slices of 7).
    """
    entries = []
    for holder in holders:
        mig = _MIG_SLICES.match(holder.resource_name)
        if holder.replica is not None:
            units = 1.0 / max(1, replicas.get(uuid, default_replicas))
        elif mig is not None:
            units = min(1.0, int(mig.group(1)) / DEFAULT_MIG_SLICES) or 1.0 / DEFAULT_MIG_SLICES
        else:
            units = 1.0
        entries.append(AgentDevice(
            uuid=uuid, device_id=holder.device_id, units=units, resource_name=holder.resource_name,
            mig_profile=holder.resource_name.removeprefix("nvidia.com/mig-") if mig is not None else None,
            namespace=holder.namespace, pod=holder.pod, pod_uid=known_uids.get((holder.namespace, holder.pod)),
            container=holder.container, attributed_by="pod-resources", state="unknown", healthy=False,
            error="the device plugin assigned this device but NVML lists no device with its UUID (a GPU it cannot "
                  "open is listed as GPU-unopened-NODE-INDEX)",
        ))
    return entries


def _units(holder: Assignment, sample: GpuSample, replicas: dict[str, int], default_replicas: int) -> float:
    """GPU units an assignment stands for: 1/replicas of a time-sliced GPU, else the device's own size."""
    if holder.replica is not None:
        return 1.0 / max(1, replicas.get(sample.uuid, default_replicas))
    return sample.device_units


def _states(
    sample: GpuSample,
    holders: list[Assignment],
    cgroup_pods: set[str],
    replicas: dict[str, int],
    default_replicas: int,
    known_uids: dict[tuple[str, str], str],
    idle_threshold_percent: float,
) -> tuple[tuple[DeviceState, ...], bool]:
    """The state of each entry `_device_entries` lists for the sample, and whether the processes fell short;
    a pod's assignments on the device (two containers, two replicas) are one holder."""
    processes = None if sample.processes is None else [(p.pod_uid, p.sm_percent) for p in sample.processes]
    if holders:
        pods: dict[tuple[str, str], float] = {}
        for holder in holders:
            key = (holder.namespace, holder.pod)
            pods[key] = pods.get(key, 0.0) + _units(holder, sample, replicas, default_replicas)
        shares = [HolderShare(min(1.0, units / sample.device_units), known_uids.get(key)) for key, units in pods.items()]
        row_of = {key: row for row, key in enumerate(pods)}
        rows = [row_of[(holder.namespace, holder.pod)] for holder in holders]
    elif cgroup_pods:
        shares = [HolderShare(1.0 / len(cgroup_pods), uid) for uid in sorted(cgroup_pods)]
        rows = list(range(len(shares)))
    else:
        shares, rows = [], []
    figures, fell_short = utilization_by_holder(sample.sm_percent, shares, processes, idle_threshold_percent)
    if not shares:
        return (classify(sample, False, idle_threshold_percent),), fell_short
    states = []
    for row in rows:
        if len(shares) == 1:
            own_processes = bool(sample.processes)
        else:
            own_processes = any(uid is not None and uid == shares[row].pod_uid for uid, _ in processes or [])
        states.append(holder_state(sample, figures[row], own_processes, idle_threshold_percent))
    return tuple(states), fell_short


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
    states: tuple[DeviceState, ...],
    holders: list[Assignment],
    replicas: dict[str, int],
    default_replicas: int,
    known_uids: dict[tuple[str, str], str],
    cgroup_pods: set[str],
) -> list[AgentDevice]:
    """One entry per holder (its state from `_states`, in the same order), or one for the device when none."""
    common = {
        "uuid": sample.uuid, "index": sample.index, "model": sample.model, "parent_uuid": sample.parent_uuid,
        "mig_profile": sample.mig_profile, "healthy": sample.healthy, "error": sample.error,
    }
    entries = []
    for holder, state in zip(holders, states if holders else (), strict=True):
        units = _units(holder, sample, replicas, default_replicas)
        profile = sample.mig_profile
        if profile is None and holder.resource_name.startswith("nvidia.com/mig-"):
            profile = holder.resource_name.removeprefix("nvidia.com/mig-")
        entries.append(AgentDevice(**{
            **common, "state": state, "mig_profile": profile, "device_id": holder.device_id, "units": units,
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
            AgentDevice(**{**common, "state": state, "device_id": sample.uuid, "units": units, "pod_uid": uid,
                           "namespace": names.get(uid, (None, None))[0], "pod": names.get(uid, (None, None))[1],
                           "attributed_by": "cgroup"})
            for uid, state in zip(sorted(cgroup_pods), states, strict=True)
        ]
    return [AgentDevice(**{**common, "state": states[0], "device_id": sample.uuid, "units": sample.device_units})]
