"""Idle policies on a real kube-apiserver with the real Job controller (kube-controller-manager).

The real controller process, an agent on fake NVML whose GPU sits idle, and policies applied as a
platform team would: a Deployment is scaled to zero through its scale subresource and a Job suspended
(its pods then go, by the Job controller), each after a warning, with an Event on the workload and on
its GPUWorkloadMetrics and an entry in the CR's status.policyActions for each step; a Kueue-admitted
Job is suspended through its Kueue Workload (spec.active false), never its own suspend; a dry-run
policy changes nothing and lists what it would do; an exempt workload is left alone; a controller
without the rights to act says which it lacks on the policy's status.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from gpuwm.controller.rbac import REQUIRED_RULES, idle_policy_rules
from tests.envtest.conftest import established, make_namespace
from tests.envtest.controlplane import ControlPlane
from tests.envtest.gpunode import GpuNode, create_job, idle, job_pod, run_pod
from tests.fakenvml import build_fake_nvml
from tests.integration.test_controller import Controller, wait_until

pytestmark = pytest.mark.envtest

GROUP = "/apis/gpuwm.io/v1alpha1"
ACTING = json.dumps({"enabled": True, "actions": ["warn", "scaleToZero", "suspend"]})
PRICING = json.dumps({"defaultPricePerGpuHour": 2.0, "currency": "EUR"})
KUEUE_CRD = "workloads.kueue.x-k8s.io"


def gpu_template(node: str) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "nb"}}, "spec": {"nodeName": node, "containers": [
        {"name": "main", "image": "registry.example/notebook:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def deployment_with_pod(plane: ControlPlane, namespace: str, name: str, node: str,
                        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Deployment and the ReplicaSet and pod its controllers would make (none runs here), the pod on `node`."""
    http = plane.admin()
    deployment = http.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "nb"}}, "template": gpu_template(node)}})
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": deployment["metadata"]["uid"],
             "controller": True}
    replica_set = http.create(f"/apis/apps/v1/namespaces/{namespace}/replicasets", {
        "metadata": {"name": f"{name}-7d9f", "ownerReferences": [owner]},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "nb"}}, "template": gpu_template(node)}})
    rs_owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": replica_set["metadata"]["name"],
                "uid": replica_set["metadata"]["uid"], "controller": True}
    pod: dict[str, Any] = http.create(f"/api/v1/namespaces/{namespace}/pods", {
        "metadata": {"name": f"{name}-7d9f-x1", "labels": {"app": "nb"}, "ownerReferences": [rs_owner]},
        **{"spec": gpu_template(node)["spec"]}})
    return pod


def policy(name: str, spec: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    kind = "GPUIdlePolicy" if namespace else "ClusterGPUIdlePolicy"
    metadata: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "gpuwm.io/v1alpha1", "kind": kind, "metadata": metadata, "spec": spec}


def apply(plane: ControlPlane, document: dict[str, Any]) -> None:
    plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(document))


def policy_status(plane: ControlPlane, name: str, namespace: str | None = None) -> dict[str, Any]:
    path = (f"{GROUP}/namespaces/{namespace}/gpuidlepolicies/{name}" if namespace
            else f"{GROUP}/clustergpuidlepolicies/{name}")
    status, body = plane.admin().request("GET", path)
    return dict(body.get("status") or {}) if status == 200 else {}


