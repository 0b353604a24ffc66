"""A fake GPU node for the envtest tier: a Node object in the real API server, and beside it the real
`gpuwm agent` on the fake NVML library with a kubelet pod-resources gRPC server and a fake /proc.

There is no kubelet, scheduler or container runtime: a Job's pod template names the node
(`spec.nodeName`), the Job controller makes the pod, and the test patches the pod's status to Running
through the status subresource, as a kubelet would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.envtest.controlplane import ControlPlane, free_port
from tests.fakenvml import fake_nvml_env, write_scenario
from tests.fakenvml.podresources_server import FakePod, PodResourcesServer
from tests.integration.agent.helpers import RunningAgent, agent_command, wait_for

GPU = "GPU-e0e0"
HEADER = f"driver version=550.54.15\ngpu uuid={GPU} name=NVIDIA_H100_80GB_HBM3 memory_used_mib=2048 power_mw=350000"
PID = 4001


def busy(sm_percent: float = 80.0) -> str:
    """The pod's process computes at `sm_percent` on the GPU."""
    return f"{HEADER} util={sm_percent:g} mem_util=30\nproc device={GPU} pid={PID} used_mib=1500 sm={sm_percent:g}\n"


def idle() -> str:
    """The pod's process holds memory and computes nothing."""
    return f"{HEADER} util=0 mem_util=0\nproc device={GPU} pid={PID} used_mib=1500 sm=0\n"


def busy_without_processes(sm_percent: float = 80.0) -> str:
    """The GPU computes, but NVML lists no process (another PID namespace, hidden MIG processes)."""
    return f"{HEADER} util={sm_percent:g} mem_util=30\n"


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class GpuNode:
    """Node `name` with one fake GPU; `start()` serves pod-resources and runs the agent."""

    def __init__(self, plane: ControlPlane, name: str, directory: Path, nvml_lib: Path) -> None:
        self.plane = plane
        self.name = name
        self.directory = directory
        self.nvml_lib = nvml_lib
        self.scenario = directory / "scenario.txt"
        self.proc_root = directory / "proc"
        self.pod_resources = PodResourcesServer(directory / "pod-resources.sock")
        self.agent: RunningAgent | None = None

    def create(self) -> dict[str, Any]:
        node: dict[str, Any] = self.plane.admin().create("/api/v1/nodes", {
            "metadata": {"name": self.name, "labels": {"nvidia.com/gpu.present": "true"}},
            "status": {"capacity": {"nvidia.com/gpu": "1", "cpu": "8", "memory": "64Gi", "pods": "110"}},
        })
        return node

    def set(self, scenario: str) -> None:
        write_scenario(self.scenario, scenario)

    def hold(self, pod: dict[str, Any], container: str = "main") -> None:
        """The pod holds the GPU (pod-resources) and its process PID runs in the pod's cgroup (/proc)."""
        namespace, name, uid = pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"]
        with self.pod_resources.lock:
            self.pod_resources.pods = [FakePod(namespace, name, {container: [("nvidia.com/gpu", [GPU])]})]
        self.pod_resources.allocatable = {"nvidia.com/gpu": [GPU]}
        (self.proc_root / str(PID)).mkdir(parents=True, exist_ok=True)
        (self.proc_root / str(PID) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{PID:064x}.scope\n")

    def start(self, interval: float = 0.5, port: int | None = None) -> RunningAgent:
        """The agent on `port` (a free one unless named: a controller started before it knows its URL)."""
        self.proc_root.mkdir(parents=True, exist_ok=True)
        if not self.scenario.exists():
            self.set(idle())
        self.pod_resources.start()
        port = port or free_port()
        log_path = self.directory / "agent.log"
        with log_path.open("w") as log_file:
            process = subprocess.Popen(
                # the driver's buffers read every second (not every 5 s): the tier's short status intervals
                # then see every poll by their next cycle
                agent_command("--listen", f"127.0.0.1:{port}", "--node-name", self.name, "--interval", str(interval),
                              "--nvml-buffer-read-seconds", "1", "--proc-root", str(self.proc_root),
                              "--pod-resources-socket", str(self.pod_resources.socket_path)),
                env=fake_nvml_env(self.nvml_lib, self.scenario), stdout=log_file, stderr=subprocess.STDOUT, text=True)
        self.agent = RunningAgent(process, f"http://127.0.0.1:{port}", log_path)
        wait_for(lambda: self.agent is not None and (self.agent.get("/readyz")[0] == 200 or process.poll() is not None),
                 30.0, "agent /readyz")
        assert process.poll() is None, self.agent.log()
        return self.agent

    def agents_flag(self) -> str:
        assert self.agent is not None
        return f"static:{self.name}={self.agent.url}"

    def stop(self) -> None:
        if self.agent is not None and self.agent.process.poll() is None:
            self.agent.process.send_signal(signal.SIGTERM)
            try:
                self.agent.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.agent.process.pid, signal.SIGKILL)
                self.agent.process.wait()
        self.pod_resources.stop()


def create_job(plane: ControlPlane, namespace: str, name: str, node: str, gpus: int = 1) -> dict[str, Any]:
    """A Job whose one pod asks for `gpus` nvidia.com/gpu and is bound to `node` by its template."""
    job: dict[str, Any] = plane.admin().create(f"/apis/batch/v1/namespaces/{namespace}/jobs", {
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "nodeName": node, "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.example/trainer:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        }}},
    })
    return job


def job_pod(plane: ControlPlane, namespace: str, job: str, timeout: float = 30.0) -> dict[str, Any]:
    """The pod the Job controller made for `job`."""
    http = plane.admin()
    deadline = time.monotonic() + timeout
    while True:
        pods = http.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"batch.kubernetes.io/job-name={job}")
        if pods["items"]:
            pod: dict[str, Any] = pods["items"][0]
            return pod
        assert time.monotonic() < deadline, f"the Job controller made no pod for job {namespace}/{job} in {timeout} s"
        time.sleep(0.2)


def run_pod(plane: ControlPlane, pod: dict[str, Any], started: float) -> dict[str, Any]:
    """What the kubelet would write: the pod Running, its container started at `started`."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    container = pod["spec"]["containers"][0]
    patched: dict[str, Any] = plane.admin().merge(f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": {
        "phase": "Running", "startTime": rfc3339(started),
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": container["name"], "ready": True, "restartCount": 0, "image": container["image"],
                               "imageID": "", "started": True,
                               "state": {"running": {"startedAt": rfc3339(started)}}}],
    }})
    return patched
