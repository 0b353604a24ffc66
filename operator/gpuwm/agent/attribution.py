"""Pure attribution: samples + pod-resources assignments + process cgroups -> who holds what.

No I/O here, so the decisions (replica units, which container a process belongs to, the GPU
state) are tested directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuwm.agent.cgroup import PodRef
from gpuwm.agent.podresources import Assignment
from gpuwm.model import AgentDevice, DeviceState, GpuSample, ProcessSample


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
    samples: Iterable[GpuSample],
    assignments: list[Assignment],
    replicas: dict[str, int],
    default_replicas: int,
    pod_of_pid: Callable[[int], PodRef | None],
    known_uids: dict[tuple[str, str], str],
    idle_threshold_percent: float,
) -> Attributed:
    """Attribute each sample's processes to pods and list every device with its holder.

    `known_uids` maps (namespace, pod) to UID (from the kubelet stats summary); it is updated here
    with what process cgroups reveal about pods that pod-resources names.
    """
    samples = list(samples)
    by_index = {str(s.index): s.uuid for s in samples if s.index is not None and s.parent_uuid is None}
    held: dict[str, list[Assignment]] = {}
    for assignment in assignments:
        held.setdefault(_resolve_uuid(assignment.uuid, by_index), []).append(assignment)

    out_samples: list[GpuSample] = []
    devices: list[AgentDevice] = []
    for sample in samples:
        holders = held.get(sample.uuid, [])
        processes: list[ProcessSample] | None = None
        cgroup_pods: dict[str, str | None] = {}  # pod UID -> a container name when known
        if sample.processes is not None:
            processes = []
            for process in sample.processes:
                reference = pod_of_pid(process.pid)
                container = None
                if reference is not None:
                    cgroup_pods.setdefault(reference.pod_uid, None)
                    container = _container_of(reference.pod_uid, holders, known_uids)
                processes.append(
                    process.model_copy(
                        update={"pod_uid": reference.pod_uid if reference else None, "container": container}
                    )
                )
        # one holder and one pod seen in its processes: that is the holder's UID
        if len(holders) == 1 and len(cgroup_pods) == 1:
            only = holders[0]
            known_uids.setdefault((only.namespace, only.pod), next(iter(cgroup_pods)))
            if processes:
                processes = [
                    p.model_copy(update={"container": only.container}) if p.pod_uid and p.container is None else p
                    for p in processes
                ]
        sample = sample.model_copy(update={"processes": processes})
        out_samples.append(sample)
        devices.extend(_device_entries(sample, holders, replicas, default_replicas, known_uids, cgroup_pods,
                                       idle_threshold_percent))
    return Attributed(out_samples, devices)


def _container_of(pod_uid: str, holders: list[Assignment], known_uids: dict[tuple[str, str], str]) -> str | None:
    names = {h.container for h in holders if known_uids.get((h.namespace, h.pod)) == pod_uid}
    return names.pop() if len(names) == 1 else None


def _device_entries(
    sample: GpuSample,
    holders: list[Assignment],
    replicas: dict[str, int],
    default_replicas: int,
    known_uids: dict[tuple[str, str], str],
    cgroup_pods: dict[str, str | None],
    idle_threshold_percent: float,
) -> list[AgentDevice]:
    allocated = bool(holders) or bool(cgroup_pods)
    state = classify(sample, allocated, idle_threshold_percent)
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
