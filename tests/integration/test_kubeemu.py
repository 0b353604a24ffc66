"""The API emulator keeps the real API server's semantics that the controller relies on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.integration.kubeemu import EmulatorThread, Fault, KubeHttp, KubernetesEmulator, minimal_crd

CRDS = Path(__file__).resolve().parents[2] / "crds"
GWM = "/apis/gpuwm.io/v1alpha1/namespaces/team-a/gpuworkloadmetrics"


@pytest.fixture
def emu() -> Iterator[EmulatorThread]:
    with EmulatorThread(KubernetesEmulator(CRDS)) as thread:
        http = KubeHttp(thread.url)
        http.create("/api/v1/namespaces", {"metadata": {"name": "team-a"}})
        yield thread


def _workload_cr(name: str = "train") -> dict[str, object]:
    return {"apiVersion": "gpuwm.io/v1alpha1", "kind": "GPUWorkloadMetrics", "metadata": {"name": name},
            "spec": {"workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "u-1"},
                     "project": "team-a"},
            "status": {"allocatedGpus": 3}}


def test_create_sets_server_fields_and_ignores_status(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    created = http.create(GWM, _workload_cr())
    metadata = created["metadata"]
    assert metadata["uid"] and metadata["creationTimestamp"].endswith("Z")
    assert metadata["generation"] == 1 and int(metadata["resourceVersion"]) > 0
    assert "status" not in created  # status is a subresource: ignored on create
    pod = http.create("/api/v1/namespaces/team-a/pods", {"metadata": {"name": "p"}, "spec": {"containers": []}})
    assert pod["status"] == {"phase": "Pending"}
    status, error = KubeHttp(emu.url).request("POST", GWM, _workload_cr())
    assert status == 409 and error["reason"] == "AlreadyExists"
    status, error = http.request("POST", "/api/v1/namespaces/nowhere/pods", {"metadata": {"name": "p"}})
    assert status == 404 and "nowhere" in error["message"]


def test_status_subresource_is_the_only_way_to_status(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    http.create(GWM, _workload_cr())
    patched = http.ok("PATCH", f"{GWM}/train/status", {"status": {"allocatedGpus": 2}, "spec": {"project": "evil"}},
                      "application/merge-patch+json", {"fieldManager": "gpuwm"})
    assert patched["status"]["allocatedGpus"] == 2
    assert patched["spec"]["project"] == "team-a"  # /status cannot change spec
    assert patched["metadata"]["generation"] == 1
    assert any(m["manager"] == "gpuwm" and m.get("subresource") == "status" for m in patched["metadata"]["managedFields"])
    main = http.merge(f"{GWM}/train", {"status": {"allocatedGpus": 9}, "spec": {"project": "team-b"}})
    assert main["status"]["allocatedGpus"] == 2  # the main resource cannot change status
    assert main["spec"]["project"] == "team-b" and main["metadata"]["generation"] == 2


def test_schema_validation_and_pruning(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    http.create(GWM, _workload_cr())
    status, error = http.request("PATCH", f"{GWM}/train/status", {"status": {"allocatedGpus": "three"}},
                                 "application/merge-patch+json")
    assert status == 422 and "allocatedGpus" in error["message"]
    pruned = http.ok("PATCH", f"{GWM}/train/status", {"status": {"allocatedGpus": 1, "madeUp": 5}},
                     "application/merge-patch+json")
    assert "madeUp" not in pruned["status"] and pruned["status"]["allocatedGpus"] == 1
    status, _ = http.request("PATCH", f"{GWM}/train", [{"op": "replace", "path": "/spec/project", "value": "x"}],
                             "application/strategic-merge-patch+json")
    assert status == 415  # strategic merge is for built-in kinds only


def test_put_needs_current_resource_version(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    created = http.create(GWM, _workload_cr())
    stale = json.loads(json.dumps(created))
    http.merge(f"{GWM}/train", {"spec": {"project": "p2"}})
    stale["spec"]["project"] = "p3"
    status, error = http.request("PUT", f"{GWM}/train", stale)
    assert status == 409 and error["reason"] == "Conflict"
    current = http.get(f"{GWM}/train")
    current["spec"]["project"] = "p3"
    assert http.ok("PUT", f"{GWM}/train", current)["spec"]["project"] == "p3"


def test_patch_kinds(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    http.create(GWM, _workload_cr())
    labelled = http.merge(f"{GWM}/train", {"metadata": {"labels": {"a": "1", "b": "2"}}})
    assert labelled["metadata"]["labels"] == {"a": "1", "b": "2"}
    assert http.merge(f"{GWM}/train", {"metadata": {"labels": {"a": None}}})["metadata"]["labels"] == {"b": "2"}
    replaced = http.ok("PATCH", f"{GWM}/train", [{"op": "replace", "path": "/spec/project", "value": "jp"}],
                       "application/json-patch+json")
    assert replaced["spec"]["project"] == "jp"
    status, _ = http.request("PATCH", f"{GWM}/other", json.dumps(_workload_cr("other")).encode(), "application/apply-patch+yaml")
    assert status == 400  # apply needs a fieldManager
    applied = http.ok("PATCH", f"{GWM}/other", json.dumps(_workload_cr("other")).encode(),
                      "application/apply-patch+yaml", {"fieldManager": "gpuwm"})
    assert applied["metadata"]["name"] == "other" and applied["metadata"]["uid"]


def test_list_selectors_and_paging(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    for index in range(5):
        http.create("/api/v1/namespaces/team-a/pods", {"metadata": {"name": f"p{index}", "labels": {"i": str(index % 2)}},
                                                        "spec": {"nodeName": f"n{index}"}})
    assert [p["metadata"]["name"] for p in http.get("/api/v1/pods", labelSelector="i=1")["items"]] == ["p1", "p3"]
    assert len(http.get("/api/v1/pods", labelSelector="i in (0,1),i!=0")["items"]) == 2
    assert [p["metadata"]["name"] for p in http.get("/api/v1/pods", fieldSelector="spec.nodeName=n4")["items"]] == ["p4"]
    page = http.get("/api/v1/namespaces/team-a/pods", limit="2")
    assert len(page["items"]) == 2 and page["metadata"]["continue"]
    rest = http.get("/api/v1/namespaces/team-a/pods", limit="10", **{"continue": page["metadata"]["continue"]})
    assert len(rest["items"]) == 3


def test_discovery_serves_crds(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    http.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                minimal_crd("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"))
    resources = http.get("/apis/kubeflow.org/v1")["resources"]
    assert {r["name"] for r in resources} == {"pytorchjobs", "pytorchjobs/status"}
    groups = {g["name"] for g in http.get("/apis")["groups"]}
    assert {"gpuwm.io", "kubeflow.org", "batch", "apps"} <= groups


async def _read_events(url: str, count: int, timeout: float = 5.0) -> list[dict[str, object]]:
    events: list[dict[str, object]] = []
    async with aiohttp.ClientSession() as session, session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
        async for line in response.content:
            if line.strip():
                events.append(json.loads(line))
            if len(events) >= count:
                break
    return events


async def test_watch_from_resource_version_does_not_replay(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    http.create("/api/v1/namespaces/team-a/pods", {"metadata": {"name": "old"}})
    listing = http.get("/api/v1/pods")
    url = f"{emu.url}/api/v1/pods?watch=true&resourceVersion={listing['metadata']['resourceVersion']}&timeoutSeconds=5"
    reader = asyncio.create_task(_read_events(url, 2))
    await asyncio.sleep(0.3)
    await asyncio.to_thread(http.create, "/api/v1/namespaces/team-a/pods", {"metadata": {"name": "new"}})
    await asyncio.to_thread(http.ok, "DELETE", "/api/v1/namespaces/team-a/pods/new")
    events = await reader
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "new"), ("DELETED", "new")]  # type: ignore[index]


async def test_watch_too_old_is_gone_and_drop_closes(emu: EmulatorThread) -> None:
    emu.emulator.store.history.clear()
    http = KubeHttp(emu.url)
    for index in range(3):
        http.create("/api/v1/namespaces/team-a/pods", {"metadata": {"name": f"p{index}"}})
    emu.call(lambda: [emu.emulator.store.history.popleft() for _ in range(2)])
    events = await _read_events(f"{emu.url}/api/v1/pods?watch=true&resourceVersion=1", 1)
    assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410  # type: ignore[index]
    url = f"{emu.url}/api/v1/pods?watch=true&resourceVersion={emu.emulator.store.resource_version}&timeoutSeconds=30"
    reader = asyncio.create_task(_read_events(url, 1, timeout=10))
    await asyncio.sleep(0.3)
    assert emu.call(emu.emulator.drop_watches) >= 1
    assert await asyncio.wait_for(reader, 5) == []  # the stream ended without events


def test_fault_injection(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    emu.emulator.faults.append(Fault(status=429, count=2, methods=frozenset({"GET"}), path_contains="/pods",
                                     retry_after=1))
    assert http.request("GET", "/api/v1/pods")[0] == 429
    assert http.request("GET", "/api/v1/pods")[0] == 429
    assert http.request("GET", "/api/v1/pods")[0] == 200
    emu.emulator.faults.append(Fault(status=503, count=1))
    assert http.request("GET", "/api/v1/namespaces")[0] == 503
