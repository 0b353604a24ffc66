"""Where a node's time-slicing replica count comes from: node labels, the device plugin's ConfigMap.

A pod asking for one `nvidia.com/gpu` on a node whose GPUs are time-sliced 4 ways holds a
quarter of a GPU. The node says so itself when NVIDIA GPU feature discovery runs (label
`nvidia.com/gpu.replicas`); else the device plugin's own configuration says it
(`--device-plugin-config NAMESPACE/NAME[/KEY]`, a ConfigMap whose keys are config files, one
chosen per node by the label `nvidia.com/device-plugin.config`); else the configured default
applies to `*.shared` names and plain names are whole GPUs. The precedence lives in
`units.NodeSharing`; this module fetches and caches the inputs.

Node labels arrive through a watch on nodes (`on_node`, kopf keeps it) and only the two
sharing labels are kept; a node not seen yet is read once with `get`. The ConfigMap is read
again every `CONFIG_REFRESH_SECONDS`.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from gpuwm.controller.kube import KubeApiError, KubeClient, resource_path
from gpuwm.controller.pull import DeviceHolder
from gpuwm.controller.watch.pods import TrackedPod
from gpuwm.controller.watch.units import (
    SHARING_NODE_LABELS,
    NodeSharing,
    device_plugin_config_key,
    device_plugin_replicas,
    is_shared_resource,
    mig_profile,
    node_replicas_label,
)
from gpuwm.model import ENDED_POD_PHASES

logger = logging.getLogger(__name__)

#: a node read with `get` (no watch event yet) is read again after this long
NODE_CACHE_SECONDS = 600.0
CONFIG_REFRESH_SECONDS = 60.0
_CONFIG_SPEC = re.compile(r"(?P<namespace>[a-z0-9]([-a-z0-9]*[a-z0-9])?)/(?P<name>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)"
                          r"(/(?P<key>[-._a-zA-Z0-9]+))?")


class ConfigRef(NamedTuple):
    """The device plugin's ConfigMap, and the key of its data a node without a config label uses."""

    namespace: str
    name: str
    default_key: str | None


def parse_device_plugin_config(spec: str) -> ConfigRef:
    """`NAMESPACE/NAME[/KEY]` -> its `ConfigRef`; ValueError naming the spec otherwise."""
    match = _CONFIG_SPEC.fullmatch(spec.strip())
    if match is None:
        raise ValueError(f"device plugin config {spec!r} is not NAMESPACE/NAME or NAMESPACE/NAME/KEY "
                         "(e.g. gpu-operator/time-slicing-config/any)")
    return ConfigRef(match.group("namespace"), match.group("name"), match.group("key"))


class NodeLabels(NamedTuple):
    """A node's sharing labels, and when they were read."""

    read_at: float
    labels: dict[str, str]


