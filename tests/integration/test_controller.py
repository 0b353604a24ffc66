"""The real `gpuwm controller` process against the API emulator, with agents served from a script.

Scenario: a namespace with a project label, a Job-owned pod and a PyTorchJob-owned pod set
holding GPUs (plus a pod without GPUs), moved to Running; busy then idle samples; the CR
status figures; SIGKILL and restart mid-run; the workload's end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.integration.fakeagent import FakeAgents, FakeNode
from tests.integration.kubeemu import EmulatorThread, Fault, KubeHttp, KubernetesEmulator, minimal_crd

pytestmark = pytest.mark.integration

CRDS = Path(__file__).resolve().parents[2] / "crds"
NS = "team-a"
GWM = f"/apis/gpuwm.io/v1alpha1/namespaces/{NS}/gpuworkloadmetrics"
GPM = "/apis/gpuwm.io/v1alpha1/gpuprojectmetrics"
STATUS_INTERVAL = 1.0


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def wait_until(what: str, check: Callable[[], Any], timeout: float = 30.0, log: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (AssertionError, KeyError, TypeError) as error:
            last = error
        else:
            if last:
                return last
        time.sleep(0.2)
    tail = log.read_text()[-4000:] if log is not None and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}\ncontroller log tail:\n{tail}")


class Cluster:
    """The emulator, the scenario's objects and helpers to move them along."""

    def __init__(self, thread: EmulatorThread) -> None:
        self.thread = thread
        self.http = KubeHttp(thread.url)

    def owner(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
                 "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]

    def pod(self, name: str, node: str, owners: list[dict[str, Any]], gpus: int = 1) -> dict[str, Any]:
        resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {"requests": {"cpu": "1"}}
        created: dict[str, Any] = self.http.create(f"/api/v1/namespaces/{NS}/pods", {
            "metadata": {"name": name, "ownerReferences": owners, "labels": {"app": name}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "trainer", "resources": resources}]},
        })
        return created

    def run_pod(self, name: str, started: float) -> None:
        self.http.ok("PATCH", f"/api/v1/namespaces/{NS}/pods/{name}/status", {"status": {
            "phase": "Running", "startTime": rfc3339(started),
            "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0, "image": "trainer", "imageID": "",
                                   "state": {"running": {"startedAt": rfc3339(started)}}}],
        }}, "application/merge-patch+json")

    def finish_pod(self, name: str, started: float, finished: float) -> None:
        self.http.ok("PATCH", f"/api/v1/namespaces/{NS}/pods/{name}/status", {"status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": "main", "ready": False, "restartCount": 0, "image": "trainer", "imageID": "",
                                   "state": {"terminated": {"exitCode": 0, "startedAt": rfc3339(started),
                                                            "finishedAt": rfc3339(finished)}}}],
        }}, "application/merge-patch+json")

    def cr(self, name: str) -> dict[str, Any] | None:
        status, body = self.http.request("GET", f"{GWM}/{name}")
        return body if status == 200 else None


