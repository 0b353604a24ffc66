"""The status writer against answers a real API server gives: generations, terminating namespaces."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from gpuwm.controller.kube.client import KubeApiError
from gpuwm.controller.kube.ratelimit import TokenBucket
from gpuwm.controller.status.writer import Desired, StatusWriter


class GenerationClient:
    """Answers like the API server: every response carries metadata.generation."""

    def __init__(self, generation_after_patch: int = 1) -> None:
        self.generation_after_patch = generation_after_patch
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        return {"metadata": {"name": body["metadata"]["name"], "generation": 1}}

    async def merge_patch(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.patches.append((path, body))
        return {"metadata": {"generation": self.generation_after_patch}, **body}


def _desired(name: str = "a", namespace: str = "ns") -> Desired:
    return Desired(plural="gpuworkloadmetrics", namespace=namespace, name=name, spec={}, labels={},
                   render=lambda: {"allocatedGpus": 1.0, "observedGeneration": None},
                   signature=("Running", 1.0), counters=(0.0,))


async def test_status_carries_the_generation_the_api_server_reported() -> None:
    client = GenerationClient()
    writer = StatusWriter(client, TokenBucket(1000), interval_seconds=15)  # type: ignore[arg-type]
    await writer.write(_desired())
    assert len(client.patches) == 1
    assert client.patches[0][1]["status"]["observedGeneration"] == 1  # from the create's answer


async def test_a_spec_changed_behind_our_back_gets_its_new_generation() -> None:
    client = GenerationClient(generation_after_patch=3)
    writer = StatusWriter(client, TokenBucket(1000), interval_seconds=15)  # type: ignore[arg-type]
    writer.existing.add(("gpuworkloadmetrics", "ns", "a"))
    writer.generations[("gpuworkloadmetrics", "ns", "a")] = 2
    await writer.write(_desired())
    sent = [body["status"]["observedGeneration"] for _, body in client.patches]
    assert sent == [2, 3]  # the answer said 3: a second, small patch says so
    assert writer.generations[("gpuworkloadmetrics", "ns", "a")] == 3


class TerminatingClient(GenerationClient):
    """The namespace `gone` is being terminated: creates there get the API server's 403."""

    def __init__(self) -> None:
        super().__init__()
        self.creates: list[str] = []

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        self.creates.append(path)
        if "/namespaces/gone/" in path:
            raise KubeApiError(403, "POST", path, 'gpuworkloadmetrics.gpuwm.io "a" is forbidden: unable to create new '
                               "content in namespace gone because it is being terminated", "Forbidden")
        return await super().create(path, body)