class SharingSource:
    """Answers `of_node(node)` from cached node labels and the device plugin's ConfigMap."""

    def __init__(
        self,
        client: KubeClient,
        *,
        default_shared_replicas: int,
        device_plugin_config: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._default = default_shared_replicas
        self._config_ref = parse_device_plugin_config(device_plugin_config) if device_plugin_config else None
        self._clock = clock
        #: node -> its sharing labels; watch events are stored as read at +inf (always fresh)
        self._labels: dict[str, NodeLabels] = {}
        self._config: dict[str, dict[str, int]] = {}  # ConfigMap key -> replicas per resource name
        self._config_read_at: float | None = None
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ inputs

    def on_node(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """A node watch event: keep its sharing labels (or forget a deleted node)."""
        metadata = body.get("metadata") or {}
        name = metadata.get("name")
        if not name:
            return
        if deleted:
            self._labels.pop(str(name), None)
            return
        self._labels[str(name)] = NodeLabels(float("inf"), _sharing_labels(metadata.get("labels")))

    def changes(self, body: Mapping[str, Any]) -> bool:
        """Whether a node event would change what is known of its sharing labels (kopf's `when=`: the
        many node status updates then cost no handler call and no log line)."""
        metadata = body.get("metadata") or {}
        known = self._labels.get(str(metadata.get("name")))
        return (known is None or known.read_at != float("inf")
                or known.labels != _sharing_labels(metadata.get("labels")))

    async def _node_labels(self, node: str) -> dict[str, str]:
        cached = self._labels.get(node)
        now = self._clock()
        if cached is not None and now - cached.read_at < NODE_CACHE_SECONDS:
            return cached.labels
        try:
            obj = await self._client.get(resource_path("v1", "nodes", None, node))
            labels = _sharing_labels(((obj or {}).get("metadata") or {}).get("labels"))
        except KubeApiError as error:
            self._warn_once(f"node:{error.status}", f"cannot read node {node} for its time-slicing labels ({error}); "
                            "the chart grants get/list/watch on nodes")
            labels = {}
        if node not in self._labels or self._labels[node].read_at != float("inf"):  # a watch event meanwhile wins
            self._labels[node] = NodeLabels(now, labels)
        return labels

    async def _device_plugin_config(self) -> dict[str, dict[str, int]]:
        if self._config_ref is None:
            return {}
        now = self._clock()
        if self._config_read_at is not None and now - self._config_read_at < CONFIG_REFRESH_SECONDS:
            return self._config
        self._config_read_at = now
        namespace, name, _ = self._config_ref
        try:
            obj = await self._client.get(resource_path("v1", "configmaps", namespace, name))
        except KubeApiError as error:
            hint = (" (the chart grants it when devicePluginConfig is set; else grant get on that ConfigMap)"
                    if error.status == 403 else "")
            self._warn_once(f"config:{error.status}", f"cannot read the device plugin ConfigMap {namespace}/{name}: "
                            f"{error}{hint}; using node labels and --time-sliced-replicas")
            return self._config  # keep what was read before
        if obj is None:
            self._warn_once("config:404", f"device plugin ConfigMap {namespace}/{name} not found (--device-plugin-"
                            "config); using node labels and --time-sliced-replicas")
            self._config = {}
            return self._config
        config: dict[str, dict[str, int]] = {}
        for key, text in (obj.get("data") or {}).items():
            try:
                config[str(key)] = device_plugin_replicas(str(text))
            except ValueError as error:
                self._warn_once(f"config-key:{key}", f"device plugin ConfigMap {namespace}/{name} key {key!r}: "
                                f"{error}; that configuration is ignored")
        self._config = config
        return config

    # ------------------------------------------------------------------ the answer

    async def of_node(self, node: str) -> NodeSharing:
        """The node's sharing: its replicas label, else its device plugin config, else the default."""
        labels = await self._node_labels(node)
        replicas = node_replicas_label(labels)
        if replicas is not None:
            return NodeSharing(node_replicas=replicas, default_shared_replicas=self._default,
                               source=f"node label {SHARING_NODE_LABELS[0]}")
        config = await self._device_plugin_config()
        if self._config_ref is not None and config:
            ref = self._config_ref
            key = device_plugin_config_key(labels, config, ref.default_key)
            if key is not None:
                return NodeSharing(resource_replicas=config[key], default_shared_replicas=self._default,
                                   source=f"ConfigMap {ref.namespace}/{ref.name} key {key}")
        return NodeSharing(default_shared_replicas=self._default)

    def may_share(self, node: str) -> bool:
        """Whether the node's GPUs may be time-sliced or shared through MPS, from what is cached (no API call).

        No when its replicas label says 1, or when it has none and no device plugin configuration
        read shares anything; yes while nothing is known of the node or the configuration is unread.
        """
        cached = self._labels.get(node)
        if cached is None:
            return True
        replicas = node_replicas_label(cached.labels)
        if replicas is not None:
            return replicas > 1
        return self._config_ref is not None and (self._config_read_at is None or any(
            count > 1 for config in self._config.values() for count in config.values()))

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)


def _sharing_labels(labels: Mapping[str, Any] | None) -> dict[str, str]:
    return {key: str(value) for key, value in (labels or {}).items() if key in SHARING_NODE_LABELS}


def whole_device_nodes(
    nodes: Iterable[str], sharing: SharingSource, pods: Iterable[TrackedPod],
    holders_by_node: Mapping[str, Sequence[DeviceHolder]],
) -> set[str]:
    """The nodes among `nodes` whose every device is held whole, as far as the controller knows.

    What the agents' merging may rely on there (`MergeRequest.exact_replicas` 1): no holder gets
    part of a device, so no capped figure (a share's SM % over its share, at most 100) can tell
    two polls apart that the device's own figure does not. A node qualifies when its GPUs are not
    shared (`SharingSource.may_share`), each of its pods asks for whole GPUs (whole units in every
    container: a time-sliced replica or a MIG slice is a fraction), and each device the agent last
    named on it has one holder, a pod the controller tracks, on a resource that is neither a MIG
    slice nor `*.shared`, through a device ID that is not a replica's (`GPU-...::N`), with the agent's
    own count of its units whole. Anything unknown leaves the node out: its agent then keeps every
    share exact down to the merge request's default (`feed.merge.EXACT_UP_TO_REPLICAS`).
    The pod watch learns of a pod when it is bound, before its containers start, so a pod that
    could hold part of a device takes its node out before that pod's first poll.
    """
    whole = {node for node in nodes if not sharing.may_share(node)}
    asks_whole: dict[str, bool] = {}  # each tracked pod's answer, by UID: asked once, read again per device it holds
    for pod in pods:
        asks = asks_whole[pod.uid] = all(units == int(units) for units in pod.units_by_container.values())
        if not asks and pod.node in whole and pod.phase not in ENDED_POD_PHASES:
            whole.discard(pod.node)
    whole_resources: dict[str | None, bool] = {}
    for node, holders in holders_by_node.items():
        if node not in whole:
            continue
        held: set[str] = set()
        for holder in holders:
            name, device_id = holder.resource_name, holder.device_id or ""
            whole_resource = whole_resources.get(name)
            if whole_resource is None:  # a cluster has a few resource names: each judged once, not once per device
                whole_resource = whole_resources[name] = (name is not None and mig_profile(name) is None
                                                          and not is_shared_resource(name))
            if (not asks_whole.get(holder.pod_uid or "", False) or not whole_resource or "::" in device_id
                    or holder.uuid in held
                    or holder.units not in (None, 1.0)):  # the agent's own share of a whole-GPU resource
                whole.discard(node)
                break
            held.add(holder.uuid)
    return whole
