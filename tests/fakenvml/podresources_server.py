"""A real gRPC pod-resources `v1` server on a unix socket, speaking the kubelet's protocol."""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from gpuwm.agent.proto import api_pb2


@dataclass
class FakePod:
    namespace: str
    name: str
    #: container name -> [(resource name, [device IDs])]
    containers: dict[str, list[tuple[str, list[str]]]] = field(default_factory=dict)


class _Lister:
    def __init__(self, server: PodResourcesServer) -> None:
        self.server = server

    def List(self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext) -> api_pb2.ListPodResourcesResponse:
        with self.server.lock:
            self.server.list_calls += 1
            pods = list(self.server.pods)
        if self.server.fail_with is not None:
            context.abort(self.server.fail_with, "denied by the test server")
        response = api_pb2.ListPodResourcesResponse()
        for pod in pods:
            resources = response.pod_resources.add(name=pod.name, namespace=pod.namespace)
            for container, devices in pod.containers.items():
                entry = resources.containers.add(name=container)
                for resource_name, device_ids in devices:
                    entry.devices.add(resource_name=resource_name, device_ids=device_ids)
        return response

    def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        if not self.server.allocatable_served:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "GetAllocatableResources is not served (older kubelet)")
        response = api_pb2.AllocatableResourcesResponse()
        with self.server.lock:
            for resource_name, device_ids in self.server.allocatable.items():
                response.devices.add(resource_name=resource_name, device_ids=device_ids)
        return response


class PodResourcesServer:
    """Serve `pods` on `socket_path` until `stop()`; tests change `pods` under `lock`."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.pods: list[FakePod] = []
        self.allocatable: dict[str, list[str]] = {}
        self.list_calls = 0
        self.fail_with: grpc.StatusCode | None = None
        self.allocatable_served = True
        self.lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        lister = _Lister(self)
        # the kubelet's `v1.PodResourcesLister` service; `Get` is not served (UNIMPLEMENTED), as before
        handlers = {
            "List": grpc.unary_unary_rpc_method_handler(
                lister.List,
                request_deserializer=api_pb2.ListPodResourcesRequest.FromString,
                response_serializer=api_pb2.ListPodResourcesResponse.SerializeToString,
            ),
            "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
                lister.GetAllocatableResources,
                request_deserializer=api_pb2.AllocatableResourcesRequest.FromString,
                response_serializer=api_pb2.AllocatableResourcesResponse.SerializeToString,
            ),
        }
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", handlers),))
        self._server.add_insecure_port(f"unix://{socket_path}")

    def start(self) -> PodResourcesServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None).wait()
        self.socket_path.unlink(missing_ok=True)