def workload_cr(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    status, body = plane.admin().request("GET", f"{GROUP}/namespaces/{namespace}/gpuworkloadmetrics/{name}")
    return dict(body.get("status") or {}) if status == 200 else {}


def _trail_of(plane: ControlPlane, namespace: str, name: str, entries: int) -> Callable[[], list[dict[str, Any]]]:
    def check() -> list[dict[str, Any]]:
        trail = list(workload_cr(plane, namespace, name).get("policyActions") or [])
        return trail if len(trail) >= entries else []

    return check


def _events_with(plane: ControlPlane, namespace: str, name: str, reason: str, count: int) -> Callable[[], list[str]]:
    def check() -> list[str]:
        found = events(plane, namespace, name)
        return found if found.count(reason) >= count else []

    return check


def events(plane: ControlPlane, namespace: str, involved: str) -> list[str]:
    found = plane.admin().get(f"/api/v1/namespaces/{namespace}/events",
                              fieldSelector=f"involvedObject.name={involved}")["items"]
    return sorted(str(event["reason"]) for event in found)


@pytest.fixture
def nodes(control_plane: ControlPlane, crds: list[str]) -> Iterator[list[GpuNode]]:
    """The test's fake GPU nodes (`_make_node` adds them), stopped and deleted after it."""
    made: list[GpuNode] = []
    yield made
    for node in made:
        node.stop()
        control_plane.admin().request("DELETE", f"/api/v1/nodes/{node.name}")


def _make_node(control_plane: ControlPlane, tmp_path: Path, made: list[GpuNode], name: str) -> GpuNode:
    """A Node with one idle fake GPU (its agent started later, once its pod is held)."""
    (tmp_path / name).mkdir()
    node = GpuNode(control_plane, name, tmp_path / name, build_fake_nvml(tmp_path / "fakenvml"))
    node.create()
    node.set(idle())
    made.append(node)
    return node


def _controller(plane: ControlPlane, nodes: list[GpuNode], tmp_path: Path, token: str | None = None,
                acting: str = ACTING, own_namespace: str | None = None) -> Controller:
    agents = "static:" + ",".join(f"{node.name}={node.agent.url}" for node in nodes if node.agent is not None)
    controller = Controller(plane.write_kubeconfig(tmp_path / "kubeconfig", token=token), agents, tmp_path / "gpuwm.db",
                            tmp_path / "controller.log", status_interval=1.0, interval=0.5,
                            extra=("--idle-policies", acting, "--pricing", PRICING))
    if own_namespace is not None:
        controller.env["POD_NAMESPACE"] = own_namespace  # as the chart's downward API gives it
    controller.start()
    return controller


def test_a_deployment_is_scaled_to_zero_and_a_job_suspended(control_plane: ControlPlane, nodes: list[GpuNode],
                                                            tmp_path: Path) -> None:
    http = control_plane.admin()
    namespace = "ns-idle-act"
    make_namespace(control_plane, namespace, {"gpuwm.io/project": "lab"})
    notebook_node = _make_node(control_plane, tmp_path, nodes, "gpu-act-a")
    job_node = _make_node(control_plane, tmp_path, nodes, "gpu-act-b")
    pod = deployment_with_pod(control_plane, namespace, "nb", notebook_node.name)
    notebook_node.hold(pod)
    run_pod(control_plane, pod, time.time())
    create_job(control_plane, namespace, "train", job_node.name)
    job = job_pod(control_plane, namespace, "train")
    job_node.hold(job)
    run_pod(control_plane, job, time.time())
    for node in nodes:
        node.start()
    apply(control_plane, policy("idle-gpus", {
        "selector": {"namespaces": [namespace]}, "idleFor": "3s", "dryRun": False,
        "actions": [{"type": "warn"}, {"type": "scaleToZero", "after": "2s"}, {"type": "suspend", "after": "2s"}]}))
    controller = _controller(control_plane, nodes, tmp_path)
    log = tmp_path / "controller.log"
    try:
        scaled = wait_until("nb scaled to 0", lambda: http.get(
            f"/apis/apps/v1/namespaces/{namespace}/deployments/nb")["spec"]["replicas"] == 0, log=log, timeout=90)
        assert scaled
        wait_until("train suspended", lambda: http.get(
            f"/apis/batch/v1/namespaces/{namespace}/jobs/train")["spec"].get("suspend") is True, log=log, timeout=90)
        def train_pods_gone() -> bool:
            pods = http.get(f"/api/v1/namespaces/{namespace}/pods",
                            labelSelector="batch.kubernetes.io/job-name=train")["items"]
            return all(pod["metadata"].get("deletionTimestamp") for pod in pods)

        wait_until("the Job controller ends train's pod", train_pods_gone, log=log, timeout=60)
        for name, act, reason in (("nb", "scaleToZero", "IdlePolicyScaledToZero"),
                                  ("train", "suspend", "IdlePolicySuspended")):
            trail = wait_until(f"{name}'s policyActions", _trail_of(control_plane, namespace, name, 2), log=log,
                               timeout=60)
            assert [(entry["action"], entry["result"], entry["policy"]) for entry in trail[:2]] == [
                (act, "Succeeded", "idle-gpus"), ("warn", "Succeeded", "idle-gpus")]
            # the workload and its GPUWorkloadMetrics share the name: an Event of each step on each
            found = wait_until(f"{name}'s events", _events_with(control_plane, namespace, name, reason, 2), log=log,
                               timeout=30)
            assert found.count(reason) == 2 and found.count("IdlePolicyWarning") == 2
            kinds = {event["involvedObject"]["kind"] for event in http.get(
                f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.name={name}")["items"]
                if event["reason"] == reason}
            assert kinds == {"GPUWorkloadMetrics", "Deployment" if name == "nb" else "Job"}
        cr = workload_cr(control_plane, namespace, "train")
        assert cr["currency"] == "EUR" and cr["cost"] > 0 and cr["idleCost"] > 0
        status = wait_until("policy status", lambda: (s := policy_status(control_plane, "idle-gpus"))
                            and s.get("actionsTaken", 0) >= 4 and s, log=log, timeout=30)
        assert status["missingPermissions"] == [] and status["actionsFailed"] == 0
        assert {entry["name"] for entry in status["recentActions"]} == {"nb", "train"}
        assert "Traceback" not in log.read_text()
    finally:
        controller.stop()
        http.request("DELETE", f"{GROUP}/clustergpuidlepolicies/idle-gpus")


def test_a_dry_run_changes_nothing_and_an_exempt_workload_is_left_alone(
        control_plane: ControlPlane, nodes: list[GpuNode], tmp_path: Path) -> None:
    http = control_plane.admin()
    dry, kept = "ns-idle-dry", "ns-idle-exempt"
    make_namespace(control_plane, dry)
    make_namespace(control_plane, kept)
    dry_node = _make_node(control_plane, tmp_path, nodes, "gpu-dry")
    kept_node = _make_node(control_plane, tmp_path, nodes, "gpu-kept")
    dry_pod = deployment_with_pod(control_plane, dry, "probe", dry_node.name)
    kept_pod = deployment_with_pod(control_plane, kept, "keep", kept_node.name,
                                   annotations={"gpuwm.io/idle-policy": "exempt"})
    for node, pod in ((dry_node, dry_pod), (kept_node, kept_pod)):
        node.hold(pod)
        run_pod(control_plane, pod, time.time())
        node.start()
    steps = [{"type": "warn"}, {"type": "scaleToZero", "after": "1s"}]
    apply(control_plane, policy("try-out", {"idleFor": "2s", "actions": steps}, namespace=dry))  # dryRun by default
    apply(control_plane, policy("strict", {"selector": {"namespaces": [kept]}, "idleFor": "2s", "dryRun": False,
                                           "actions": steps}))
    controller = _controller(control_plane, nodes, tmp_path)
    log = tmp_path / "controller.log"
    try:
        status = wait_until("the dry run's would-haves", lambda: (s := policy_status(control_plane, "try-out", dry))
                            and len([p for p in s.get("planned", []) if p["state"] == "WouldHaveRun"]) == 2 and s,
                            log=log, timeout=90)
        assert {(p["name"], p["action"]) for p in status["planned"]} == {("probe", "warn"), ("probe", "scaleToZero")}
        assert [entry["result"] for entry in status["recentActions"]] == ["DryRun", "DryRun"]
        assert status["conditions"][0]["reason"] == "DryRun" and status["actionsTaken"] == 0
        strict = wait_until("strict's status", lambda: (s := policy_status(control_plane, "strict"))
                            and "matchedWorkloads" in s and s, log=log, timeout=30)
        time.sleep(5.0)  # idle well past both steps' times
        for namespace, name in ((dry, "probe"), (kept, "keep")):
            deployment = http.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
            assert deployment["spec"]["replicas"] == 1, name
            assert not [reason for reason in events(control_plane, namespace, name) if reason.startswith("IdlePolicy")]
            assert not workload_cr(control_plane, namespace, name).get("policyActions"), name
        strict = policy_status(control_plane, "strict")
        assert strict["matchedWorkloads"] == 0 and strict["recentActions"] == []  # exempt: not even counted
    finally:
        controller.stop()
        http.request("DELETE", f"{GROUP}/namespaces/{dry}/gpuidlepolicies/try-out")
        http.request("DELETE", f"{GROUP}/clustergpuidlepolicies/strict")


def kueue_workload_crd() -> dict[str, Any]:
    """kueue.x-k8s.io/v1beta1 Workload with the fields gpuwm reads and writes: spec.queueName, spec.active,
    status.admission.clusterQueue, status.conditions."""
    condition = {"type": "object", "properties": {"type": {"type": "string"}, "status": {"type": "string"}}}
    schema = {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"queueName": {"type": "string"}, "active": {"type": "boolean"}}},
        "status": {"type": "object", "properties": {
            "admission": {"type": "object", "properties": {"clusterQueue": {"type": "string"}}},
            "conditions": {"type": "array", "items": condition}}},
    }}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": KUEUE_CRD},
            "spec": {"group": "kueue.x-k8s.io", "scope": "Namespaced",
                     "names": {"kind": "Workload", "listKind": "WorkloadList", "plural": "workloads",
                               "singular": "workload"},
                     "versions": [{"name": "v1beta1", "served": True, "storage": True, "subresources": {"status": {}},
                                   "schema": {"openAPIV3Schema": schema}}]}}


