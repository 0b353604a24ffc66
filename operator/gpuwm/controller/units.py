"""GPU units from a pod's extended-resource requests (DESIGN §3).

A whole GPU is 1 unit, a MIG slice is its compute fraction (1g.10gb on a 7-slice GPU is
1/7), a time-sliced replica is 1/replicas. The Pod object only says which resources a
container asks for; these pure functions turn that into units so the engine can count
GPU-seconds before the agent has reported which device the pod got.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: compute slices of a whole GPU by memory per slice: the A30 (6 GB per slice) has 4, every other MIG GPU 7
_SLICES_BY_SLICE_MEMORY_GB = {6: 4}
_DEFAULT_MIG_SLICES = 7
_MIG_PROFILE = re.compile(r"(?:(\d+)c\.)?(\d+)g\.(\d+)gb")
#: GPU feature discovery's node label with the time-slicing replica count
REPLICAS_NODE_LABEL = "nvidia.com/gpu.replicas"


def matches_resource(resource_name: str, patterns: Iterable[str]) -> bool:
    """Whether an extended-resource name is one of the configured GPU names (shell globs allowed)."""
    return any(fnmatch.fnmatchcase(resource_name, pattern) for pattern in patterns)


def mig_profile(resource_name: str) -> str | None:
    """`nvidia.com/mig-1g.10gb` -> `1g.10gb`; None for a name without a MIG profile."""
    match = _MIG_PROFILE.search(resource_name.rsplit("/", 1)[-1])
    return match.group(0) if match else None


def mig_fraction(profile: str) -> float:
    """Compute fraction of a MIG profile: `3g.40gb` -> 3/7, `1g.6gb` (A30) -> 1/4, `1c.3g.40gb` -> 1/7.

    Raises ValueError naming the profile when it is not of the form `<n>g.<m>gb`.
    """
    match = _MIG_PROFILE.fullmatch(profile)
    if match is None:
        raise ValueError(f"MIG profile {profile!r} is not of the form <slices>g.<memory>gb (e.g. 1g.10gb)")
    compute_instance, slices, memory_gb = match.group(1), int(match.group(2)), int(match.group(3))
    if slices < 1:
        raise ValueError(f"MIG profile {profile!r} has no compute slices")
    total_slices = _SLICES_BY_SLICE_MEMORY_GB.get(memory_gb // slices, _DEFAULT_MIG_SLICES)
    used_slices = int(compute_instance) if compute_instance else slices
    return min(1.0, used_slices / total_slices)


def is_shared_resource(resource_name: str) -> bool:
    """Time-sliced / MPS resources renamed by the device plugin (`nvidia.com/gpu.shared`)."""
    return resource_name.endswith(".shared")


def units_per_request(resource_name: str, replicas: int) -> float:
    """GPU units one requested item of `resource_name` stands for.

    `replicas` is the time-slicing replica count on the pod's node (1 when the GPU is not shared).
    """
    profile = mig_profile(resource_name)
    if profile is not None:
        return mig_fraction(profile)
    if replicas > 1 or is_shared_resource(resource_name):
        return 1.0 / max(replicas, 1)
    return 1.0


def _container_requests(container: Mapping[str, Any]) -> Mapping[str, Any]:
    resources = container.get("resources") or {}
    # extended resources must have limits == requests; limits alone imply requests
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    return {**requests, **limits}


def _quantity(value: Any) -> float:
    """Integer quantities only make sense for extended resources; `2` and `"2"` are both 2."""
    try:
        return float(str(value))
    except ValueError:
        raise ValueError(f"resource quantity {value!r} is not a number") from None


def gpu_containers(pod_spec: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """Containers that run for the pod's life: regular ones and restartable init (sidecar) containers."""
    containers = list(pod_spec.get("containers") or [])
    containers += [c for c in pod_spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    return containers


def requested_units(
    pod_spec: Mapping[str, Any], resource_patterns: Iterable[str], replicas: int = 1, shared_replicas: int = 4
) -> dict[str, float]:
    """GPU units per container name, for the containers that request any.

    `replicas` applies to plain GPU names on a time-sliced node; `shared_replicas` to `*.shared`
    names when the node does not say (the configurable default).
    """
    patterns = list(resource_patterns)
    units: dict[str, float] = {}
    for container in gpu_containers(pod_spec):
        total = 0.0
        for resource_name, quantity in _container_requests(container).items():
            if not matches_resource(resource_name, patterns):
                continue
            node_replicas = shared_replicas if is_shared_resource(resource_name) and replicas <= 1 else replicas
            total += _quantity(quantity) * units_per_request(resource_name, node_replicas)
        if total > 0:
            units[str(container.get("name", ""))] = total
    return units


def requests_gpu(pod_spec: Mapping[str, Any] | None, resource_patterns: Iterable[str]) -> bool:
    """The kopf `when=` filter: does any long-running container request a configured GPU resource?"""
    if not pod_spec:
        return False
    patterns = list(resource_patterns)
    for container in gpu_containers(pod_spec):
        for resource_name, quantity in _container_requests(container).items():
            if matches_resource(resource_name, patterns):
                try:
                    if _quantity(quantity) > 0:
                        return True
                except ValueError:
                    return True  # malformed, but a GPU pod: the handler names it in a warning
    return False


def replicas_from_node_labels(labels: Mapping[str, str] | None) -> int:
    """Time-slicing replicas from GPU feature discovery's node label; 1 when absent or invalid."""
    if not labels:
        return 1
    try:
        return max(1, int(labels.get(REPLICAS_NODE_LABEL, "1")))
    except ValueError:
        return 1
