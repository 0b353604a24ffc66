"""The pod-resources client against a real gRPC server on a unix socket."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpuwm.agent import podresources
from gpuwm.agent.podresources import PodResourcesClient, split_device_id
from gpuwm.config import DEFAULT_RESOURCE_NAMES
from tests.fakenvml.podresources_server import FakePod, PodResourcesServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PodResourcesServer]:
    # unix socket paths are limited to ~107 bytes: keep it short
    socket = tmp_path / "k.sock"
    fake = PodResourcesServer(socket).start()
    yield fake
    fake.stop()


def test_lists_gpu_assignments_and_replica_counts(server: PodResourcesServer) -> None:
    server.pods = [
        FakePod("team-a", "train-0", {"main": [("nvidia.com/gpu", ["GPU-1", "GPU-2"]), ("example.com/nic", ["eth1"])]}),
        FakePod("team-b", "infer", {"srv": [("nvidia.com/gpu.shared", ["GPU-3::1"])],
                                    "side": [("nvidia.com/mig-1g.10gb", ["MIG-7"])]}),
        FakePod("team-c", "cpu-only", {"app": []}),
    ]
    server.allocatable = {"nvidia.com/gpu.shared": [f"GPU-3::{i}" for i in range(6)], "nvidia.com/gpu": ["GPU-1", "GPU-2"]}
    client = PodResourcesClient(str(server.socket_path), list(DEFAULT_RESOURCE_NAMES))
    assert client.refresh(changed=True)
    assert client.healthy and client.error is None
    got = sorted((a.namespace, a.pod, a.container, a.device_id, a.uuid, a.replica) for a in client.assignments)
    assert got == [
        ("team-a", "train-0", "main", "GPU-1", "GPU-1", None),
        ("team-a", "train-0", "main", "GPU-2", "GPU-2", None),
        ("team-b", "infer", "side", "MIG-7", "MIG-7", None),
        ("team-b", "infer", "srv", "GPU-3::1", "GPU-3", 1),
    ]
    assert client.replicas == {"GPU-3": 6}
    client.close()


def test_cached_between_changes(server: PodResourcesServer) -> None:
    client = PodResourcesClient(str(server.socket_path), ["nvidia.com/gpu"], refresh_seconds=3600)
    assert client.refresh(changed=False)  # first call always lists
    assert not client.refresh(changed=False)
    assert not client.refresh(changed=False)
    assert server.list_calls == 1
    server.pods = [FakePod("ns", "new", {"c": [("nvidia.com/gpu", ["GPU-1"])]})]
    assert client.refresh(changed=True)
    assert server.list_calls == 2
    assert [a.pod for a in client.assignments] == ["new"]
    client.close()


def test_an_unchanged_answer_is_not_decoded_again(server: PodResourcesServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replica counts are asked again when the List answer changes, or after ALLOCATABLE_REFRESH_SECONDS."""
    server.pods = [FakePod("ns", "a", {"c": [("nvidia.com/gpu.shared", ["GPU-3::0"])]})]
    server.allocatable = {"nvidia.com/gpu.shared": [f"GPU-3::{i}" for i in range(4)]}
    client = PodResourcesClient(str(server.socket_path), list(DEFAULT_RESOURCE_NAMES))
    client.refresh(changed=True)
    first = client.assignments
    assert client.replicas == {"GPU-3": 4}
    server.allocatable = {"nvidia.com/gpu.shared": [f"GPU-3::{i}" for i in range(2)]}
    assert client.refresh(changed=True)
    assert client.assignments is first and client.replicas == {"GPU-3": 4}  # same answer: kept as is
    assert server.list_calls == 2 and client.healthy
    server.pods = [FakePod("ns", "b", {"c": [("nvidia.com/gpu.shared", ["GPU-3::1"])]})]
    client.refresh(changed=True)
    assert [a.pod for a in client.assignments] == ["b"] and client.replicas == {"GPU-3": 2}
    server.allocatable = {"nvidia.com/gpu.shared": [f"GPU-3::{i}" for i in range(8)]}
    monkeypatch.setattr(podresources, "ALLOCATABLE_REFRESH_SECONDS", 0.0)
    client.refresh(changed=True)
    assert client.replicas == {"GPU-3": 8}
    client.close()