def test_a_kueue_admitted_job_is_deactivated_through_its_workload(control_plane: ControlPlane, nodes: list[GpuNode],
                                                                  tmp_path: Path) -> None:
    http = control_plane.admin()
    namespace = "ns-idle-kueue"
    make_namespace(control_plane, namespace)
    apply(control_plane, kueue_workload_crd())
    wait_until("Kueue Workload CRD", lambda: established(control_plane, KUEUE_CRD), timeout=30)
    node = _make_node(control_plane, tmp_path, nodes, "gpu-kueue")
    job = create_job(control_plane, namespace, "queued-train", node.name)
    http.merge(f"/apis/batch/v1/namespaces/{namespace}/jobs/queued-train",
               {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team-a"}}})
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "queued-train", "uid": job["metadata"]["uid"],
             "controller": True}
    http.create(f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{namespace}/workloads", {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
        "metadata": {"name": "job-queued-train-1a2b", "ownerReferences": [owner]},
        "spec": {"queueName": "team-a", "active": True}})
    http.merge(f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{namespace}/workloads/job-queued-train-1a2b/status",
               {"status": {"admission": {"clusterQueue": "gpus"},
                           "conditions": [{"type": "Admitted", "status": "True"}]}})
    pod = job_pod(control_plane, namespace, "queued-train")
    node.hold(pod)
    run_pod(control_plane, pod, time.time())
    node.start()
    apply(control_plane, policy("kueue-idle", {"selector": {"namespaces": [namespace]}, "idleFor": "3s",
                                               "dryRun": False, "actions": [{"type": "suspend"}]}))
    controller = _controller(control_plane, nodes, tmp_path)
    log = tmp_path / "controller.log"
    path = f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{namespace}/workloads/job-queued-train-1a2b"
    try:
        wait_until("the Kueue Workload deactivated", lambda: http.get(path)["spec"].get("active") is False,
                   log=log, timeout=90)
        assert http.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/queued-train")["spec"].get("suspend") is not True
        trail = wait_until("policyActions", _trail_of(control_plane, namespace, "queued-train", 1), log=log,
                           timeout=30)
        assert trail[0]["action"] == "suspend" and trail[0]["result"] == "Succeeded"
        assert "Kueue Workload job-queued-train-1a2b" in trail[0]["message"]
    finally:
        controller.stop()
        http.request("DELETE", f"{GROUP}/clustergpuidlepolicies/kueue-idle")
        http.request("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{KUEUE_CRD}")


