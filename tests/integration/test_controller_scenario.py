"""The real `gpuwm controller` through a workload scenario as a real API server would run it.

Close to an acceptance scenario: a namespace is created; pods are created
Pending, without a node, owned by a Job and by a PyTorchJob (whose CRD is installed in one
run and missing in the other); the scheduler's binding sets their node and their status is
patched to Running; agents report busy then idle samples; every CR status field a user looks
at is checked, with the Events on the workloads when they turn Idle. A time-sliced node
(label nvidia.com/gpu.replicas=4) makes a one-GPU pod hold a quarter GPU. The controller is
SIGKILLed and restarted; at the end the namespace is deleted with its pods still running,
and the CRs go (project included) after retention.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.fakeagent import FakeAgents, FakeNode
from tests.integration.kubeemu import EmulatorThread, KubernetesEmulator, minimal_crd
from tests.integration.kubeemu.runner import KubeHttp
from tests.integration.kubeemu.tls import make_pki
from tests.integration.test_controller import CRDS, Controller, epoch, rfc3339, wait_until

pytestmark = pytest.mark.integration

NS = "ml-team"
GWM = f"/apis/gpuwm.io/v1alpha1/namespaces/{NS}/gpuworkloadmetrics"
GPM = "/apis/gpuwm.io/v1alpha1/gpuprojectmetrics"
RETENTION_SECONDS = 6


class Scenario:
    def __init__(self, thread: EmulatorThread) -> None:
        self.thread = thread
        self.http = KubeHttp(thread.url, thread.pki.client_context() if thread.pki is not None else None)

    def job(self, name: str) -> dict[str, Any]:
        created: dict[str, Any] = self.http.create(f"/apis/batch/v1/namespaces/{NS}/jobs", {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "main", "image": "trainer"}]}}},
        })
        return created

    def pod(self, name: str, owner: dict[str, Any], gpus: int = 1) -> dict[str, Any]:
        """Created Pending and unscheduled, as a Job or training operator creates it."""
        created: dict[str, Any] = self.http.create(f"/api/v1/namespaces/{NS}/pods", {
            "metadata": {"name": name, "labels": {"app": name},
                         "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        })
        return created

    def schedule_and_run(self, name: str, node: str, started: float) -> None:
        """What the scheduler (binding) and the kubelet (status) do."""
        self.http.ok("POST", f"/api/v1/namespaces/{NS}/pods/{name}/binding", {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        self.http.ok("PATCH", f"/api/v1/namespaces/{NS}/pods/{name}/status", {"status": {
            "phase": "Running", "startTime": rfc3339(started), "hostIP": "10.0.0.1", "podIP": "10.1.0.5",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0, "image": "trainer",
                                   "imageID": "", "started": True,
                                   "state": {"running": {"startedAt": rfc3339(started)}}}],
        }}, "application/merge-patch+json")

    def cr(self, name: str) -> dict[str, Any] | None:
        status, body = self.http.request("GET", f"{GWM}/{name}")
        return body if status == 200 else None

    def project(self, name: str) -> dict[str, Any] | None:
        status, body = self.http.request("GET", f"{GPM}/{name}")
        return body if status == 200 else None

    def idle_events(self, name: str) -> list[dict[str, Any]]:
        return [event for event in self.http.get(f"/api/v1/namespaces/{NS}/events")["items"]
                if event.get("reason") == "GpuIdle" and event["involvedObject"]["name"] == name]


@pytest.fixture(params=[True, False], ids=["pytorchjob-crd", "no-pytorchjob-crd"])
def scenario(request: pytest.FixtureRequest) -> Iterator[tuple[Scenario, bool]]:
    emulator = KubernetesEmulator(CRDS)
    emulator.bookmark_seconds = 1.0  # quiet watches get BOOKMARKs, as from a real API server
    if request.param:
        emulator.install_crd(minimal_crd("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"))
    with EmulatorThread(emulator) as thread:
        yield Scenario(thread), bool(request.param)


def _conditions(cr: dict[str, Any]) -> dict[str, str]:
    return {condition["type"]: condition["status"] for condition in cr["status"].get("conditions") or []}


def test_workload_scenario_on_a_strict_api(scenario: tuple[Scenario, bool], tmp_path: Path) -> None:
    s, crd_installed = scenario
    http = s.http
    http.create("/api/v1/namespaces", {"metadata": {"name": NS, "labels": {"gpuwm.io/project": "research"}}})
    http.create("/api/v1/nodes", {"metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.present": "true"}}})
    http.create("/api/v1/nodes", {"metadata": {"name": "gpu-shared", "labels": {"nvidia.com/gpu.replicas": "4"}}})
    train = s.job("train")
    if crd_installed:
        dist = http.create(f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs", {
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "dist"},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 1}}}})
        dist_ref = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "dist",
                    "uid": dist["metadata"]["uid"]}
    else:  # the training operator is gone, its CRD with it: the pods still name their owner
        dist_ref = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "dist",
                    "uid": "0b6f4a56-6b53-4a8e-9d1e-4a3c3f0e0d11"}
    notebook = s.job("notebook")
    job_ref = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": train["metadata"]["uid"]}
    s.pod("train-0", job_ref)
    s.pod("dist-master-0", dist_ref)
    s.pod("dist-worker-0", dist_ref)
    s.pod("notebook-0", {"apiVersion": "batch/v1", "kind": "Job", "name": "notebook",
                         "uid": notebook["metadata"]["uid"]})

    node_a = FakeNode("gpu-a", ["GPU-a0", "GPU-a1", "GPU-a2"], sm_percent=85.0)
    shared = FakeNode("gpu-shared", ["GPU-s0"], sm_percent=85.0)
    node_a.hold("GPU-a0", NS, "train-0")
    node_a.hold("GPU-a1", NS, "dist-master-0")
    node_a.hold("GPU-a2", NS, "dist-worker-0")
    shared.hold("GPU-s0", NS, "notebook-0", units=None)  # the replica count comes from the node label
    agents = FakeAgents(s.thread, [node_a, shared]).start()
    log = tmp_path / "controller.log"
    controller = Controller(s.thread.write_kubeconfig(tmp_path / "kubeconfig"), agents.spec(), tmp_path / "gpuwm.db",
                            log, ("--retention", f"{RETENTION_SECONDS}s"))
    controller.start()
    try:
        # Pending and unscheduled: a workload waiting for its GPUs
        pending = wait_until("train pending", lambda: (cr := s.cr("train")) and cr.get("status", {}).get("phase")
                             == "Pending" and cr, log=log)
        assert pending["status"]["allocatedGpus"] == 0 and pending["status"].get("startTime") is None

        started = time.time()
        s.schedule_and_run("train-0", "gpu-a", started)
        s.schedule_and_run("dist-master-0", "gpu-a", started)
        s.schedule_and_run("dist-worker-0", "gpu-a", started)
        s.schedule_and_run("notebook-0", "gpu-shared", started)

        # busy
        busy = wait_until("train busy", lambda: (cr := s.cr("train")) and cr["status"].get("activeGpuSeconds", 0)
                          >= 2 and cr, log=log)
        assert busy["spec"] == {"workloadRef": job_ref, "project": "research"}
        status = busy["status"]
        assert status["phase"] == "Running" and status["allocatedGpus"] == 1
        assert status["gpuModel"] == "NVIDIA H100 80GB HBM3" and status["nodes"] == ["gpu-a"]
        assert [(p["name"], p["node"], p["phase"], p["allocatedGpus"]) for p in status["pods"]] == [
            ("train-0", "gpu-a", "Running", 1)]
        assert [(g["uuid"], g["pod"], g["utilizationPercent"]) for g in status["gpus"]] == [("GPU-a0", "train-0", 85)]
        assert status["utilization"]["current"] == pytest.approx(85.0)
        assert status["utilization"]["avg1m"] == pytest.approx(85.0, abs=1.0)
        assert status["idleSeconds"] == 0 and status["idleGpuSeconds"] == 0
        assert status["allocatedGpuSeconds"] == pytest.approx(
            status["activeGpuSeconds"] + status["idleGpuSeconds"] + status["unmonitoredGpuSeconds"], abs=0.01)
        assert abs(epoch(status["startTime"]) - started) <= 1.0 and status["waitSeconds"] >= 0
        assert epoch(status["lastActiveTime"]) <= epoch(status["lastUpdateTime"]) + 1
        assert _conditions(busy) == {"Sampling": "True", "Idle": "False", "Underutilized": "False"}
        assert status["observedGeneration"] == busy["metadata"]["generation"] == 1

        dist = wait_until("dist running", lambda: (cr := s.cr("dist")) and cr["status"].get("allocatedGpus") == 2
                          and cr, log=log)
        assert dist["spec"]["workloadRef"] == dist_ref
        assert sorted(p["name"] for p in dist["status"]["pods"]) == ["dist-master-0", "dist-worker-0"]
        quarter = wait_until("notebook on the time-sliced node", lambda: (cr := s.cr("notebook")) and
                             cr["status"].get("allocatedGpus") and cr, log=log)
        assert quarter["status"]["allocatedGpus"] == 0.25  # nvidia.com/gpu.replicas=4 on its node
        assert quarter["status"]["gpus"][0]["units"] == 0.25

        # someone edits a CR's spec: the next status says which generation it saw
        http.merge(f"{GWM}/train", {"spec": {"project": "edited"}})
        wait_until("observedGeneration 2", lambda: (cr := s.cr("train")) and cr["metadata"]["generation"] == 2
                   and cr["status"].get("observedGeneration") == 2, log=log)

        # idle
        agents.set(sm_percent=0.0)
        idle = wait_until("train Idle", lambda: (cr := s.cr("train")) and _conditions(cr).get("Idle") == "True"
                          and cr, log=log)
        assert idle["status"]["idleSeconds"] >= 3 and idle["status"]["idleGpuSeconds"] > 0
        assert idle["status"]["utilization"]["current"] == 0
        for name, kind in (("train", "Job"), ("dist", "PyTorchJob")):
            events = wait_until(f"GpuIdle event on {name}", functools.partial(s.idle_events, name), log=log)
            assert len(events) == 1 and events[0]["type"] == "Warning"
            assert events[0]["involvedObject"]["kind"] == kind and events[0]["involvedObject"]["namespace"] == NS
        # the same Events through events.k8s.io/v1, whose clients need eventTime
        seen_v1 = [e for e in http.get(f"/apis/events.k8s.io/v1/namespaces/{NS}/events")["items"]
                   if e["reason"] == "GpuIdle"]
        assert {e["regarding"]["name"] for e in seen_v1} >= {"train", "dist"}
        assert all(e["eventTime"] and e["reportingController"] == "gpuwm-controller" and e["action"] for e in seen_v1)
        project = wait_until("project idle GPUs", lambda: (p := s.project("research")) and
                             p["status"].get("idleGpus") == 3.25 and p, log=log)
        assert project["status"]["allocatedGpus"] == 3.25 and project["status"]["workloads"] == 3
        assert project["status"]["namespaces"] == [NS]
        assert project["status"]["observedGeneration"] == project["metadata"]["generation"]

        # SIGKILL and restart: the totals go on
        before = s.cr("train")
        assert before is not None
        first_run_log = log.read_text()
        controller.kill()
        time.sleep(1.5)
        controller.start()
        after = wait_until("train after restart", lambda: (cr := s.cr("train")) and epoch(cr["status"][
            "lastUpdateTime"]) >= epoch(before["status"]["lastUpdateTime"]) + 3 and cr, log=log, timeout=40)
        held = after["status"]["allocatedGpuSeconds"]
        assert held == pytest.approx(epoch(after["status"]["lastUpdateTime"]) - started, abs=2.5)
        assert after["status"]["activeGpuSeconds"] == pytest.approx(before["status"]["activeGpuSeconds"], abs=1.5)
        assert len(s.idle_events("train")) == 1  # still the same idle spell: no second Event

        # the namespace is deleted with its pods still running: no writes resurrect it, the CRs go
        http.ok("DELETE", f"/api/v1/namespaces/{NS}")
        wait_until("namespace gone", lambda: http.request("GET", f"/api/v1/namespaces/{NS}")[0] == 404, log=log)
        wait_until("the controller noticed", lambda: "is being terminated or is gone" in log.read_text(), log=log)
        wait_until("project CR retired", lambda: s.project("research") is None, log=log,
                   timeout=RETENTION_SECONDS + 20)
        # the controller logs the deletion once the API server has answered it: the CR can be seen gone first
        wait_until("project CR deletion logged",
                   lambda: "retention: deleted GPUProjectMetrics research" in log.read_text(), log=log, timeout=10)
        assert controller.process is not None and controller.process.poll() is None
    finally:
        controller.stop()
        agents.stop()

    warned = first_run_log.count("kubeflow.org/v1 PyTorchJob is not served")
    assert warned == (0 if crd_installed else 1), first_run_log[-3000:]  # once per controller process
    requests = [r for r in s.thread.emulator.requests if "Python-urllib" not in r.user_agent]
    refused = [r for r in requests if r.status >= 400 and r.status not in {404, 409}
               and not (r.status == 403 and f"/namespaces/{NS}/" in r.path)]
    assert not refused, [(r.method, r.path, r.status) for r in refused]  # nothing the API server rejected
    creates_after_delete = [r for r in requests if r.method == "POST" and r.path == GWM and r.status in {403, 404}]
    assert len(creates_after_delete) <= 6  # a few refusals, then the namespace is left alone


def test_a_state_file_from_another_cluster_is_not_restored(tmp_path: Path) -> None:
    """Same --store path, a new API server (a fresh etcd, another test run): nothing of the old cluster comes back."""
    store = tmp_path / "gpuwm.db"
    log = tmp_path / "controller.log"
    with EmulatorThread(KubernetesEmulator(CRDS)) as first:
        s = Scenario(first)
        s.http.create("/api/v1/namespaces", {"metadata": {"name": NS}})
        s.http.create("/api/v1/namespaces", {"metadata": {"name": "kube-system"}})
        job = s.job("train")
        s.pod("train-0", {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": job["metadata"]["uid"]})
        s.schedule_and_run("train-0", "gpu-a", time.time())
        node = FakeNode("gpu-a", ["GPU-a0"], sm_percent=50.0)
        node.hold("GPU-a0", NS, "train-0")
        agents = FakeAgents(first, [node]).start()
        controller = Controller(first.write_kubeconfig(tmp_path / "kubeconfig"), agents.spec(), store, log)
        controller.start()
        try:
            wait_until("train written", lambda: (cr := s.cr("train")) and cr["status"].get("allocatedGpus") == 1,
                       log=log)
            wait_until("state saved", lambda: list(tmp_path.glob("gpuwm.db.engine.json")), log=log)
        finally:
            controller.kill()
            agents.stop()
    with EmulatorThread(KubernetesEmulator(CRDS)) as second:
        s = Scenario(second)
        s.http.create("/api/v1/namespaces", {"metadata": {"name": NS}})
        s.http.create("/api/v1/namespaces", {"metadata": {"name": "kube-system"}})
        controller = Controller(second.write_kubeconfig(tmp_path / "kubeconfig"), "static:gpu-a=http://127.0.0.1:9", store, log)
        controller.start()
        try:
            wait_until("the old state refused", lambda: "was saved for another cluster" in log.read_text(), log=log)
            time.sleep(3.0)  # a few status cycles
            assert s.cr("train") is None and s.project(NS) is None
            assert controller.process is not None and controller.process.poll() is None
        finally:
            controller.stop()


def test_the_controller_speaks_tls_with_a_client_certificate(tmp_path: Path) -> None:
    """HTTPS with the cluster's own CA and client-certificate auth (kubeadm's admin.conf): kopf's watches
    and the controller's own client both connect; nothing is sent in the clear."""
    emulator = KubernetesEmulator(CRDS)
    with EmulatorThread(emulator, make_pki(tmp_path / "pki")) as thread:
        assert thread.url.startswith("https://")
        s = Scenario(thread)
        s.http.create("/api/v1/namespaces", {"metadata": {"name": NS, "labels": {"gpuwm.io/project": "secure"}}})
        job = s.job("train")
        s.pod("train-0", {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": job["metadata"]["uid"]})
        s.schedule_and_run("train-0", "gpu-a", time.time())
        node = FakeNode("gpu-a", ["GPU-a0"], sm_percent=60.0)
        node.hold("GPU-a0", NS, "train-0")
        agents = FakeAgents(thread, [node]).start()
        log = tmp_path / "controller.log"
        controller = Controller(thread.write_kubeconfig(tmp_path / "kubeconfig"), agents.spec(), tmp_path / "gpuwm.db",
                                log)
        controller.start()
        try:
            cr = wait_until("train over TLS", lambda: (c := s.cr("train")) and c["status"].get("activeGpuSeconds", 0)
                            >= 1 and c, log=log)
            assert cr["status"]["observedGeneration"] == 1
            wait_until("project over TLS", lambda: s.project("secure"), log=log)
        finally:
            controller.stop()
            agents.stop()
        mine = [r for r in emulator.requests if "Python-urllib" not in r.user_agent]
        assert any(r.query.get("watch") == "true" and r.path == "/api/v1/pods" for r in mine)  # kopf's watch
        assert any(r.method == "PATCH" and r.path.endswith("/train/status") for r in mine)  # our client