class Controller:
    """The real `gpuwm controller` as a subprocess; SIGKILL-able."""

    def __init__(self, kubeconfig: Path, agents: str, store: Path, log: Path, extra: tuple[str, ...] = (),
                 status_interval: float = STATUS_INTERVAL, interval: float = 1.0) -> None:
        self.args = [
            sys.executable, "-m", "gpuwm.cli", "controller", "--standalone", "--agents", agents,
            "--status-interval", str(status_interval), "--interval", str(interval), "--store", str(store),
            "--idle-condition-after", "3s", "--log-format", "text", "--log-level", "info",
            "--api-listen", "127.0.0.1:0", "--auth", "none", "--api-tls=false", *extra,
        ]
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        self.env.pop("KUBERNETES_SERVICE_HOST", None)
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        handle = self.log.open("ab")
        self.process = subprocess.Popen(self.args, env=self.env, stdout=handle, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    emulator = KubernetesEmulator(CRDS)
    emulator.install_crd(minimal_crd("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"))
    with EmulatorThread(emulator) as thread:
        yield Cluster(thread)


def _setup_workloads(cluster: Cluster) -> dict[str, Any]:
    http = cluster.http
    http.create("/api/v1/namespaces", {"metadata": {"name": NS, "labels": {"gpuwm.io/project": "vision"}}})
    job = http.create(f"/apis/batch/v1/namespaces/{NS}/jobs", {"metadata": {"name": "train"}, "spec": {"template": {}}})
    pytorch = http.create(f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs",
                          {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pt"},
                           "spec": {"pytorchReplicaSpecs": {}}})
    pods = {
        "train-0": cluster.pod("train-0", "node-a", cluster.owner(job)),
        "pt-master-0": cluster.pod("pt-master-0", "node-b", cluster.owner(pytorch)),
        "pt-worker-0": cluster.pod("pt-worker-0", "node-a", cluster.owner(pytorch)),
        "web": cluster.pod("web", "node-a", [], gpus=0),
    }
    return {"job": job, "pytorch": pytorch, "pods": pods}


def _hold_and_run(cluster: Cluster, objects: dict[str, Any], node_a: FakeNode, node_b: FakeNode) -> tuple[FakeAgents, float]:
    """The workloads' GPUs held as pod-resources says (train-0 and pt-worker-0 on node-a, pt-master-0 on node-b, by
    UID), the agents serving, the pods running: (the agents, when the pods started)."""
    node_a.hold("GPU-a0", NS, "train-0")
    node_a.hold("GPU-a1", NS, "pt-worker-0")
    node_b.hold("GPU-b0", NS, "pt-master-0", pod_uid=objects["pods"]["pt-master-0"]["metadata"]["uid"])
    agents = FakeAgents(cluster.thread, [node_a, node_b]).start()
    started = time.time()
    for name in ("train-0", "pt-master-0", "pt-worker-0"):
        cluster.run_pod(name, started)
    return agents, started


def test_controller_end_to_end_with_restart(cluster: Cluster, tmp_path: Path) -> None:
    objects = _setup_workloads(cluster)
    node_a = FakeNode("node-a", ["GPU-a0", "GPU-a1", "GPU-a2"], sm_percent=80.0)
    node_b = FakeNode("node-b", ["GPU-b0"], sm_percent=80.0)
    agents, started = _hold_and_run(cluster, objects, node_a, node_b)
    log = tmp_path / "controller.log"
    controller = Controller(cluster.thread.write_kubeconfig(tmp_path / "kubeconfig"), agents.spec(),
                            tmp_path / "gpuwm.db", log)
    controller.start()
    try:
        # busy: the Job's CR appears with its GPU, active time accrues
        train = wait_until("train busy", lambda: (cr := cluster.cr("train")) and
                           cr["status"].get("activeGpuSeconds", 0) >= 2 and cr, log=log)
        assert train["spec"]["workloadRef"] == {"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                                                "uid": objects["job"]["metadata"]["uid"]}
        assert train["spec"]["project"] == "vision"
        assert train["metadata"]["labels"]["gpuwm.io/workload-kind"] == "Job"
        status = train["status"]
        assert status["phase"] == "Running" and status["allocatedGpus"] == 1
        assert [pod["name"] for pod in status["pods"]] == ["train-0"]
        assert [gpu["uuid"] for gpu in status["gpus"]] == ["GPU-a0"]
        assert status["utilization"]["current"] == pytest.approx(80.0)
        assert status["idleGpuSeconds"] == 0

        pt = wait_until("pytorchjob CR", lambda: (cr := cluster.cr("pt")) and cr["status"].get("allocatedGpus") == 2
                        and cr, log=log)
        assert pt["spec"]["workloadRef"]["kind"] == "PyTorchJob"
        assert sorted(pod["name"] for pod in pt["status"]["pods"]) == ["pt-master-0", "pt-worker-0"]
        assert sorted(gpu["uuid"] for gpu in pt["status"]["gpus"]) == ["GPU-a1", "GPU-b0"]
        project = wait_until("project CR", lambda: (p := cluster.http.request("GET", f"{GPM}/vision")[1]) and
                             p.get("status", {}).get("allocatedGpus") == 3 and p, log=log)
        assert project["spec"]["project"] == "vision" and project["status"]["workloads"] == 2
        assert cluster.cr("web") is None  # a pod without GPUs is not a workload

        # idle: idle GPU-seconds grow, the Idle condition turns True, an Event is posted on the Job
        agents.set(sm_percent=0.0)
        idle = wait_until("train idle condition", lambda: (cr := cluster.cr("train")) and any(
            c["type"] == "Idle" and c["status"] == "True" for c in cr["status"]["conditions"]) and cr, log=log)
        assert idle["status"]["idleGpuSeconds"] > 0 and idle["status"]["idleSeconds"] >= 3
        events = wait_until("GpuIdle event", lambda: [e for e in cluster.http.get(f"/api/v1/namespaces/{NS}/events")["items"]
                                                      if e["reason"] == "GpuIdle"
                                                      and e["involvedObject"]["name"] == "train"], log=log)
        assert events[0]["involvedObject"]["kind"] == "Job"

        # SIGKILL mid-run, restart: cumulative GPU-seconds carry on as if nothing happened
        before = cluster.cr("train")
        assert before is not None
        controller.kill()
        time.sleep(2.0)
        controller.start()
        before_update = epoch(before["status"]["lastUpdateTime"])
        after = wait_until("status after restart", lambda: (cr := cluster.cr("train")) and
                           epoch(cr["status"]["lastUpdateTime"]) >= before_update + 3 and cr, log=log, timeout=40)
        elapsed = epoch(after["status"]["lastUpdateTime"]) - before_update
        gained = after["status"]["allocatedGpuSeconds"] - before["status"]["allocatedGpuSeconds"]
        assert gained == pytest.approx(elapsed, abs=STATUS_INTERVAL + 1.0)  # 1 GPU: one GPU-second a second
        held = after["status"]["allocatedGpuSeconds"]
        assert held == pytest.approx(epoch(after["status"]["lastUpdateTime"]) - started, abs=STATUS_INTERVAL + 1.5)
        split = sum(after["status"][k] for k in ("activeGpuSeconds", "idleGpuSeconds", "unmonitoredGpuSeconds"))
        assert split == pytest.approx(held, abs=0.01)
        assert after["status"]["activeGpuSeconds"] >= before["status"]["activeGpuSeconds"]

        # killed again and its state file lost: the CRs' own status carries the totals over
        controller.kill()
        for state_file in tmp_path.glob("gpuwm.db.engine.json*"):
            state_file.unlink()
        time.sleep(1.0)
        controller.start()
        again = wait_until("status after a restart without state", lambda: (cr := cluster.cr("train")) and
                           epoch(cr["status"]["lastUpdateTime"]) >= epoch(after["status"]["lastUpdateTime"]) + 3
                           and cr, log=log, timeout=40)
        assert "state from crs" in log.read_text()
        elapsed = epoch(again["status"]["lastUpdateTime"]) - epoch(after["status"]["lastUpdateTime"])
        gained = again["status"]["allocatedGpuSeconds"] - after["status"]["allocatedGpuSeconds"]
        # the new engine counts from the CR's lastUpdateTime on: nothing lost across the downtime
        assert gained == pytest.approx(elapsed, abs=STATUS_INTERVAL + 1.5)
        assert again["status"]["startTime"] == after["status"]["startTime"]

        # the Job's pod ends: the CR records the end and keeps its final figures
        finished = time.time()
        cluster.finish_pod("train-0", started, finished)
        ended = wait_until("train ended", lambda: (cr := cluster.cr("train")) and cr["status"].get("endTime")
                           and cr["status"]["allocatedGpus"] == 0 and cr, log=log)
        assert ended["status"]["phase"] in {"Succeeded", "Ended"}
        assert ended["status"]["allocatedGpuSeconds"] == pytest.approx(finished - started, abs=2.0 + 2 * STATUS_INTERVAL)

        # the metrics API runs inside the controller, over the same store
        match = re.findall(r"metrics API listening on (?:https?://)?127\.0\.0\.1:(\d+)", log.read_text())
        assert match, "the controller did not start the metrics API"
        with urllib.request.urlopen(f"http://127.0.0.1:{match[-1]}/api/v1/workloads", timeout=10) as response:
            listed = json.loads(response.read())
        assert "train" in json.dumps(listed)
    finally:
        controller.stop()
        agents.stop()

    # the controller never wrote to a user's pod, and wrote CR status through /status as `gpuwm`
    mine = [r for r in cluster.thread.emulator.requests if "Python-urllib" not in r.user_agent]
    assert not [r for r in mine if "/pods" in r.path and r.method in {"PATCH", "PUT", "POST", "DELETE"}]
    status_writes = [r for r in mine if r.method == "PATCH" and r.path.endswith("/status")]
    assert status_writes and all(r.query.get("fieldManager") == "gpuwm" for r in status_writes)
    assert all(r.content_type == "application/merge-patch+json" for r in status_writes)


def test_merged_polls_count_as_every_poll_in_the_real_controller(cluster: Cluster, tmp_path: Path) -> None:
    """Agents polling at 5 Hz, pulled every 3 s: runs of polls arrive merged (`snapshotMerge`), busy then idle."""
    objects = _setup_workloads(cluster)
    node_a = FakeNode("node-a", ["GPU-a0", "GPU-a1"], interval=0.2, sm_percent=80.0)
    node_b = FakeNode("node-b", ["GPU-b0"], interval=0.2, sm_percent=80.0)
    agents, started = _hold_and_run(cluster, objects, node_a, node_b)
    log = tmp_path / "controller.log"
    controller = Controller(cluster.thread.write_kubeconfig(tmp_path / "kubeconfig"), agents.spec(),
                            tmp_path / "gpuwm.db", log, status_interval=3.0, interval=0.2)
    controller.start()
    try:
        busy = wait_until("train busy", lambda: (cr := cluster.cr("train")) and
                          cr["status"].get("activeGpuSeconds", 0) >= 6 and cr, log=log, timeout=40)
        assert busy["status"]["utilization"]["current"] == pytest.approx(80.0)
        assert busy["status"]["idleGpuSeconds"] == 0
        agents.set(sm_percent=0.0)
        idled = time.time()
        idle = wait_until("train idle", lambda: (cr := cluster.cr("train")) and
                          cr["status"].get("idleGpuSeconds", 0) >= 6 and cr, log=log, timeout=40)
    finally:
        controller.stop()
        agents.stop()
    assert node_a.merged_served > 0 and node_b.merged_served > 0  # the controller asked, the agents merged
    status = idle["status"]
    now = epoch(status["lastUpdateTime"])
    assert status["allocatedGpuSeconds"] == pytest.approx(now - started, abs=3.0 + 1.5)
    split = sum(status[k] for k in ("activeGpuSeconds", "idleGpuSeconds", "unmonitoredGpuSeconds"))
    assert split == pytest.approx(status["allocatedGpuSeconds"], abs=0.01)
    # unmonitored: only the time before the agent's first poll (the pod's start is whole seconds); merged runs,
    # 3 s and 15 polls each, are monitored
    assert status["unmonitoredGpuSeconds"] == pytest.approx(node_a.samples[0]["t"] - int(started), abs=0.3)
    # busy from the agent's first poll (which waits for the controller's first pull) until it idled
    assert status["activeGpuSeconds"] == pytest.approx(idled - node_a.samples[0]["t"], abs=3.0 + 1.5)
    assert status["utilization"]["current"] == 0.0 and status["idleSeconds"] >= 5
    assert epoch(status["lastActiveTime"]) == pytest.approx(idled, abs=1.0)


def test_controller_survives_api_faults_and_agent_outage(cluster: Cluster, tmp_path: Path) -> None:
    objects = _setup_workloads(cluster)
    node_a = FakeNode("node-a", ["GPU-a0", "GPU-a1"], sm_percent=50.0)
    node_b = FakeNode("node-b", ["GPU-b0"], sm_percent=50.0)
    node_a.hold("GPU-a0", NS, "train-0", pod_uid=objects["pods"]["train-0"]["metadata"]["uid"])
    node_a.hold("GPU-a1", NS, "pt-worker-0")
    node_b.hold("GPU-b0", NS, "pt-master-0")
    agents = FakeAgents(cluster.thread, [node_a, node_b]).start()
    started = time.time()
    for name in ("train-0", "pt-master-0", "pt-worker-0"):
        cluster.run_pod(name, started)
    emulator = cluster.thread.emulator
    # the first CR writes and a pod list meet 429s and 503s; the controller retries with backoff
    emulator.faults.append(Fault(status=429, count=3, methods=frozenset({"POST", "PATCH"}),
                                 path_contains="gpuworkloadmetrics", retry_after=1))
    emulator.faults.append(Fault(status=503, count=2, methods=frozenset({"GET"}), path_contains="/pods"))
    log = tmp_path / "controller.log"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        liveness_port = probe.getsockname()[1]
    controller = Controller(cluster.thread.write_kubeconfig(tmp_path / "kubeconfig"), agents.spec(),
                            tmp_path / "gpuwm.db", log, ("--liveness", f"http://127.0.0.1:{liveness_port}/healthz"))
    controller.start()
    try:
        wait_until("train written despite faults", lambda: (cr := cluster.cr("train")) and
                   cr["status"].get("activeGpuSeconds", 0) >= 1, log=log)
        assert all(fault.count == 0 for fault in emulator.faults)
        with urllib.request.urlopen(f"http://127.0.0.1:{liveness_port}/healthz", timeout=10) as response:
            probes = json.loads(response.read())
        assert probes["statusCycles"]["cycles"] >= 1  # kopf's liveness endpoint with our probe

        # a dropped watch: a pod created afterwards is still seen
        assert cluster.thread.call(emulator.drop_watches) >= 1
        job2 = cluster.http.create(f"/apis/batch/v1/namespaces/{NS}/jobs", {"metadata": {"name": "eval"}, "spec": {}})
        cluster.pod("eval-0", "node-a", cluster.owner(job2))
        cluster.run_pod("eval-0", time.time())
        wait_until("CR of a pod created after the watch dropped", lambda: cluster.cr("eval"), log=log)

        # node-b's agent stops answering: its GPU becomes unmonitored, never idle
        pt_before = wait_until("pt CR", lambda: cluster.cr("pt"), log=log)
        agents.thread.call(lambda: setattr(node_b, "down", True))
        pt_after = wait_until("pt unmonitored time", lambda: (cr := cluster.cr("pt")) and
                              cr["status"]["unmonitoredGpuSeconds"] >= pt_before["status"]["unmonitoredGpuSeconds"] + 4
                              and cr, log=log, timeout=40)
        # Sampling turns False once the latest sample is older than the reporting window (the gap, a status
        # interval and the cycle's lateness), which can come a little after the unmonitored time starts
        pt_after = wait_until("pt Sampling False", lambda: (cr := cluster.cr("pt")) and any(
            c["type"] == "Sampling" and c["status"] == "False" for c in cr["status"]["conditions"]) and cr,
            log=log, timeout=40)
        assert pt_after["status"]["idleGpuSeconds"] == pytest.approx(pt_before["status"]["idleGpuSeconds"], abs=0.01)
        assert not any(c["type"] == "Idle" and c["status"] == "True" for c in pt_after["status"]["conditions"])
        assert controller.process is not None and controller.process.poll() is None  # never crashed
        assert "did not answer" in log.read_text()

        # a malformed GPU pod is skipped with a warning naming it; the controller carries on
        cluster.http.create(f"/api/v1/namespaces/{NS}/pods", {
            "metadata": {"name": "broken"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "lots"}}}]},
        })
        wait_until("warning naming the malformed pod", lambda: "broken" in log.read_text(), log=log)
        assert controller.process.poll() is None
    finally:
        controller.stop()
        agents.stop()