LIMITED_NS = "ns-idle-limited"
LIMITED = "gpuwm-idle-limited"


def _limited_token(plane: ControlPlane) -> str:
    """A ServiceAccount with the controller's rules and the policies' own (read, status) but no right to act."""
    http = plane.admin()
    make_namespace(plane, LIMITED_NS)
    rules = [*REQUIRED_RULES, *idle_policy_rules([])]
    http.create(f"/api/v1/namespaces/{LIMITED_NS}/serviceaccounts", {"metadata": {"name": LIMITED}})
    http.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", {"metadata": {"name": LIMITED}, "rules": rules})
    http.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": LIMITED},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": LIMITED},
        "subjects": [{"kind": "ServiceAccount", "name": LIMITED, "namespace": LIMITED_NS}]})
    return plane.token(LIMITED_NS, LIMITED)


def test_missing_rights_are_named_and_a_refused_step_is_reported(control_plane: ControlPlane, nodes: list[GpuNode],
                                                                  tmp_path: Path) -> None:
    """Without the rights to act the policy says so at start; a step the API server refuses is recorded as failed
    on the policy (its status and an Event on it) and on the workload's trail."""
    http = control_plane.admin()
    namespace = "ns-idle-refused"
    token = _limited_token(control_plane)
    make_namespace(control_plane, namespace)
    node = _make_node(control_plane, tmp_path, nodes, "gpu-limited")
    pod = deployment_with_pod(control_plane, namespace, "refused", node.name)
    node.hold(pod)
    run_pod(control_plane, pod, time.time())
    node.start()
    apply(control_plane, policy("needs-rights", {"selector": {"namespaces": [namespace]}, "idleFor": "2s",
                                                 "dryRun": False,
                                                 "actions": [{"type": "warn"}, {"type": "scaleToZero", "after": "1s"}]}))
    controller = _controller(control_plane, nodes, tmp_path, token=token)
    log = tmp_path / "controller.log"
    try:
        status = wait_until("missing rights on the status", lambda: (s := policy_status(control_plane, "needs-rights"))
                            and s.get("missingPermissions") and s, log=log, timeout=60)
        assert "patch apps/deployments/scale" in status["missingPermissions"]
        assert "patch batch/jobs" not in status["missingPermissions"]  # suspend is not among its actions
        ready = {c["type"]: c for c in status["conditions"]}
        assert ready["Ready"]["status"] == "False" and ready["Ready"]["reason"] == "PermissionsMissing"
        assert ready["PermissionsMissing"]["status"] == "True"
        failed = wait_until("the refused step on the status", lambda: (s := policy_status(control_plane, "needs-rights"))
                            and s.get("actionsFailed", 0) >= 1 and s, log=log, timeout=90)
        assert failed["recentActions"][0]["result"] == "Failed" and "403" in failed["recentActions"][0]["message"]
        assert http.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/refused")["spec"]["replicas"] == 1
        trail = wait_until("the trail", _trail_of(control_plane, namespace, "refused", 2), log=log, timeout=30)
        assert [(entry["action"], entry["result"]) for entry in trail[:2]] == [("scaleToZero", "Failed"),
                                                                               ("warn", "Succeeded")]
        wait_until("an Event on the policy", lambda: "IdlePolicyActionFailed" in events(control_plane, "default",
                                                                                         "needs-rights"),
                   log=log, timeout=30)
    finally:
        controller.stop()
        http.request("DELETE", f"{GROUP}/clustergpuidlepolicies/needs-rights")
        for kind in ("clusterrolebindings", "clusterroles"):
            http.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/{kind}/{LIMITED}")