def test_answers_over_four_mib(server: PodResourcesServer) -> None:
    """The gRPC default receive limit is 4 MiB; a big node's answer must still arrive."""
    server.pods = [
        FakePod("ns", f"pod-{i:05d}", {"c": [("nvidia.com/gpu", [f"GPU-{i:05d}-{'x' * 200}::{r}" for r in range(8)])]})
        for i in range(3000)
    ]
    client = PodResourcesClient(str(server.socket_path), ["nvidia.com/gpu"])
    client.refresh(changed=True)
    assert client.healthy, client.error
    assert len(client.assignments) == 3000 * 8
    client.close()


def test_missing_socket_and_failing_server(tmp_path: Path, server: PodResourcesServer) -> None:
    missing = PodResourcesClient(str(tmp_path / "absent.sock"), ["nvidia.com/gpu"])
    missing.refresh(changed=True)
    assert not missing.healthy
    assert "absent.sock not found" in (missing.error or "")

    server.pods = [FakePod("ns", "p", {"c": [("nvidia.com/gpu", ["GPU-1"])]})]
    client = PodResourcesClient(str(server.socket_path), ["nvidia.com/gpu"], timeout_seconds=1.0)
    client.refresh(changed=True)
    assert len(client.assignments) == 1
    server.stop()
    time.sleep(0.05)
    client.refresh(changed=True)
    assert not client.healthy
    assert client.assignments == []  # stale answers are dropped; the cgroup fallback takes over
    client.close()


def test_grpc_error_status_and_older_kubelets(server: PodResourcesServer) -> None:
    server.pods = [FakePod("ns", "p", {"c": [("nvidia.com/gpu.shared", ["GPU-1::0"])]})]
    server.allocatable_served = False
    client = PodResourcesClient(str(server.socket_path), list(DEFAULT_RESOURCE_NAMES))
    client.refresh(changed=True)
    assert client.healthy and [a.device_id for a in client.assignments] == ["GPU-1::0"]
    assert client.replicas == {}  # the configured replica count applies

    server.fail_with = grpc.StatusCode.PERMISSION_DENIED
    client.refresh(changed=True)
    assert not client.healthy
    assert "PERMISSION_DENIED: denied by the test server" in (client.error or "")


def test_the_agent_does_not_load_grpcio() -> None:
    """grpcio costs ~15 MiB of RSS; the agent speaks gRPC through h2 instead."""
    code = "import sys, gpuwm.agent.core, gpuwm.agent.metrics, gpuwm.agent.server; print('grpc' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_split_device_id() -> None:
    assert split_device_id("GPU-abc::12") == ("GPU-abc", 12)
    assert split_device_id("MIG-abc") == ("MIG-abc", None)


def test_one_connection_is_kept_and_reopened_after_a_kubelet_restart(tmp_path: Path) -> None:
    """List calls share one HTTP/2 connection; one the server closed is opened again on the next call."""
    socket = tmp_path / "k.sock"
    first = PodResourcesServer(socket).start()
    first.pods = [FakePod("ns", "before", {"c": [("nvidia.com/gpu", ["GPU-1"])]})]
    client = PodResourcesClient(str(socket), ["nvidia.com/gpu"], timeout_seconds=2.0)
    try:
        assert client.refresh(changed=True) and client.healthy
        kept = client._channel._sock
        assert kept is not None
        first.pods = [FakePod("ns", "again", {"c": [("nvidia.com/gpu", ["GPU-2"])]})]
        assert client.refresh(changed=True) and client.healthy
        assert client._channel._sock is kept
        assert [a.pod for a in client.assignments] == ["again"]
        assert first.list_calls == 2
        first.stop()

        second = PodResourcesServer(socket).start()  # the kubelet restarted: same path, new server
        try:
            second.pods = [FakePod("ns", "after", {"c": [("nvidia.com/gpu", ["GPU-3"])]})]
            assert client.refresh(changed=True)
            assert client.healthy, client.error
            assert [a.pod for a in client.assignments] == ["after"]
            assert client._channel._sock is not kept
        finally:
            second.stop()
    finally:
        client.close()
    assert client._channel._sock is None
