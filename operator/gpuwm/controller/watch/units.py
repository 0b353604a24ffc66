"""GPU units from a pod's extended-resource requests (DESIGN §3).

A whole GPU is 1 unit, a MIG slice is its compute fraction (1g.10gb on a 7-slice GPU is
1/7), a time-sliced replica is 1/replicas. The Pod object only says which resources a
container asks for; these pure functions turn that into units so the engine can count
GPU-seconds before the agent has reported which device the pod got.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

#: compute slices of a whole GPU by memory per slice: the A30 (6 GB per slice) has 4, every other MIG GPU 7
_SLICES_BY_SLICE_MEMORY_GB = {6: 4}
_DEFAULT_MIG_SLICES = 7
_MIG_PROFILE = re.compile(r"(?:(\d+)c\.)?(\d+)g\.(\d+)gb")
#: GPU feature discovery's node label with the time-slicing replica count
REPLICAS_NODE_LABEL = "nvidia.com/gpu.replicas"
#: the NVIDIA device plugin's per-node choice of configuration: a key of its ConfigMap
DEVICE_PLUGIN_CONFIG_NODE_LABEL = "nvidia.com/device-plugin.config"
#: the node labels the controller keeps (nothing else of a Node object)
SHARING_NODE_LABELS = (REPLICAS_NODE_LABEL, DEVICE_PLUGIN_CONFIG_NODE_LABEL)


@dataclass(frozen=True)
class NodeSharing:
    """How one node's GPUs are shared, from the most authoritative source that says.

    1. GPU feature discovery's node label `nvidia.com/gpu.replicas` (what the node really
       advertises; 1 where the GPUs are not shared);
    2. else the device plugin's configuration (`sharing.timeSlicing` / `sharing.mps`
       `resources[].{name, replicas}`), the node's own key or the default one;
    3. else `nvidia.com/gpu` is whole and `*.shared` names use the configured default.
    """

    node_replicas: int | None = None
    resource_replicas: Mapping[str, int] = field(default_factory=dict)
    default_shared_replicas: int = 4
    source: str = "default"

    def replicas_for(self, resource_name: str) -> int:
        """Replicas per physical GPU behind one item of `resource_name` on this node."""
        if self.node_replicas is not None:
            return self.node_replicas
        if resource_name in self.resource_replicas:
            return self.resource_replicas[resource_name]
        return self.default_shared_replicas if is_shared_resource(resource_name) else 1


def node_replicas_label(labels: Mapping[str, str] | None) -> int | None:
    """The replica count GPU feature discovery put on the node; None when absent or not a positive integer."""
    raw = (labels or {}).get(REPLICAS_NODE_LABEL)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 1 else None


def device_plugin_replicas(config_text: str) -> dict[str, int]:
    """Replicas per advertised resource name from one device plugin config file (YAML or JSON).

    `sharing.timeSlicing.resources[]` and `sharing.mps.resources[]` entries `{name, replicas,
    rename}`; with `renameByDefault: true` a resource is advertised as `<name>.shared`.
    Raises ValueError naming what is wrong.
    """
    try:
        document = yaml.safe_load(config_text) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"not YAML: {error}") from None
    if not isinstance(document, Mapping):
        raise ValueError("the config is not a mapping")
    sharing = document.get("sharing") or {}
    if not isinstance(sharing, Mapping):
        raise ValueError("`sharing` is not a mapping")
    replicas: dict[str, int] = {}
    for strategy in ("timeSlicing", "mps"):
        section = sharing.get(strategy) or {}
        if not isinstance(section, Mapping):
            raise ValueError(f"`sharing.{strategy}` is not a mapping")
        rename_by_default = bool(section.get("renameByDefault", False))
        for index, resource in enumerate(section.get("resources") or []):
            where = f"sharing.{strategy}.resources[{index}]"
            if not isinstance(resource, Mapping) or not resource.get("name"):
                raise ValueError(f"{where} has no name")
            count = resource.get("replicas")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"{where}.replicas must be a positive integer, got {count!r}")
            name = str(resource["name"])
            advertised = str(resource.get("rename") or (f"{name}.shared" if rename_by_default else name))
            replicas[advertised] = count
    return replicas


def device_plugin_config_key(
    node_labels: Mapping[str, str] | None, keys: Iterable[str], default_key: str | None
) -> str | None:
    """Which ConfigMap key applies to a node: its `nvidia.com/device-plugin.config` label, else the
    default key, else the only key there is; None when none applies."""
    available = list(keys)
    chosen = (node_labels or {}).get(DEVICE_PLUGIN_CONFIG_NODE_LABEL)
    if chosen in available:
        return chosen
    if default_key is not None:
        return default_key if default_key in available else None
    return available[0] if len(available) == 1 else None


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
    return {**(resources.get("requests") or {}), **(resources.get("limits") or {})}


def _quantity(value: Any) -> float:
    """Integer quantities only make sense for extended resources; `2` and `"2"` are both 2.

    `float` also reads "NaN", "inf" and "1e999": refused, they would make every GPU-second of the pod NaN
    or infinite (a real API server refuses them; an emulator or a hand-made object may not).
    """
    try:
        quantity = float(str(value))
    except ValueError:
        raise ValueError(f"resource quantity {value!r} is not a number") from None
    if not math.isfinite(quantity):
        raise ValueError(f"resource quantity {value!r} is not a finite number")
    return quantity


def gpu_containers(pod_spec: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """Containers that run for the pod's life: regular ones and restartable init (sidecar) containers."""
    containers = list(pod_spec.get("containers") or [])
    containers += [c for c in pod_spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    return containers


def requested_units(
    pod_spec: Mapping[str, Any], resource_patterns: Iterable[str], replicas: int | NodeSharing = 1,
    shared_replicas: int = 4,
) -> dict[str, float]:
    """GPU units per container name, for the containers that request any.

    `replicas` is the node's sharing (a NodeSharing), or a plain replica count that applies to
    plain GPU names on a time-sliced node, with `shared_replicas` for `*.shared` names when
    the node does not say (the configurable default).
    """
    patterns = list(resource_patterns)
    units: dict[str, float] = {}
    for container in gpu_containers(pod_spec):
        total = 0.0
        for resource_name, quantity in _container_requests(container).items():
            if not matches_resource(resource_name, patterns):
                continue
            if isinstance(replicas, NodeSharing):
                node_replicas = replicas.replicas_for(resource_name)
            else:
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