class _Hook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        _Hook.received.append(json.loads(self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_a_warning_also_calls_the_webhook_its_secret_names(control_plane: ControlPlane, nodes: list[GpuNode],
                                                           tmp_path: Path) -> None:
    http_api = control_plane.admin()
    namespace, own = "ns-idle-hook", "gpuwm-system-hook"
    make_namespace(control_plane, namespace)
    make_namespace(control_plane, own)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/alerts"
    http_api.create(f"/api/v1/namespaces/{own}/secrets", {"metadata": {"name": "idle-hook"},
                                                           "stringData": {"url": url}})
    node = _make_node(control_plane, tmp_path, nodes, "gpu-hook")
    pod = deployment_with_pod(control_plane, namespace, "hooked", node.name)
    node.hold(pod)
    run_pod(control_plane, pod, time.time())
    node.start()
    apply(control_plane, policy("tell-me", {"selector": {"namespaces": [namespace]}, "idleFor": "2s", "dryRun": False,
                                            "actions": [{"type": "warn", "webhookSecret": {"name": "idle-hook"}}]}))
    acting = json.dumps({"enabled": True, "actions": ["warn"], "webhooks": True})
    controller = _controller(control_plane, nodes, tmp_path, acting=acting, own_namespace=own)
    log = tmp_path / "controller.log"
    try:
        wait_until("the webhook called", lambda: _Hook.received, log=log, timeout=90)
        assert _Hook.received[0]["name"] == "hooked" and _Hook.received[0]["action"] == "warn"
        assert _Hook.received[0]["policy"] == "tell-me" and _Hook.received[0]["idleSeconds"] >= 2
        trail = wait_until("policyActions", _trail_of(control_plane, namespace, "hooked", 1), log=log, timeout=30)
        assert trail[0]["action"] == "warn" and trail[0]["result"] == "Succeeded"
        time.sleep(3.0)
        assert len(_Hook.received) == 1  # once per idle spell
    finally:
        controller.stop()
        server.shutdown()
        http_api.request("DELETE", f"{GROUP}/clustergpuidlepolicies/tell-me")
