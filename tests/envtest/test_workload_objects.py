"""Workload objects watched themselves, on a real kube-apiserver with the real Job controller.

A suspended Job and a suspended PyTorchJob (its CRD, minimal with the real group, version, kind and the
fields gpuwm reads, installed after the controller started) appear as Queued with their requested GPUs
before any pod exists; unsuspended they are Pending, and once their pods are bound to a fake Node and run
they are Running with the GPUs they hold, their queued and wait seconds kept. The project counts them as
queued demand meanwhile. RayJob's CRD is never installed: it is skipped with one log line, no error.
A controller whose role has no list/watch on CRDs (kopf then hears of no new CRD) still watches a kind
installed while it runs: it reads discovery again for the configured kinds it does not watch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwm.controller.handlers import ABSENT_KINDS_RESCAN_SECONDS
from gpuwm.controller.rbac import REQUIRED_RULES
from tests.envtest.conftest import established, make_namespace
from tests.envtest.controlplane import ControlPlane
from tests.envtest.gpunode import GpuNode, busy, job_pod, run_pod
from tests.fakenvml import build_fake_nvml
from tests.integration.test_controller import Controller, wait_until

pytestmark = pytest.mark.envtest

NS = "ns-queued"
PROJECT = "proj-queued"
PYTORCHJOB_CRD = "pytorchjobs.kubeflow.org"
_OPEN = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def pytorchjob_crd() -> dict[str, Any]:
    """kubeflow.org/v1 PyTorchJob with the fields gpuwm reads: replica specs (replicas, template), runPolicy.suspend,
    status.conditions; pod templates are kept whole."""
    replica = {"type": "object", "properties": {"replicas": {"type": "integer"}, "restartPolicy": {"type": "string"},
                                                "template": _OPEN}}
    condition = {"type": "object", "properties": {"type": {"type": "string"}, "status": {"type": "string"}}}
    schema = {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "pytorchReplicaSpecs": {"type": "object", "additionalProperties": replica},
            "runPolicy": {"type": "object", "properties": {"suspend": {"type": "boolean"}}},
        }},
        "status": {"type": "object", "properties": {"conditions": {"type": "array", "items": condition}}},
    }}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": PYTORCHJOB_CRD},
        "spec": {"group": "kubeflow.org", "scope": "Namespaced",
                 "names": {"kind": "PyTorchJob", "listKind": "PyTorchJobList", "plural": "pytorchjobs",
                           "singular": "pytorchjob"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": schema}}]},
    }


def gpu_pod_spec(node: str, gpus: int = 1) -> dict[str, Any]:
    return {"nodeName": node, "restartPolicy": "Never", "containers": [
        {"name": "main", "image": "registry.example/trainer:1", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}


def _node(plane: ControlPlane, name: str, tmp_path: Path) -> Iterator[GpuNode]:
    gpu_node = GpuNode(plane, name, tmp_path, build_fake_nvml(tmp_path / "fakenvml"))
    yield gpu_node
    gpu_node.stop()
    plane.admin().request("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PYTORCHJOB_CRD}")


@pytest.fixture
def node(control_plane: ControlPlane, crds: list[str], tmp_path: Path) -> Iterator[GpuNode]:
    yield from _node(control_plane, "gpu-queued", tmp_path)


@pytest.fixture
def narrow_node(control_plane: ControlPlane, crds: list[str], tmp_path: Path) -> Iterator[GpuNode]:
    yield from _node(control_plane, "gpu-narrow", tmp_path)


def test_suspended_job_and_pytorchjob_queue_then_run(control_plane: ControlPlane, node: GpuNode,
                                                    tmp_path: Path) -> None:
    http = control_plane.admin()
    make_namespace(control_plane, NS, {"gpuwm.io/project": PROJECT})
    node.create()
    node.set(busy(80.0))
    node.start()
    created = time.time()
    job = http.create(f"/apis/batch/v1/namespaces/{NS}/jobs", {"metadata": {"name": "train"}, "spec": {
        "suspend": True, "parallelism": 1, "backoffLimit": 0, "template": {"spec": gpu_pod_spec(node.name)}}})
    log = tmp_path / "controller.log"
    controller = Controller(control_plane.write_kubeconfig(tmp_path / "kubeconfig"), node.agents_flag(),
                            tmp_path / "gpuwm.db", log, status_interval=1.0, interval=0.5)
    controller.start()

    def cr(name: str) -> dict[str, Any] | None:
        status, body = http.request("GET", f"/apis/gpuwm.io/v1alpha1/namespaces/{NS}/gpuworkloadmetrics/{name}")
        return body if status == 200 else None

    def phase(name: str, wanted: str) -> dict[str, Any] | None:
        found = cr(name)
        return found["status"] if found and found.get("status", {}).get("phase") == wanted else None

    try:
        # the Job: no pod exists (suspended), yet its CR is there, Queued with the GPUs it asks for
        queued = wait_until("train Queued", lambda: phase("train", "Queued"), log=log, timeout=60)
        assert queued["requestedGpus"] == 1 and queued["allocatedGpus"] == 0 and queued["pods"] == []
        train = cr("train")
        assert train is not None and train["spec"]["workloadRef"]["uid"] == job["metadata"]["uid"]
        assert http.get(f"/api/v1/namespaces/{NS}/pods")["items"] == []

        # the PyTorchJob's CRD appears while the controller runs: picked up, its object Queued
        control_plane.kubectl("apply", "-f", "-", stdin=_yaml(pytorchjob_crd()))
        wait_until("PyTorchJob CRD", lambda: established(control_plane, PYTORCHJOB_CRD), timeout=30)
        replica = {"replicas": 1, "restartPolicy": "Never", "template": {"spec": gpu_pod_spec(node.name)}}
        pytorch = http.create(f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs", {
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pt"},
            "spec": {"runPolicy": {"suspend": True},
                     "pytorchReplicaSpecs": {"Master": replica, "Worker": {**replica, "replicas": 2}}}})
        pt = wait_until("pt Queued", lambda: phase("pt", "Queued"), log=log, timeout=60)
        assert pt["requestedGpus"] == 3  # master 1 x 1 + workers 2 x 1

        def project() -> dict[str, Any] | None:
            status, body = http.request("GET", f"/apis/gpuwm.io/v1alpha1/gpuprojectmetrics/{PROJECT}")
            return body["status"] if status == 200 and body.get("status", {}).get("queuedWorkloads") == 2 else None

        demand = wait_until("project demand", project, log=log, timeout=60)
        assert demand["requestedGpus"] == 4 and demand["longestQueuedSeconds"] > 0
        time.sleep(2.0)
        queued_for = wait_until("train queued >= 2s", lambda: (s := phase("train", "Queued")) and
                                s["queuedSeconds"] >= 2 and s, log=log, timeout=60)["queuedSeconds"]

        # admitted: unsuspended, the Job controller makes its pod; bound to the fake node and running
        http.merge(f"/apis/batch/v1/namespaces/{NS}/jobs/train", {"spec": {"suspend": False}})
        admitted = time.time()
        pod = job_pod(control_plane, NS, "train")
        node.hold(pod)
        run_pod(control_plane, pod, float(int(time.time())))
        # the pod's request shows at once; which device it holds, once a pull of the agent names it (an
        # unnamed device until then)
        running = wait_until("train Running on its GPU", lambda: (s := phase("train", "Running")) and
                             s["allocatedGpus"] == 1 and s["gpus"] and s["gpus"][0]["uuid"] == "GPU-e0e0" and s,
                             log=log, timeout=60)
        assert running["requestedGpus"] == 1
        assert queued_for <= running["queuedSeconds"] <= admitted - created + 2
        # creation -> its container's start, which the kubelet writes in whole seconds (up to 1 s before the unsuspend
        # the controller saw)
        assert running["waitSeconds"] >= running["queuedSeconds"] - 1
        assert running["gpus"] and running["gpus"][0]["uuid"] == "GPU-e0e0"

        # the PyTorchJob: unsuspended it is Pending until its pods (made here: no training operator) run
        http.merge(f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/pt", {"spec": {"runPolicy": {"suspend": False}}})
        pending = wait_until("pt Pending", lambda: phase("pt", "Pending"), log=log, timeout=60)
        assert pending["requestedGpus"] == 3 and pending["allocatedGpus"] == 0
        owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "pt",
                 "uid": pytorch["metadata"]["uid"], "controller": True}
        started = float(int(time.time()))
        for name in ("pt-master-0", "pt-worker-0", "pt-worker-1"):
            made = http.create(f"/api/v1/namespaces/{NS}/pods", {
                "metadata": {"name": name, "ownerReferences": [owner]}, "spec": gpu_pod_spec(node.name)})
            run_pod(control_plane, made, started)
        pt_running = wait_until("pt Running", lambda: (s := phase("pt", "Running")) and
                                s["allocatedGpus"] == 3 and s, log=log, timeout=60)
        assert pt_running["queuedSeconds"] > 0 and pt_running["podCount"] == 3
        after = wait_until("project demand met", lambda: (s := http.get(
            f"/apis/gpuwm.io/v1alpha1/gpuprojectmetrics/{PROJECT}").get("status", {})) and
            s.get("queuedWorkloads") == 0 and s.get("requestedGpus") == 0 and s, log=log, timeout=60)
        assert after["allocatedGpus"] == 4

        # RayJob's CRD was never installed: one line, no error
        text = log.read_text()
        assert text.count("ray.io/RayJob is not installed") == 1, text[-3000:]
        assert "Traceback" not in text and "Unresolved resources" not in text, text[-3000:]
    finally:
        controller.stop()


NARROW_NS = "ns-narrow"
NARROW = "gpuwm-narrow"


def _narrow_role(plane: ControlPlane) -> str:
    """A ServiceAccount bound to the controller's rules less list/watch on CRDs; its token."""
    http = plane.admin()
    make_namespace(plane, NARROW_NS)
    rules = [rule for rule in REQUIRED_RULES if rule["apiGroups"] != ["apiextensions.k8s.io"]]
    assert len(rules) == len(REQUIRED_RULES) - 1
    http.create(f"/api/v1/namespaces/{NARROW_NS}/serviceaccounts", {"metadata": {"name": NARROW}})
    http.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", {"metadata": {"name": NARROW}, "rules": rules})
    http.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": NARROW},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NARROW},
        "subjects": [{"kind": "ServiceAccount", "name": NARROW, "namespace": NARROW_NS}]})
    return plane.token(NARROW_NS, NARROW)


