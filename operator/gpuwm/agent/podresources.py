"""Which pod and container hold each GPU: the kubelet's pod-resources `v1` gRPC API, cached.

The calls go through `grpcunary` (HTTP/2 on the pure-Python h2 library) with the messages generated
from the kubelet's api.proto; the receive limit is raised (`MAX_RECEIVE_BYTES`).

`List` is called when the agent sees the GPU or process set change and otherwise at most every
`refresh_seconds`, never per scrape. `GetAllocatableResources` (where the kubelet serves it) tells
how many time-sliced replicas a GPU has, so `GPU-uuid::2` is 1/replicas of the GPU.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from gpuwm.agent.grpcunary import GrpcError, UnaryChannel
from gpuwm.agent.proto import api_pb2

log = logging.getLogger(__name__)

#: the kubelet's answer grows with pods x devices; the gRPC default of 4 MiB is too small on big nodes
MAX_RECEIVE_BYTES = 64 * 1024 * 1024
_LIST = "/v1.PodResourcesLister/List"
_ALLOCATABLE = "/v1.PodResourcesLister/GetAllocatableResources"
_REPLICA = re.compile(r"^(?P<uuid>.+)::(?P<replica>\d+)$")
#: replica counts change only with the device plugin's configuration: ask again at most this often
#: while the List answer stays the same
ALLOCATABLE_REFRESH_SECONDS = 60.0


@dataclass(frozen=True)
class Assignment:
    """A device (plugin ID) held by a container."""

    device_id: str
    uuid: str
    replica: int | None
    resource_name: str
    namespace: str
    pod: str
    container: str


def split_device_id(device_id: str) -> tuple[str, int | None]:
    """`GPU-x::2` -> (`GPU-x`, 2); `GPU-x` -> (`GPU-x`, None)."""
    match = _REPLICA.match(device_id)
    if match:
        return match.group("uuid"), int(match.group("replica"))
    return device_id, None


class PodResourcesClient:
    """A cached view of the kubelet's device assignments for GPU resources."""

    def __init__(
        self,
        socket_path: str,
        resource_names: list[str],
        refresh_seconds: float = 10.0,
        timeout_seconds: float = 2.0,
    ) -> None:
        self.socket_path = socket_path
        self.resource_names = resource_names
        self.refresh_seconds = refresh_seconds
        self.timeout_seconds = timeout_seconds
        self.assignments: list[Assignment] = []
        self.replicas: dict[str, int] = {}
        self.healthy = False
        self.error: str | None = "not listed yet"
        self._listed_at = -float("inf")
        self._list_reply: bytes | None = None  # the last List answer, as received
        self._allocatable_at = -float("inf")
        self._channel = UnaryChannel(socket_path)

    def _is_gpu(self, resource_name: str) -> bool:
        return any(fnmatch.fnmatchcase(resource_name, pattern) for pattern in self.resource_names)

    def _call(self, method: str, request: Any) -> bytes:
        return self._channel.call(method, request.SerializeToString(), self.timeout_seconds, MAX_RECEIVE_BYTES)

    def close(self) -> None:
        """Close the kept connection (the next call opens a new one)."""
        self._channel.close()

    def refresh(self, changed: bool) -> bool:
        """List again if something changed or the cache is old; returns True when it listed."""
        age = time.monotonic() - self._listed_at
        if not changed and age < self.refresh_seconds:
            return False
        self._listed_at = time.monotonic()
        if not os.path.exists(self.socket_path):
            self._channel.close()
            self._fail(f"pod-resources socket {self.socket_path} not found; mount the kubelet's pod-resources directory")
            return True
        try:
            reply = self._call(_LIST, api_pb2.ListPodResourcesRequest())
            # the same answer as last time (the usual case): nothing to decode or rebuild
            if self.healthy and reply == self._list_reply and (
                time.monotonic() - self._allocatable_at < ALLOCATABLE_REFRESH_SECONDS
            ):
                return True
            response = api_pb2.ListPodResourcesResponse.FromString(reply)
        except (GrpcError, DecodeError) as error:
            self._fail(f"pod-resources List on {self.socket_path} failed: {error}")
            return True
        self.assignments = self._assignments(response)
        self._list_reply = reply
        self._refresh_replicas()
        if not self.healthy:
            log.info("pod-resources connected", extra={"socket": self.socket_path})
        self.healthy, self.error = True, None
        return True

    def _fail(self, message: str) -> None:
        if self.healthy or self.error != message:
            log.warning("%s; attributing by process cgroups only", message)
        # stale assignments could name pods that are gone: drop them, the cgroup fallback takes over
        self.healthy, self.error, self.assignments = False, message, []

    def _assignments(self, response: api_pb2.ListPodResourcesResponse) -> list[Assignment]:
        return [
            Assignment(device_id, *split_device_id(device_id), devices.resource_name, pod.namespace, pod.name,
                       container.name)
            for pod in response.pod_resources
            for container in pod.containers
            for devices in container.devices if self._is_gpu(devices.resource_name)
            for device_id in devices.device_ids
        ]

    def _refresh_replicas(self) -> None:
        """Replicas per GPU from the allocatable device IDs (`GPU-x::0` ... `GPU-x::N-1`)."""
        self._allocatable_at = time.monotonic()
        try:
            response = api_pb2.AllocatableResourcesResponse.FromString(
                self._call(_ALLOCATABLE, api_pb2.AllocatableResourcesRequest()))
        except (GrpcError, DecodeError) as error:
            log.debug("pod-resources GetAllocatableResources unavailable: %s", error)
            return
        device_ids = [device_id for devices in response.devices if self._is_gpu(devices.resource_name)
                      for device_id in devices.device_ids]
        split = [split_device_id(device_id) for device_id in device_ids]
        self.replicas = dict(Counter(uuid for uuid, replica in split if replica is not None))