async def test_a_terminating_namespace_is_left_alone_for_a_while(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    now = [0.0]
    client = TerminatingClient()
    writer = StatusWriter(client, TokenBucket(1000), interval_seconds=15,  # type: ignore[arg-type]
                          clock=lambda: now[0])
    writer.offer(_desired("a", "gone"))
    writer.offer(_desired("b", "gone"))
    writer.offer(_desired("c", "live"))
    task = asyncio.create_task(writer.run())
    for _ in range(100):
        await asyncio.sleep(0.01)
        if writer.stats.writes:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.creates.count("/apis/gpuwm.io/v1alpha1/namespaces/gone/gpuworkloadmetrics") == 1  # b was dropped
    assert writer.stats.writes == 1 and "namespace gone is being terminated" in caplog.text
    assert "CRDs installed" not in caplog.text  # not the missing-CRD hint
    assert writer.offer(_desired("a", "gone")) == "none"
    now[0] = 61.0  # later: maybe recreated, try again
    assert writer.offer(_desired("a", "gone")) == "material"
    writer.namespace_reopened("gone")
    assert "gone" not in writer.closed_namespaces


def test_namespace_gone_recognises_both_api_answers() -> None:
    terminating = KubeApiError(403, "POST", "/x", "unable to create new content in namespace a because it is being "
                                                  "terminated", "Forbidden")
    missing = KubeApiError(404, "POST", "/x", 'namespaces "a" not found', "NotFound")
    no_crd = KubeApiError(404, "POST", "/x", "the server could not find the requested resource", "NotFound")
    rbac = KubeApiError(403, "POST", "/x", 'User "x" cannot create resource "gpuworkloadmetrics"', "Forbidden")
    assert terminating.namespace_gone and missing.namespace_gone
    assert not no_crd.namespace_gone and not rbac.namespace_gone


class DeletingClient(GenerationClient):
    def __init__(self) -> None:
        super().__init__()
        self.deleted: list[str] = []

    async def delete(self, path: str) -> None:
        self.deleted.append(path)


def _project(name: str) -> Desired:
    return Desired(plural="gpuprojectmetrics", namespace=None, name=name, spec={"project": name}, labels={},
                   render=lambda: {"workloads": 1}, signature=(1,), counters=(0.0,))


async def test_project_crs_go_when_their_project_has_no_workloads() -> None:
    now = [1000.0]
    client = DeletingClient()
    writer = StatusWriter(client, TokenBucket(1000), interval_seconds=15,  # type: ignore[arg-type]
                          clock=lambda: now[0])
    for name in ("vision", "nlp"):
        writer.offer(_project(name))
        await writer.write(writer._next())  # type: ignore[arg-type]
    assert await writer.retire_projects(now[0], retention_seconds=60) == []  # both offered this cycle
    writer.offer(_project("vision"))  # nlp's last workload was forgotten (retention): no longer offered
    assert await writer.retire_projects(now[0], retention_seconds=60) == ["nlp"]
    assert client.deleted == ["/apis/gpuwm.io/v1alpha1/gpuprojectmetrics/nlp"]
    assert ("gpuprojectmetrics", None, "nlp") not in writer.existing
    # a project CR adopted at start and not offered since goes once its last update is a retention old
    writer.existing.add(("gpuprojectmetrics", None, "old"))
    writer.adopted_project_updates["old"] = now[0] - 30
    writer.offer(_project("vision"))
    assert await writer.retire_projects(now[0], retention_seconds=60) == []
    now[0] += 31
    writer.offer(_project("vision"))
    assert await writer.retire_projects(now[0], retention_seconds=60) == ["old"]
    # the project comes back: its CR is created again
    writer.offer(_project("nlp"))
    await writer.write(writer._next())  # type: ignore[arg-type]
    assert ("gpuprojectmetrics", None, "nlp") in writer.existing


async def test_a_status_with_nan_goes_out_as_null() -> None:
    """Through the real client to a loopback server: what reaches the API server is JSON, NaN as null."""
    from aiohttp import web

    from gpuwm.controller.kube.client import KubeClient
    from tests.unit.controller.loopback import serving

    bodies: list[bytes] = []

    async def patch(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        return web.json_response({"metadata": {"generation": 1}})

    app = web.Application()
    app.router.add_patch("/{path:.*}", patch)
    async with serving(app) as url:
        client = KubeClient(url)
        writer = StatusWriter(client, TokenBucket(1000), interval_seconds=15)
        writer.existing.add(("gpuworkloadmetrics", "ns", "a"))
        desired = _desired()
        desired.render = lambda: {"allocatedGpus": 1.0, "utilization": {"current": float("nan"), "avg1m": 50.0},
                                  "gpus": [{"powerWatts": float("inf"), "uuid": "GPU-1"}]}
        await writer.write(desired)
        await client.close()
    status = json.loads(bodies[0])["status"]  # the stdlib parser: it would take NaN, so check for null
    assert status["utilization"] == {"current": None, "avg1m": 50.0}
    assert status["gpus"] == [{"powerWatts": None, "uuid": "GPU-1"}]
    assert b"NaN" not in bodies[0] and b"Infinity" not in bodies[0]


async def test_the_client_refuses_to_send_nan() -> None:
    from gpuwm.controller.kube.client import KubeClient

    client = KubeClient("http://127.0.0.1:9")
    with pytest.raises(ValueError, match="JSON compliant"):
        await client.merge_patch("/x", {"status": {"v": float("nan")}})
    await client.close()


class NamespaceGoingClient(GenerationClient):
    """The namespace lives, then is terminated: its CRs are gone (404) and creates are refused (403)."""

    def __init__(self) -> None:
        super().__init__()
        self.terminating = False

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        if self.terminating:
            raise KubeApiError(403, "POST", path, "unable to create new content in namespace gone because it is being "
                               "terminated", "Forbidden")
        return await super().create(path, body)

    async def merge_patch(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        if self.terminating:
            raise KubeApiError(404, "PATCH", path, 'gpuworkloadmetrics.gpuwm.io "train" not found', "NotFound")
        return await super().merge_patch(path, body)


async def test_crs_gone_with_their_namespace_are_not_resurrected_when_it_is_recreated() -> None:
    client = NamespaceGoingClient()
    writer = StatusWriter(client, TokenBucket(1000), interval_seconds=15)  # type: ignore[arg-type]
    key = ("gpuworkloadmetrics", "gone", "train")

    def workload(uid: str, allocated: float) -> Desired:
        return Desired(plural="gpuworkloadmetrics", namespace="gone", name="train",
                       spec={"workloadRef": {"uid": uid}}, labels={},
                       render=lambda: {"allocatedGpus": allocated}, signature=(allocated,), counters=(0.0,))

    writer.offer(workload("old", 1.0))
    await writer.write(writer._next())  # type: ignore[arg-type]
    client.terminating = True
    writer.offer(workload("old", 0.0))  # its pods went with the namespace: the workload ended
    task = asyncio.create_task(writer.run())
    for _ in range(50):
        await asyncio.sleep(0.01)
        if writer.closed_namespaces:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert writer.buried == {key: "old"} and key not in writer.existing
    client.terminating = False
    writer.namespace_reopened("gone")  # the namespace is created again
    assert writer.offer(workload("old", 0.0)) == "none"  # the old workload's CR stays gone
    assert writer.offer(workload("new", 1.0)) == "material"  # a new workload of that name is written
    assert not writer.buried


class HeldClient(GenerationClient):
    """Holds each status patch until released: a write waiting on the API server (or on the client's backoff)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def merge_patch(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        await self.release.wait()
        if body["status"].get("fail"):
            raise KubeApiError(503, "PATCH", path, "unavailable")
        return await super().merge_patch(path, body)


async def test_a_write_in_flight_is_counted_until_it_ends_written_or_failed() -> None:
    """`pending` is what waits in the queues; `writing` what was taken from them and has not ended: both zero
    is a drained writer (bench/faults.py waits for that)."""
    client = HeldClient()
    writer = StatusWriter(client, TokenBucket(1000), interval_seconds=15)  # type: ignore[arg-type]
    runner = asyncio.create_task(writer.run())
    try:
        writer.offer(_desired("a"))
        failing = _desired("b")
        failing.render = lambda: {"fail": True, "observedGeneration": None}
        writer.offer(failing)
        for _ in range(100):
            if writer.writing:
                break
            await asyncio.sleep(0.01)
        assert writer.writing == 1 and writer.pending == 1  # "a" is sent, "b" waits
        client.release.set()
        for _ in range(100):
            if not writer.writing and not writer.pending:
                break
            await asyncio.sleep(0.01)
        assert (writer.writing, writer.pending) == (0, 0)
        assert writer.stats.writes == 1 and writer.stats.failures == 1
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