def test_a_kind_installed_later_is_watched_without_access_to_crds(control_plane: ControlPlane,
                                                                  narrow_node: GpuNode, tmp_path: Path) -> None:
    """kopf reads a group's discovery again only on an event of one of its CRDs: without list/watch on CRDs it
    never sees a new one (nor, with that access, a group discovery lists only after the CRD's last event). The
    controller looks for the groups of the configured kinds it does not watch every ABSENT_KINDS_RESCAN_SECONDS
    and has kopf read those served, so a PyTorchJob installed while it runs is watched and its suspended object
    Queued."""
    http = control_plane.admin()
    crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PYTORCHJOB_CRD}"
    wait_until("no PyTorchJob CRD left", lambda: http.request("GET", crd_path)[0] == 404, timeout=90)
    token = _narrow_role(control_plane)
    node = narrow_node
    node.create()
    node.set(busy(80.0))
    node.start()
    log = tmp_path / "controller.log"
    controller = Controller(control_plane.write_kubeconfig(tmp_path / "kubeconfig", token=token), node.agents_flag(),
                            tmp_path / "gpuwm.db", log, status_interval=1.0, interval=0.5)
    controller.start()

    def queued() -> dict[str, Any] | None:
        status, body = http.request("GET", f"/apis/gpuwm.io/v1alpha1/namespaces/{NARROW_NS}/gpuworkloadmetrics/pt")
        return body["status"] if status == 200 and body.get("status", {}).get("phase") == "Queued" else None

    try:
        wait_until("kopf refused the CRDs", lambda: "customresourcedefinitions.apiextensions.k8s.io is forbidden" in
                   log.read_text(), log=log, timeout=60)
        control_plane.kubectl("apply", "-f", "-", stdin=_yaml(pytorchjob_crd()))
        wait_until("PyTorchJob CRD", lambda: established(control_plane, PYTORCHJOB_CRD), timeout=30)
        replica = {"replicas": 1, "restartPolicy": "Never", "template": {"spec": gpu_pod_spec(node.name)}}
        http.create(f"/apis/kubeflow.org/v1/namespaces/{NARROW_NS}/pytorchjobs", {
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pt"},
            "spec": {"runPolicy": {"suspend": True},
                     "pytorchReplicaSpecs": {"Master": replica, "Worker": {**replica, "replicas": 2}}}})
        pt = wait_until("pt Queued", queued, log=log, timeout=3 * ABSENT_KINDS_RESCAN_SECONDS)
        assert pt["requestedGpus"] == 3 and pt["allocatedGpus"] == 0
        text = log.read_text()
        assert "Traceback" not in text and "reading the API's discovery" not in text, text[-3000:]
    finally:
        controller.stop()
        for kind in ("clusterrolebindings", "clusterroles"):
            http.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/{kind}/{NARROW}")


def _yaml(document: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(document)