def test_finished_workload_cr_is_deleted_after_retention(cluster: Cluster, tmp_path: Path) -> None:
    objects = _setup_workloads(cluster)
    node_a = FakeNode("node-a", ["GPU-a0"], sm_percent=30.0)
    node_a.hold("GPU-a0", NS, "train-0")
    agents = FakeAgents(cluster.thread, [node_a]).start()
    started = time.time()
    cluster.run_pod("train-0", started)
    log = tmp_path / "controller.log"
    controller = Controller(cluster.thread.write_kubeconfig(tmp_path / "kubeconfig"), agents.spec(),
                            tmp_path / "gpuwm.db", log, ("--retention", "4s"))
    controller.start()
    try:
        wait_until("train running", lambda: (cr := cluster.cr("train")) and cr["status"].get("allocatedGpus") == 1,
                   log=log)
        cluster.finish_pod("train-0", started, time.time())
        ended = wait_until("train ended", lambda: (cr := cluster.cr("train")) and cr["status"].get("endTime") and cr,
                           log=log)
        assert ended["spec"]["workloadRef"]["uid"] == objects["job"]["metadata"]["uid"]
        wait_until("CR deleted after retention", lambda: cluster.cr("train") is None, log=log, timeout=30)
        assert "retention: deleted GPUWorkloadMetrics team-a/train" in log.read_text()
        time.sleep(3 * STATUS_INTERVAL)
        assert cluster.cr("train") is None  # and not written again
        # the project still has the PyTorchJob (pending): its CR stays until that workload is gone too
        assert cluster.http.request("GET", f"{GPM}/vision")[0] == 200
        for name in ("pt-master-0", "pt-worker-0"):
            cluster.http.ok("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}")
        wait_until("pt CR deleted after retention", lambda: cluster.cr("pt") is None, log=log, timeout=30)
        wait_until("project CR deleted with its last workload",
                   lambda: cluster.http.request("GET", f"{GPM}/vision")[0] == 404, log=log, timeout=15)
        assert "retention: deleted GPUProjectMetrics vision (no workloads left)" in log.read_text()
    finally:
        controller.stop()
        agents.stop()
