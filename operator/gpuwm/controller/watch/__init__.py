"""What the controller reads from the cluster: pods, their owners, workload objects and GPU sharing.

Turns watched Kubernetes objects into the engine's pod and workload events (requested GPU units,
the owner walk to the workload, each workload kind's reading, the device plugin's sharing). It
reads through `kube` and names device holders from `pull`; it builds no status.
"""

from gpuwm.controller.watch.owners import OwnerResolver
from gpuwm.controller.watch.pods import (
    MalformedPodError,
    TrackedPod,
    as_of,
    device_allocations,
    pod_event,
    state_key,
    track_pod,
    workload_uid_of,
)
from gpuwm.controller.watch.sharing import SharingSource, whole_device_nodes
from gpuwm.controller.watch.units import requests_gpu
from gpuwm.controller.watch.workload_kinds import WorkloadKind, parse_workload_kinds
from gpuwm.controller.watch.workload_objects import WorkloadObjects

__all__ = [
    "MalformedPodError", "OwnerResolver", "SharingSource", "TrackedPod", "WorkloadKind", "WorkloadObjects",
    "as_of", "device_allocations", "parse_workload_kinds", "pod_event", "requests_gpu", "state_key",
    "track_pod", "whole_device_nodes", "workload_uid_of",
]
