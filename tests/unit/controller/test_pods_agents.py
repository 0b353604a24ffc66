"""Pods -> engine events joined with the agents' attribution; agent specs and snapshots; the writer queue."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuwm.accounting import Engine
from gpuwm.config import DEFAULT_RESOURCE_NAMES
from gpuwm.controller.kube.client import KubeApiError
from gpuwm.controller.kube.ratelimit import TokenBucket
from gpuwm.controller.pull import PodAgents, SampleIntake, StaticAgents, parse_agents_spec
from gpuwm.controller.status.writer import Desired, StatusWriter
from gpuwm.controller.watch.pods import MalformedPodError, device_allocations, pod_event, state_key, track_pod
from gpuwm.feed import sample_columns
from gpuwm.feed.decode import DeviceHolder, Snapshot, parse_snapshot
from gpuwm.model.trace import TraceWorkload

JOB = TraceWorkload(api_version="batch/v1", kind="Job", name="train", uid="j1", created=0.0)


def pod_body(limits: dict[str, Any], phase: str = "Running", containers: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "train-0", "namespace": "ns", "uid": "p1", "labels": {"a": "b"},
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": "n1", "containers": [{"name": f"c{i}", "resources": {"limits": limits}}
                                                  for i in range(containers)]},
        "status": {"phase": phase, "containerStatuses": [
            {"name": "c0", "state": {"running": {"startedAt": "2026-01-01T00:00:30Z"}}}]},
    }


def test_track_pod_reads_phase_start_and_units() -> None:
    pod = track_pod(pod_body({"nvidia.com/gpu": "2"}), JOB, DEFAULT_RESOURCE_NAMES, deleted=False)
    assert (pod.phase, pod.node, pod.requested_units) == ("Running", "n1", 2.0)
    assert pod.phase_since == pytest.approx(1767225630.0)
    assert track_pod(pod_body({"nvidia.com/gpu": "2"}), JOB, DEFAULT_RESOURCE_NAMES, deleted=True).phase == "Deleted"


def test_track_pod_names_what_is_malformed() -> None:
    with pytest.raises(MalformedPodError, match="ns/train-0"):
        track_pod(pod_body({"nvidia.com/gpu": "many"}), JOB, DEFAULT_RESOURCE_NAMES, deleted=False)
    with pytest.raises(MalformedPodError, match="spec"):
        track_pod({"metadata": {"name": "x", "namespace": "ns", "uid": "u"}}, JOB, DEFAULT_RESOURCE_NAMES, deleted=False)


def test_device_allocations_split_container_units() -> None:
    pod = track_pod(pod_body({"nvidia.com/gpu": "2"}), JOB, DEFAULT_RESOURCE_NAMES, deleted=False)
    holders = [DeviceHolder(uuid="GPU-1", namespace="ns", pod="train-0", container="c0"),  # pod-resources: by name
               DeviceHolder(uuid="GPU-2", pod_uid="p1", container="c0"),  # by UID
               DeviceHolder(uuid="GPU-3", pod_uid="other", container="c0")]
    devices = device_allocations(pod, holders)
    assert [(d.uuid, d.units) for d in devices] == [("GPU-1", 1.0), ("GPU-2", 1.0)]
    mig = track_pod(pod_body({"nvidia.com/mig-1g.10gb": "1"}), JOB, DEFAULT_RESOURCE_NAMES, deleted=False)
    assert device_allocations(mig, [DeviceHolder(uuid="MIG-1", pod_uid="p1", container="c0")])[0].units == pytest.approx(1 / 7)
    shared = track_pod(pod_body({"nvidia.com/gpu": "1"}), JOB, DEFAULT_RESOURCE_NAMES, deleted=False, replicas=4)
    assert device_allocations(shared, [DeviceHolder(uuid="GPU-9", pod_uid="p1", container="c0")])[0].units == 0.25
    # the agent's own units win (NVML knows the slice; the kubelet knows the replicas), replicas add up
    agent_said = [DeviceHolder(uuid="GPU-7", device_id="GPU-7::0", pod_uid="p1", container="c0", units=0.25),
                  DeviceHolder(uuid="GPU-7", device_id="GPU-7::3", pod_uid="p1", container="c0", units=0.25)]
    assert [(d.uuid, d.units) for d in device_allocations(pod, agent_said)] == [("GPU-7", 0.5)]


def test_pod_event_holds_devices_only_while_running() -> None:
    holders = [DeviceHolder(uuid="GPU-1", pod_uid="p1", container="c0")]
    running = track_pod(pod_body({"nvidia.com/gpu": "1"}), JOB, DEFAULT_RESOURCE_NAMES, deleted=False)
    event = pod_event(running, device_allocations(running, holders), 10.0)
    assert event.phase == "Running" and [d.uuid for d in event.devices] == ["GPU-1"] and event.workload.uid == "j1"
    done = track_pod(pod_body({"nvidia.com/gpu": "1"}, phase="Succeeded"), JOB, DEFAULT_RESOURCE_NAMES, deleted=False)
    assert pod_event(done, device_allocations(done, holders), 20.0).devices == []
    assert state_key(running, device_allocations(running, holders)) != state_key(running, [])


def test_parse_agents_spec() -> None:
    static = parse_agents_spec("static:node-a=http://10.0.0.1:9400,node-b=http://10.0.0.2:9400/")
    assert isinstance(static, StaticAgents) and static.urls["node-b"] == "http://10.0.0.2:9400"
    pods = parse_agents_spec("pods:gpuwm/app.kubernetes.io/component=agent")
    assert isinstance(pods, PodAgents) and pods.namespace == "gpuwm"
    assert pods.matches("gpuwm", {"app.kubernetes.io/component": "agent"})
    assert not pods.matches("other", {"app.kubernetes.io/component": "agent"})
    assert not pods.matches("gpuwm", {"app.kubernetes.io/component": "controller"})
    for bad in ("static:node-a", "pods:gpuwm", "dns:x", "static:"):
        with pytest.raises(ValueError, match="--agents"):
            parse_agents_spec(bad)


def test_parse_snapshot_in_the_agents_format() -> None:
    snapshot = parse_snapshot({
        "node": "n1", "seq": 7, "agent_id": "abc", "format": "columns",
        **sample_columns([{"t": 1.0, "node": "n1", "uuid": "GPU-1", "seq": 7, "sm_percent": 10}]),
        "devices": [{"uuid": "GPU-1", "device_id": "GPU-1", "units": 1, "namespace": "ns", "pod": "p",
                     "container": "c", "state": "active"},
                    {"uuid": "GPU-2", "device_id": "GPU-2", "units": 1, "state": "unallocated"}],
        "pod_stats": [],
    }, "n1")
    assert (snapshot.seq, snapshot.agent_id, snapshot.sample_count) == (7, "abc", 1)
    assert [h.pod_key for h in snapshot.holders] == ["ns/p"]  # the unallocated GPU has no holder
    with pytest.raises(ValueError, match="'n1'"):
        parse_snapshot({"format": "columns", **sample_columns([{"t": "soon"}])}, "n1")


class RecordingClient:
    def __init__(self, fail_first: int = 0) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail_first = fail_first

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        self.calls.append(("POST", path))
        return {}

    async def merge_patch(self, path: str, body: Any, **_: Any) -> dict[str, Any]:
        self.calls.append(("PATCH", path))
        if self.fail_first:
            self.fail_first -= 1
            raise KubeApiError(404, "PATCH", path, "gone")
        return {}

    async def delete(self, path: str) -> None:
        self.calls.append(("DELETE", path))


def desired(name: str, allocated: float, moved: float = 0.0) -> Desired:
    return Desired(plural="gpuworkloadmetrics", namespace="ns", name=name, spec={}, labels={},
                   render=lambda: {"allocatedGpus": allocated, "phase": "Running"},
                   signature=("Running", allocated), counters=(moved,))


async def test_writer_creates_once_then_patches_status_and_skips_repeats() -> None:
    client = RecordingClient()
    writer = StatusWriter(client, TokenBucket(1000), interval_seconds=15, clock=lambda: 100.0)  # type: ignore[arg-type]
    assert writer.offer(desired("a", 1)) == "material"
    await writer.write(writer._next())  # type: ignore[arg-type]
    assert client.calls == [("POST", "/apis/gpuwm.io/v1alpha1/namespaces/ns/gpuworkloadmetrics"),
                            ("PATCH", "/apis/gpuwm.io/v1alpha1/namespaces/ns/gpuworkloadmetrics/a/status")]
    assert writer.offer(desired("a", 1)) == "none" and writer.pending == 0
    assert writer.offer(desired("a", 2)) == "material"
    await writer.write(writer._next())  # type: ignore[arg-type]
    assert client.calls[-1][0] == "PATCH" and len(client.calls) == 3


async def test_writer_recreates_a_cr_deleted_behind_its_back() -> None:
    client = RecordingClient(fail_first=1)
    writer = StatusWriter(client, TokenBucket(1000), interval_seconds=15)  # type: ignore[arg-type]
    writer.existing.add(("gpuworkloadmetrics", "ns", "a"))
    writer.offer(desired("a", 1))
    await writer.write(writer._next())  # type: ignore[arg-type]
    assert [method for method, _ in client.calls] == ["PATCH", "POST", "PATCH"]


async def test_writer_news_first_and_at_the_bucket_rate() -> None:
    client = RecordingClient()
    now = [0.0]
    writer = StatusWriter(client, TokenBucket(10, burst=1, clock=lambda: now[0]), interval_seconds=15,  # type: ignore[arg-type]
                          clock=lambda: now[0])
    writer.offer(desired("old", 1))
    await writer.write(writer._next())  # type: ignore[arg-type]
    now[0] = 20.0
    assert writer.offer(desired("old", 1, moved=5.0)) == "due"  # counters moved, interval passed
    for index in range(3):
        writer.offer(desired(f"w{index}", 1))
    assert writer.offer(desired("w0", 1)) == "material"  # re-offered: keeps its place, latest figures
    order = [writer._next().name for _ in range(4)]  # type: ignore[union-attr]
    assert order == ["w0", "w1", "w2", "old"]  # refreshes wait behind news
    task = asyncio.create_task(writer.run())
    for index in range(3):
        writer.offer(desired(f"x{index}", 1))
    await asyncio.sleep(0.05)
    assert len(client.calls) <= 4  # one token (burst 1), frozen clock: at most one write (create + patch)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_agent_url_of_pod_uses_the_declared_port() -> None:
    from gpuwm.controller.pull.agents import agent_url_of_pod

    pod: dict[str, Any] = {"spec": {"nodeName": "n1", "containers": [{"name": "agent", "ports": [
        {"name": "grpc", "containerPort": 9000}, {"name": "http", "containerPort": 9500}]}]},
        "status": {"phase": "Running", "podIP": "10.1.2.3"}}
    assert agent_url_of_pod(pod, 9400) == ("n1", "http://10.1.2.3:9500")
    pod["spec"]["containers"][0]["ports"] = []
    pod["status"]["podIP"] = "fd00::1"
    assert agent_url_of_pod(pod, 9400) == ("n1", "http://[fd00::1]:9400")
    pod["status"]["phase"] = "Pending"
    assert agent_url_of_pod(pod, 9400) is None


class ConflictingClient(RecordingClient):
    def __init__(self, labels: dict[str, str]) -> None:
        super().__init__()
        self.labels = labels

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        self.calls.append(("POST", path))
        raise KubeApiError(409, "POST", path, "already exists")

    async def list_items(self, path: str, params: Any = None) -> list[dict[str, Any]]:
        self.calls.append(("LIST", path))
        return [{"metadata": {"name": "a", "labels": self.labels}}]


async def test_writer_leaves_a_foreign_cr_alone(caplog: pytest.LogCaptureFixture) -> None:
    client = ConflictingClient({"team": "someone-else"})
    writer = StatusWriter(client, TokenBucket(1000), interval_seconds=15)  # type: ignore[arg-type]
    writer.offer(desired("a", 1))
    await writer.write(writer._next())  # type: ignore[arg-type]
    assert [method for method, _ in client.calls] == ["POST", "LIST"]  # no PATCH of someone else's object
    assert "ns/a exists and is not managed by gpuwm" in caplog.text
    assert writer.offer(desired("a", 2)) == "none" and writer.pending == 0


async def test_writer_adopts_its_own_cr_on_conflict() -> None:
    client = ConflictingClient({"app.kubernetes.io/managed-by": "gpuwm"})
    writer = StatusWriter(client, TokenBucket(1000), interval_seconds=15)  # type: ignore[arg-type]
    writer.offer(desired("a", 1))
    await writer.write(writer._next())  # type: ignore[arg-type]
    assert [method for method, _ in client.calls] == ["POST", "LIST", "PATCH", "PATCH"]  # spec/labels, then status


class FailingClient(RecordingClient):
    async def merge_patch(self, path: str, body: Any, **_: Any) -> dict[str, Any]:
        self.calls.append(("PATCH", path))
        if "/bad/" in path:
            raise KubeApiError(422, "PATCH", path, "status.allocatedGpus: Invalid value")
        return {}


async def test_writer_logs_a_failed_write_and_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    client = FailingClient()
    writer = StatusWriter(client, TokenBucket(1000), interval_seconds=15)  # type: ignore[arg-type]
    writer.offer(desired("bad", 1))
    writer.offer(desired("good", 1))
    task = asyncio.create_task(writer.run())
    for _ in range(50):
        await asyncio.sleep(0.01)
        if writer.stats.writes:
            break
    task.cancel()
    assert writer.stats.failures == 1 and writer.stats.writes == 1
    assert "could not write gpuworkloadmetrics ns/bad" in caplog.text and "Invalid value" in caplog.text


def test_a_pod_keeps_only_the_labels_it_is_told_to() -> None:
    """The engine reads the project label only; a finished pod is held for the retention, so no more."""
    body = pod_body({"nvidia.com/gpu": "1"})
    body["metadata"]["labels"] = {"gpuwm.io/project": "vision", "job-name": "train", "controller-uid": "c-1"}
    pod = track_pod(body, JOB, DEFAULT_RESOURCE_NAMES, deleted=False, labels_kept=("gpuwm.io/project",))
    assert pod.labels == {"gpuwm.io/project": "vision"}
    assert pod_event(pod, [], 10.0).labels == {"gpuwm.io/project": "vision"}
    assert track_pod(body, JOB, DEFAULT_RESOURCE_NAMES, deleted=False).labels == body["metadata"]["labels"]
    # a label the engine does not read changes nothing it is told; the project label does
    body["metadata"]["labels"]["controller-uid"] = "c-2"
    again = track_pod(body, JOB, DEFAULT_RESOURCE_NAMES, deleted=False, labels_kept=("gpuwm.io/project",))
    assert state_key(again, []) == state_key(pod, [])
    body["metadata"]["labels"]["gpuwm.io/project"] = "nlp"
    moved = track_pod(body, JOB, DEFAULT_RESOURCE_NAMES, deleted=False, labels_kept=("gpuwm.io/project",))
    assert state_key(moved, []) != state_key(pod, [])


def test_intake_keeps_the_agents_holders_when_equal_and_reports_no_change() -> None:
    """Restored holders (a restart) equal the agent's but are other objects: the intake keeps the agent's list, so
    the next pulls, which hand back that same list while nothing changes, compare by identity."""
    def holders() -> list[DeviceHolder]:
        return [DeviceHolder(uuid="GPU-1", pod_uid="p1", container="c0"), DeviceHolder(uuid="GPU-2", pod_uid="p2")]

    restored = {"n1": holders()}
    pulled = holders()
    intake = SampleIntake(Engine(), restored)
    intake.take(Snapshot(node="n1", seq=1, agent_id=None, holders=pulled, pod_stats=[]))
    assert intake.changed_nodes == set()
    assert restored["n1"] is pulled
    moved = [DeviceHolder(uuid="GPU-1", pod_uid="p3", container="c0")]
    intake.take(Snapshot(node="n1", seq=2, agent_id=None, holders=moved, pod_stats=[]))
    assert intake.changed_nodes == {"n1"} and restored["n1"] is moved
