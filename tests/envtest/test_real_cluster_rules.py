"""What a real cluster does that the emulator does not, on a real kube-apiserver with its
garbage collector, the real controller and (where named) the real agent on the fake NVML.

- A GPU pod's allocation counts from Kubernetes: a Running Job's pod on a node where no agent reports
  holds its requested GPU from its start, all of the time unmonitored and never idle; an agent that
  comes later names the device, whose samples count from then on, and nothing is counted twice.
- A pod whose owner changes: `DELETE job` with propagationPolicy=Orphan has the garbage collector strip
  the pod's ownerReferences; the pod becomes its own workload from then on, the Job's workload ends,
  and the project counts its GPU once, every GPU-second once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.envtest.conftest import make_namespace
from tests.envtest.controlplane import ControlPlane, free_port
from tests.envtest.gpunode import GpuNode, busy, create_job, epoch, job_pod, run_pod
from tests.fakenvml import build_fake_nvml
from tests.integration.test_controller import Controller, wait_until

pytestmark = pytest.mark.envtest

STATUS_INTERVAL = 1.0
GWM = "/apis/gpuwm.io/v1alpha1/namespaces/{namespace}/gpuworkloadmetrics/{name}"


@pytest.fixture(scope="module")
def nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.mktemp("fakenvml"))


class Cluster:
    """A namespace of its own project, a fake GPU node whose agent listens (once started) on `agent_port`,
    a controller that pulls that port from its start, and a Job `train` whose one pod is bound to the node."""

    def __init__(self, plane: ControlPlane, node: GpuNode, namespace: str, project: str, tmp_path: Path) -> None:
        self.plane = plane
        self.node = node
        self.namespace = namespace
        self.project = project
        self.http = plane.admin()
        self.agent_port = free_port()
        self.controller = Controller(
            plane.write_kubeconfig(tmp_path / "kubeconfig"), f"static:{node.name}=http://127.0.0.1:{self.agent_port}",
            tmp_path / "gpuwm.db", tmp_path / "controller.log", status_interval=STATUS_INTERVAL, interval=0.5)
        self.job: dict[str, Any] = {}
        self.pod: dict[str, Any] = {}
        self.started = 0.0

    @property
    def log(self) -> Path:
        return self.controller.log

    def run_job(self) -> None:
        make_namespace(self.plane, self.namespace, {"gpuwm.io/project": self.project})
        self.node.create()
        self.job = create_job(self.plane, self.namespace, "train", self.node.name)
        self.pod = job_pod(self.plane, self.namespace, "train")
        self.started = float(int(time.time()))  # the kubelet writes whole seconds
        run_pod(self.plane, self.pod, self.started)

    def start_agent(self, scenario: str) -> None:
        self.node.set(scenario)
        self.node.hold(self.pod)
        self.node.start(port=self.agent_port)

    def cr(self, name: str) -> dict[str, Any] | None:
        status, body = self.http.request("GET", GWM.format(namespace=self.namespace, name=name))
        return body if status == 200 and body.get("status") else None

    def project_cr(self) -> dict[str, Any] | None:
        status, body = self.http.request("GET", f"/apis/gpuwm.io/v1alpha1/gpuprojectmetrics/{self.project}")
        return body if status == 200 and body.get("status") else None

    def printed_gpus(self, name: str) -> str:
        """The GPUs printer column as `kubectl get gwm` shows it."""
        return self.plane.kubectl("get", "gwm", name, "-n", self.namespace, "--no-headers",
                                  "-o", "custom-columns=GPUS:.status.allocatedGpus").stdout.strip()


@pytest.fixture
def cluster(request: pytest.FixtureRequest, control_plane: ControlPlane, crds: list[str], nvml_lib: Path,
            tmp_path: Path) -> Iterator[Cluster]:
    short = request.node.name.removeprefix("test_")[:20].replace("_", "-").strip("-")
    node = GpuNode(control_plane, f"gpu-{short}", tmp_path, nvml_lib)
    scene = Cluster(control_plane, node, f"ns-{short}", f"proj-{short}", tmp_path)
    try:
        yield scene
    finally:
        scene.controller.stop()
        node.stop()
    assert "Traceback" not in scene.log.read_text(), scene.log.read_text()[-4000:]


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in status.get("conditions") or [] if c["type"] == kind]
    assert len(found) == 1, status.get("conditions")
    return found[0]


def _split(status: dict[str, Any]) -> float:
    return float(sum(status[k] for k in ("activeGpuSeconds", "idleGpuSeconds", "unmonitoredGpuSeconds")))


def test_a_gpu_pod_without_an_agent_holds_its_gpu_unmonitored(cluster: Cluster) -> None:
    cluster.run_job()
    cluster.controller.start()
    first = wait_until("train allocated with no agent", lambda: (cr := cluster.cr("train"))
                       and cr["status"].get("allocatedGpus") == 1 and cr["status"].get("allocatedGpuSeconds", 0) >= 2
                       and cr, log=cluster.log, timeout=60)
    later = wait_until("more unmonitored time", lambda: (cr := cluster.cr("train")) and
                       cr["status"]["allocatedGpuSeconds"] >= first["status"]["allocatedGpuSeconds"] + 2 and cr,
                       log=cluster.log, timeout=30)
    status = later["status"]
    assert status["phase"] == "Running", status
    assert cluster.printed_gpus("train") == "1"
    assert status["activeGpuSeconds"] == 0 and status["idleGpuSeconds"] == 0, status
    assert status["unmonitoredGpuSeconds"] == pytest.approx(status["allocatedGpuSeconds"], abs=0.01), status
    # from the pod's start, as the GPU was held before the controller ran
    assert status["allocatedGpuSeconds"] == pytest.approx(epoch(status["lastUpdateTime"]) - cluster.started,
                                                          abs=STATUS_INTERVAL + 1.5), status
    assert _condition(status, "Sampling")["status"] != "True", status["conditions"]
    assert _condition(status, "Idle")["status"] != "True", status["conditions"]
    project = wait_until("project allocated", lambda: (p := cluster.project_cr()) and
                         p["status"].get("allocatedGpus") == 1 and p, log=cluster.log)
    assert project["status"].get("idleGpus", 0) == 0, project["status"]

    # the node's agent comes: it names the pod's device, whose samples count from now on
    cluster.start_agent(busy(80.0))
    agent_up = time.time()
    active = wait_until("train active", lambda: (cr := cluster.cr("train")) and
                        cr["status"].get("activeGpuSeconds", 0) >= 3 and cr, log=cluster.log, timeout=60)
    status = active["status"]
    assert status["allocatedGpus"] == 1 and status["phase"] == "Running", status
    assert [(g["uuid"], g["node"]) for g in status["gpus"]] == [("GPU-e0e0", cluster.node.name)], status["gpus"]
    assert cluster.printed_gpus("train") == "1"
    # one GPU held since the pod's start, once: the stand-in's time was replaced, not added to
    held = status["allocatedGpuSeconds"]
    assert held == pytest.approx(epoch(status["lastUpdateTime"]) - cluster.started, abs=STATUS_INTERVAL + 1.5), status
    assert _split(status) == pytest.approx(held, abs=0.01), status
    # the time before the agent stays unmonitored; the active time is what the agent sampled
    assert status["unmonitoredGpuSeconds"] >= later["status"]["unmonitoredGpuSeconds"] - 0.01, status
    assert status["activeGpuSeconds"] <= time.time() - agent_up + 0.5, status
    assert status["idleGpuSeconds"] == 0, status
    assert status["utilization"]["current"] == pytest.approx(80.0), status["utilization"]
    wait_until("Sampling True", lambda: (cr := cluster.cr("train")) and
               _condition(cr["status"], "Sampling")["status"] == "True", log=cluster.log)


def test_an_orphaned_pod_moves_to_its_own_workload_and_counts_once(cluster: Cluster) -> None:
    cluster.run_job()
    cluster.start_agent(busy(80.0))
    cluster.controller.start()
    wait_until("train busy", lambda: (cr := cluster.cr("train")) and cr["status"].get("activeGpuSeconds", 0) >= 2
               and cr, log=cluster.log, timeout=60)
    pod_name, pod_uid = cluster.pod["metadata"]["name"], cluster.pod["metadata"]["uid"]

    # kubectl delete job train --cascade=orphan: the garbage collector strips the pod's ownerReferences
    orphaned = time.time()
    cluster.http.ok("DELETE", f"/apis/batch/v1/namespaces/{cluster.namespace}/jobs/train",
                    {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Orphan"})
    pod_path = f"/api/v1/namespaces/{cluster.namespace}/pods/{pod_name}"
    wait_until("the pod orphaned by the garbage collector", lambda: not cluster.http.get(pod_path)["metadata"]
               .get("ownerReferences"), timeout=30)
    assert cluster.http.get(pod_path)["metadata"]["uid"] == pod_uid

    # the pod is now a workload of its own (a bare pod); the Job's ends
    own = wait_until("the pod's own workload running", lambda: (cr := cluster.cr(pod_name)) and
                     cr["status"].get("phase") == "Running" and cr["status"].get("allocatedGpus") == 1 and cr,
                     log=cluster.log, timeout=60)
    assert own["spec"]["workloadRef"] == {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid}
    assert [p["uid"] for p in own["status"]["pods"]] == [pod_uid]
    ended = wait_until("train ended", lambda: (cr := cluster.cr("train")) and cr["status"].get("phase") == "Ended"
                       and cr, log=cluster.log, timeout=30)
    old = ended["status"]
    assert old["allocatedGpus"] == 0 and old.get("endTime"), old
    assert epoch(old["endTime"]) == pytest.approx(orphaned, abs=STATUS_INTERVAL + 2.0), old
    # up to the orphaning the Job held the GPU; from it the pod does
    assert old["allocatedGpuSeconds"] == pytest.approx(orphaned - cluster.started, abs=STATUS_INTERVAL + 2.0), old
    assert _split(old) == pytest.approx(old["allocatedGpuSeconds"], abs=0.01), old

    # a few seconds on (the agent hands its polls over every nvmlBufferReadSeconds, so the samples after the move
    # come up to 5 s late): the two CRs share the pod's time without overlap
    after = wait_until("the pod's workload sampled after the move", lambda: (cr := cluster.cr(pod_name)) and
                       epoch(cr["status"]["lastUpdateTime"]) >= time.time() - STATUS_INTERVAL - 0.5
                       and cr["status"]["activeGpuSeconds"] >= 2 and cr, log=cluster.log, timeout=30)
    new = after["status"]
    assert new["allocatedGpus"] == 1 and new["phase"] == "Running", new
    assert _split(new) == pytest.approx(new["allocatedGpuSeconds"], abs=0.01), new
    assert new["utilization"]["current"] == pytest.approx(80.0), new
    frozen = cluster.cr("train")
    assert frozen is not None and frozen["status"]["allocatedGpuSeconds"] == old["allocatedGpuSeconds"]
    total = old["allocatedGpuSeconds"] + new["allocatedGpuSeconds"]
    assert total == pytest.approx(epoch(new["lastUpdateTime"]) - cluster.started, abs=STATUS_INTERVAL + 2.0), (old, new)
    # the project counts the GPU once through the move (not 2, not 0) and its time once
    seen: list[tuple[float, dict[str, Any]]] = []
    deadline = time.monotonic() + 3 * STATUS_INTERVAL
    while time.monotonic() < deadline:
        if (project := cluster.project_cr()) is not None:
            seen.append((time.time(), project["status"]))
        time.sleep(0.2)
    assert {p["allocatedGpus"] for _, p in seen} == {1}, seen
    read_at, last = seen[-1]
    assert last["allocatedGpuSeconds"] == pytest.approx(read_at - cluster.started, abs=STATUS_INTERVAL + 2.5), last
