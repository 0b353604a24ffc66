"""gpuwm on a real NVIDIA GPU: the real agent over the machine's own `libnvidia-ml.so.1`.

Every other tier runs the agent on the fake NVML library (tests/fakenvml); this one checks that
what the fake stands in for holds on a real driver: the figures each call returns, their units,
which calls a real GPU supports, that GPU-seconds reach a GPUWorkloadMetrics as active while a
process computes on the GPU and as idle while it only holds memory, that the driver's per-process
utilisation tells apart two pods time-sharing a GPU, that an agent in its own PID namespace (a
DaemonSet without hostPID) still reads a pod's busy GPU as busy, and that PCIe figures follow real
copies.

Skipped, with the reason, where NVML cannot be initialised (no NVIDIA driver, as in CI); the
end-to-end test also needs PyTorch with CUDA to load the GPU. Run where a GPU exists:

    python -m pytest tests/gpu -q -s       # -s prints the figures read
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwm.agent.nvml import GAUGES_EVERY_SECONDS
from gpuwm.model import GpuSample
from tests.fakenvml.podresources_server import FakePod, PodResourcesServer
from tests.integration.agent.helpers import RunningAgent, free_port, wait_for
from tests.integration.kubeemu import EmulatorThread, KubeHttp, KubernetesEmulator
from tests.integration.test_controller import CRDS, Controller, rfc3339, wait_until

pytestmark = pytest.mark.gpu


def _nvml_gpus() -> list[dict[str, Any]]:
    """The machine's GPUs as NVML lists them (uuid, name, memory total); skips the module without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as error:  # the binding raises NVMLError_LibraryNotFound, or a driver/library mismatch
        pytest.skip(f"no usable NVIDIA driver here (NVML: {error}); this tier needs a GPU node", allow_module_level=True)
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            found.append({
                "index": index, "uuid": pynvml.nvmlDeviceGetUUID(handle),
                "name": name.decode() if isinstance(name, bytes) else name,
                "memory_total_bytes": float(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                "mig": pynvml.nvmlDeviceGetMigMode(handle)[0] if _supports_mig(pynvml, handle) else 0,
            })
        return found
    finally:
        pynvml.nvmlShutdown()


def _supports_mig(pynvml: Any, handle: Any) -> bool:
    try:
        pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:
        return False
    return True


GPUS = _nvml_gpus()
if not GPUS:
    pytest.skip("NVML found no GPU on this machine", allow_module_level=True)
WHOLE = [gpu for gpu in GPUS if not gpu["mig"]]


def _report(title: str, value: Any) -> None:
    """Shown with -s: the figures a person checking a new GPU model wants to read."""
    print(f"\n--- {title}\n{json.dumps(value, indent=1, default=str)}")


def _agent_env() -> dict[str, str]:
    # the real driver's library is found as the machine finds it (LD_LIBRARY_PATH kept); no gpuwm settings leak in
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUWM_")}


#: the agent's buffer reads here: the tests' controller writes status every second and counts a device reporting
#: within its gap (3 polls) plus that second, so a 5 s lag (the default, against 15 s status writes) would read
#: as an agent not reporting; 1 s still splits each read into two polls by the samples' timestamps
BUFFER_READ_SECONDS = "1"


def _start_agent(tmp_path: Path, *arguments: str, wrapper: tuple[str, ...] = ()) -> RunningAgent:
    """The real `gpuwm agent` on this machine's driver, polling every 0.5 s, its log in tmp_path.

    `wrapper`: a command the agent runs under (e.g. `unshare` for its own PID namespace).
    """
    port = free_port()
    log_path = tmp_path / "agent.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "gpuwm.cli", "agent", "--listen", f"127.0.0.1:{port}",
             "--node-name", "gpu-node", "--interval", "0.5", "--nvml-buffer-read-seconds", BUFFER_READ_SECONDS,
             "--log-format", "text", *arguments],
            env=_agent_env(), stdout=log_file, stderr=subprocess.STDOUT, text=True,
        )
    return RunningAgent(process, f"http://127.0.0.1:{port}", log_path)


def _gpu_pod(http: KubeHttp, namespace: str, name: str, resource: str, owners: list[dict[str, Any]] | None = None) -> str:
    """A pod on `gpu-node` whose container `main` asks for one `resource`; its UID."""
    pod = http.create(f"/api/v1/namespaces/{namespace}/pods", {
        "metadata": {"name": name, "ownerReferences": owners or []},
        "spec": {"nodeName": "gpu-node", "containers": [{"name": "main", "resources": {"limits": {resource: "1"}}}]},
    })
    return str(pod["metadata"]["uid"])


def _run_pod(http: KubeHttp, namespace: str, name: str, started: float) -> None:
    http.ok("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": {
        "phase": "Running", "startTime": rfc3339(started),
        "containerStatuses": [{"name": "main", "state": {"running": {"startedAt": rfc3339(started)}}}],
    }}, "application/merge-patch+json")


def _in_pod(proc_root: Path, pid: int, pod_uid: str) -> None:
    """`pid` in the kubelet's cgroup layout under `proc_root`, as the node's /proc shows a pod's process."""
    (proc_root / str(pid)).mkdir(parents=True)
    (proc_root / str(pid) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{pod_uid.replace('-', '_')}.slice/cri-containerd-{pid:064x}.scope\n")


def _agent_on_pods(tmp_path: Path, proc_root: Path, pods: list[FakePod], allocatable: dict[str, list[str]],
                   wrapper: tuple[str, ...] = ()) -> tuple[PodResourcesServer, RunningAgent]:
    """A pod-resources server (kubelet's gRPC) listing `pods`, and the real agent reading it and `proc_root`."""
    pod_resources = PodResourcesServer(tmp_path / "pr.sock")
    pod_resources.pods = pods
    pod_resources.allocatable = allocatable
    pod_resources.start()
    agent = _start_agent(tmp_path, "--proc-root", str(proc_root), "--pod-resources-socket", str(pod_resources.socket_path),
                         wrapper=wrapper)
    return pod_resources, agent


def _wait_ready(agent: RunningAgent) -> None:
    wait_for(lambda: agent.get("/readyz")[0] == 200 or agent.process.poll() is not None, 60.0, "agent /readyz")
    assert agent.process.poll() is None, agent.log()


def _controller(emulator: EmulatorThread, agent: RunningAgent, tmp_path: Path) -> Controller:
    """The real controller (not started) on the emulator, pulling `agent` every 0.5 s, status every 1 s."""
    return Controller(emulator.write_kubeconfig(tmp_path / "kubeconfig"), f"static:gpu-node={agent.url}",
                      tmp_path / "gpuwm.db", tmp_path / "controller.log", status_interval=1.0, interval=0.5)


def test_agent_once_reads_every_gpu_as_nvml_lists_it() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuwm.cli", "agent", "--once", "--node-name", "gpu-node", "--interval", "1"],
        env=_agent_env(), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(result.stdout)
    _report("gpuwm agent --once", snapshot)
    samples = {s["uuid"]: GpuSample.model_validate(s) for s in snapshot["samples"]}
    assert {gpu["uuid"] for gpu in GPUS} <= set(samples)
    for gpu in GPUS:
        sample = samples[gpu["uuid"]]
        assert sample.healthy, sample.error
        assert (sample.model, sample.index, sample.node) == (gpu["name"], gpu["index"], "gpu-node")
        assert sample.memory_total_bytes == gpu["memory_total_bytes"]
        assert sample.memory_used_bytes is not None and 0 <= sample.memory_used_bytes <= gpu["memory_total_bytes"]
        if gpu["mig"]:
            continue  # a MIG parent's utilisation is not reported; its instances are checked below
        # a data-centre GPU reports all of these; a None here is a call the agent got wrong, not a missing figure
        assert sample.sm_percent is not None and 0.0 <= sample.sm_percent <= 100.0
        assert sample.memory_activity_percent is not None and 0.0 <= sample.memory_activity_percent <= 100.0
        assert sample.power_watts is not None and 5.0 < sample.power_watts < 2000.0  # W, not mW
        assert sample.power_limit_watts is not None and sample.power_watts <= sample.power_limit_watts * 1.5
        assert sample.energy_joules is not None and sample.energy_joules > 0.0  # J since the driver loaded
        assert sample.temperature_celsius is not None and 5.0 < sample.temperature_celsius < 110.0
        assert sample.sm_clock_mhz is not None and 0.0 < sample.sm_clock_mhz < 5000.0
        assert sample.memory_clock_mhz is not None and 0.0 < sample.memory_clock_mhz < 20000.0
        assert sample.pcie_rx_bytes_per_second is not None and sample.pcie_rx_bytes_per_second >= 0.0
        assert sample.processes is not None  # the compute-process list is readable (an empty list on an idle GPU)
    for sample in samples.values():
        if sample.parent_uuid is not None:  # a MIG instance: its profile and share of its parent
            assert sample.mig_profile is not None and 0.0 < sample.device_units < 1.0


#: a process that computes on GPU 0 until `stop` exists, then holds its memory without computing
LOADER = """
import pathlib, sys, time
import torch
stop = pathlib.Path(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
(a @ b).sum().item()
print("busy", time.time(), flush=True)
while not stop.exists():
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
print("idle", time.time(), flush=True)
time.sleep(3600)
"""


def _compute_then_stop(log_path: Path, stop: Path, seconds: float) -> tuple[float, float]:
    """Once the loader writing `log_path` computes, `seconds` of it, then `stop`: its (busy, idle) marks (wall time)."""

    def marks() -> dict[str, float]:
        words = log_path.read_text().split()
        return {words[i]: float(words[i + 1]) for i in range(len(words) - 1) if words[i] in ("busy", "idle")}

    busy_from = wait_for(lambda: marks().get("busy"), 120.0, "the loader's first product")
    time.sleep(seconds)
    stop.touch()
    return busy_from, wait_for(lambda: marks().get("idle"), 30.0, "the loader to stop computing")


@pytest.fixture
def loader_command(tmp_path: Path) -> list[str]:
    probe = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"PyTorch with CUDA is needed to load the GPU: {probe.stderr.strip().splitlines()[-1:]}")
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    return [sys.executable, str(script)]


@pytest.fixture
def emulator() -> Iterator[EmulatorThread]:
    with EmulatorThread(KubernetesEmulator(CRDS)) as thread:
        yield thread


BUSY_SECONDS = 20.0
IDLE_SECONDS = 15.0


@pytest.mark.skipif(not WHOLE, reason="every GPU here is in MIG mode; this test loads a whole GPU")
def test_busy_then_idle_reaches_the_workload_cr(
    emulator: EmulatorThread, loader_command: list[str], tmp_path: Path
) -> None:
    """A Job's pod holds GPU 0 (kubelet pod-resources over gRPC); its process computes, then idles."""
    gpu = WHOLE[0]
    http = KubeHttp(emulator.url)
    http.create("/api/v1/namespaces", {"metadata": {"name": "gpu-check"}})
    job = http.create("/apis/batch/v1/namespaces/gpu-check/jobs", {"metadata": {"name": "load"}, "spec": {}})
    owner = [{"apiVersion": "batch/v1", "kind": "Job", "name": "load", "uid": job["metadata"]["uid"], "controller": True}]
    pod_uid = _gpu_pod(http, "gpu-check", "load-0", "nvidia.com/gpu", owner)

    stop = tmp_path / "stop"
    loader_log = (tmp_path / "loader.log").open("w")
    loader = subprocess.Popen([*loader_command, str(stop)], stdout=loader_log, stderr=subprocess.STDOUT, text=True)
    proc_root = tmp_path / "proc"
    _in_pod(proc_root, loader.pid, pod_uid)
    pod_resources, agent = _agent_on_pods(
        tmp_path, proc_root, [FakePod("gpu-check", "load-0", {"main": [("nvidia.com/gpu", [gpu["uuid"]])]})],
        {"nvidia.com/gpu": [g["uuid"] for g in WHOLE]})
    controller = _controller(emulator, agent, tmp_path)
    try:
        _wait_ready(agent)
        running_since = time.time()
        _run_pod(http, "gpu-check", "load-0", running_since)
        controller.start()

        busy_from, idle_from = _compute_then_stop(tmp_path / "loader.log", stop, BUSY_SECONDS)
        time.sleep(IDLE_SECONDS)
        busy_seconds = idle_from - busy_from

        def cr() -> Any:
            status, body = http.request("GET", "/apis/gpuwm.io/v1alpha1/namespaces/gpu-check/gpuworkloadmetrics/load")
            return body if status == 200 and body.get("status", {}).get("allocatedGpuSeconds") else None

        # a status written after the idle phase began (idle GPU-seconds reach it); a CR that never shows it fails here
        written = wait_until(
            "idle GPU-seconds in the CR", lambda: (c := cr()) and c["status"]["idleGpuSeconds"] >= IDLE_SECONDS - 3.0 and c,
            timeout=30.0, log=controller.log)
        status = written["status"]
        _report("GPUWorkloadMetrics gpu-check/load status", status)
        _report("measured", {"busy_seconds": busy_seconds, "idle_seconds_so_far": time.time() - idle_from,
                             "held_seconds": time.time() - running_since})
        _report("agent /v1/snapshot, newest sample", agent.snapshot()["samples"][-1])
        own = [line for line in agent.get("/metrics")[1].decode().splitlines()
               if not line.startswith("#") and ("poll_seconds" in line or "process_cpu_seconds" in line
                                                 or "resident_memory" in line)]
        _report("agent's own figures (/metrics) after the run, at 2 polls/s", own)

        assert written["spec"]["workloadRef"]["kind"] == "Job" and status["allocatedGpus"] == 1
        assert status["gpuModel"] == gpu["name"]
        assert [(g["uuid"], g["pod"]) for g in status["gpus"]] == [(gpu["uuid"], "load-0")]
        split = status["activeGpuSeconds"] + status["idleGpuSeconds"] + status["unmonitoredGpuSeconds"]
        assert split == pytest.approx(status["allocatedGpuSeconds"], abs=0.01)
        # active while it computed (± a poll at each edge and the status interval), idle once it only held memory
        assert status["activeGpuSeconds"] == pytest.approx(busy_seconds, abs=3.0)
        assert status["unmonitoredGpuSeconds"] < 3.0  # before the controller's first pull: nothing of the run
        assert status["utilization"]["current"] < 5.0
        (device,) = status["gpus"]
        assert device["memoryUsedBytes"] >= 2 * 8192 * 8192 * 2  # the loader's two bf16 matrices, still held
        assert 5.0 < device["powerWatts"] < 2000.0
        # energy: joules over the held time, between an idle GPU's draw and a busy one's
        assert 10.0 * status["allocatedGpuSeconds"] < status["energyJoules"] < 2000.0 * status["allocatedGpuSeconds"]
        idle = next(c for c in status["conditions"] if c["type"] == "Idle")
        assert idle["status"] == "True"  # idle longer than --idle-condition-after (3 s)
    finally:
        controller.stop()
        agent.process.terminate()
        agent.process.wait(timeout=15)
        loader.kill()
        loader.wait(timeout=15)
        loader_log.close()
        pod_resources.stop()


@pytest.mark.skipif(not WHOLE, reason="every GPU here is in MIG mode; this test time-slices a whole GPU")
def test_a_time_sliced_gpu_splits_by_each_pods_processes(
    emulator: EmulatorThread, loader_command: list[str], tmp_path: Path
) -> None:
    """Two pods hold one time-sliced replica each of GPU 0 (device plugin IDs `UUID::0`, `UUID::1`); one computes,
    the other only holds memory. The driver's per-process utilisation must make the first active, the second idle."""
    gpu = WHOLE[0]
    http = KubeHttp(emulator.url)
    http.create("/api/v1/namespaces", {"metadata": {"name": "gpu-share"}})
    uids = {name: _gpu_pod(http, "gpu-share", name, "nvidia.com/gpu.shared") for name in ("busy", "quiet")}

    stops = {name: tmp_path / f"stop-{name}" for name in uids}
    stops["quiet"].touch()  # one product at its start, then it only holds its memory
    loaders, proc_root = {}, tmp_path / "proc"
    for name in uids:
        log_file = (tmp_path / f"{name}.log").open("w")
        loaders[name] = subprocess.Popen([*loader_command, str(stops[name])], stdout=log_file, stderr=subprocess.STDOUT)
        log_file.close()
        _in_pod(proc_root, loaders[name].pid, uids[name])
    pod_resources, agent = _agent_on_pods(
        tmp_path, proc_root,
        [FakePod("gpu-share", name, {"main": [("nvidia.com/gpu.shared", [f"{gpu['uuid']}::{replica}"])]})
         for replica, name in enumerate(uids)],
        {"nvidia.com/gpu.shared": [f"{gpu['uuid']}::{replica}" for replica in range(2)]})
    controller = _controller(emulator, agent, tmp_path)
    try:
        _wait_ready(agent)
        def started(name: str) -> bool:
            return "busy" in (tmp_path / f"{name}.log").read_text()

        for name in uids:
            wait_for(functools.partial(started, name), 120.0, f"{name}'s first product")
        running_since = time.time()
        for name in uids:
            _run_pod(http, "gpu-share", name, running_since)
        controller.start()

        def cr(name: str) -> Any:
            status, body = http.request("GET", f"/apis/gpuwm.io/v1alpha1/namespaces/gpu-share/gpuworkloadmetrics/{name}")
            return body["status"] if status == 200 and body.get("status", {}).get("allocatedGpuSeconds", 0) > 8.0 else None

        busy, quiet = (wait_until(f"{name}'s CR with 8 GPU-s", functools.partial(cr, name), timeout=90.0,
                                  log=controller.log) for name in ("busy", "quiet"))
        _report("time-sliced GPU 0: the computing pod, the idle pod", {"busy": busy, "quiet": quiet})
        for status in (busy, quiet):
            assert status["allocatedGpus"] == 0.5  # one of two replicas
            assert [g["uuid"] for g in status["gpus"]] == [gpu["uuid"]]
        # the GPU computed throughout: only the driver's per-process figures tell the two pods apart
        assert busy["activeGpuSeconds"] >= 0.8 * (busy["allocatedGpuSeconds"] - busy["unmonitoredGpuSeconds"])
        assert quiet["activeGpuSeconds"] <= 0.2 * quiet["allocatedGpuSeconds"]
        assert busy["utilization"]["avg1m"] > 50.0 > quiet["utilization"]["avg1m"]
    finally:
        controller.stop()
        agent.process.terminate()
        agent.process.wait(timeout=15)
        for loader in loaders.values():
            loader.kill()
            loader.wait(timeout=15)
        pod_resources.stop()


def _own_pid_namespace() -> tuple[str, ...]:
    """`unshare` giving the agent its own PID namespace and /proc, as a DaemonSet without hostPID runs; skips where
    the machine does not allow it (no util-linux, or no right to create namespaces)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("util-linux's unshare is needed to run the agent in its own PID namespace")
    wrapper: tuple[str, ...] = (unshare, "--pid", "--fork", "--mount-proc", "--kill-child")
    if os.geteuid() != 0:  # an unprivileged user may still create a user namespace that owns the others
        wrapper = (unshare, "--user", "--map-root-user", *wrapper[1:])
    probe = subprocess.run([*wrapper, "sh", "-c", "echo $$"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0 or probe.stdout.strip() != "1":
        pytest.skip(f"cannot create a PID namespace here: {probe.stderr.strip() or probe.stdout.strip()}")
    return wrapper


NAMESPACED_BUSY_SECONDS = 15.0


@pytest.mark.skipif(not WHOLE, reason="every GPU here is in MIG mode; this test loads a whole GPU")
def test_an_agent_in_its_own_pid_namespace_reads_a_busy_pod_as_busy(
    emulator: EmulatorThread, loader_command: list[str], tmp_path: Path
) -> None:
    """The agent in its own PID namespace (`unshare --pid --fork --mount-proc`), the load outside it. NVML's running
    list may leave the load out (another namespace), but its per-process utilisation names the host PID, which the
    host's /proc (here a stand-in holding the pod's cgroup, `--proc-root`) maps to the pod; and with one holder the
    GPU's activity is the pod's whatever the list says (DESIGN §3). The workload must read busy."""
    wrapper = _own_pid_namespace()
    gpu = WHOLE[0]
    http = KubeHttp(emulator.url)
    http.create("/api/v1/namespaces", {"metadata": {"name": "gpu-pidns"}})
    job = http.create("/apis/batch/v1/namespaces/gpu-pidns/jobs", {"metadata": {"name": "load"}, "spec": {}})
    owner = [{"apiVersion": "batch/v1", "kind": "Job", "name": "load", "uid": job["metadata"]["uid"], "controller": True}]
    pod_uid = _gpu_pod(http, "gpu-pidns", "load-0", "nvidia.com/gpu", owner)

    loader_log = (tmp_path / "loader.log").open("w")
    loader = subprocess.Popen([*loader_command, str(tmp_path / "never")], stdout=loader_log, stderr=subprocess.STDOUT)
    loader_log.close()
    proc_root = tmp_path / "host-proc"
    _in_pod(proc_root, loader.pid, pod_uid)
    pod_resources, agent = _agent_on_pods(
        tmp_path, proc_root, [FakePod("gpu-pidns", "load-0", {"main": [("nvidia.com/gpu", [gpu["uuid"]])]})],
        {"nvidia.com/gpu": [g["uuid"] for g in WHOLE]}, wrapper=wrapper)
    controller = _controller(emulator, agent, tmp_path)
    try:
        _wait_ready(agent)
        wait_for(lambda: "busy" in (tmp_path / "loader.log").read_text(), 120.0, "the loader's first product")
        running_since = time.time()
        _run_pod(http, "gpu-pidns", "load-0", running_since)
        controller.start()
        time.sleep(NAMESPACED_BUSY_SECONDS)

        samples = [s for s in agent.snapshot()["samples"] if s["uuid"] == gpu["uuid"]]
        seen = [p for s in samples for p in s["processes"] or []]
        device = next(d for d in agent.snapshot()["devices"] if d["uuid"] == gpu["uuid"])
        unattributed = [line for line in agent.get("/metrics")[1].decode().splitlines()
                        if line.startswith("gpuwm_agent_unattributed_samples_total") and gpu["uuid"] in line]
        _report("agent in its own PID namespace: the load's processes as sent, the device, fallbacks", {
            "loader_host_pid": loader.pid, "processes_seen": seen[-3:], "device": device,
            "unattributed": unattributed})

        def cr() -> Any:
            status, body = http.request("GET", "/apis/gpuwm.io/v1alpha1/namespaces/gpu-pidns/gpuworkloadmetrics/load")
            return body["status"] if status == 200 and body.get("status", {}).get("allocatedGpuSeconds", 0) > 8.0 else None

        status = wait_until("the load's CR with 8 GPU-s", cr, timeout=60.0, log=controller.log)
        _report("GPUWorkloadMetrics gpu-pidns/load status", status)
        assert device["pod"] == "load-0" and device["state"] == "active"
        # the load reached the agent under its host PID (from the per-process utilisation where the running list
        # hides it: then without a memory figure), and the host's /proc gave its pod
        assert any(p["pid"] == loader.pid for p in seen)
        assert all(p["pod_uid"] == pod_uid for p in seen if p["pid"] == loader.pid)
        monitored = status["allocatedGpuSeconds"] - status["unmonitoredGpuSeconds"]
        assert status["activeGpuSeconds"] >= 0.8 * monitored > 0.0
        assert status["idleGpuSeconds"] <= 0.2 * monitored
        assert status["utilization"]["avg1m"] > 50.0
    finally:
        controller.stop()
        agent.process.kill()  # unshare passes no SIGTERM on; killed, it takes the agent with it (--kill-child)
        agent.process.wait(timeout=15)
        loader.kill()
        loader.wait(timeout=15)
        pod_resources.stop()


#: the seconds of rest before the load, of load, and of rest after it, in the comparison with nvidia-smi
SMI_REST_SECONDS, SMI_BUSY_SECONDS, SMI_AFTER_SECONDS = 8.0, 15.0, 12.0


def _smi_log(index: int) -> tuple[subprocess.Popen[str], list[tuple[float, float | None, float | None]]]:
    """nvidia-smi's own log of GPU `index` every 0.5 s: (arrival time, utilization.gpu %, power.draw W) per line."""
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=utilization.gpu,power.draw", "--format=csv,noheader,nounits", "-i", str(index),
         "-lms", "500"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    rows: list[tuple[float, float | None, float | None]] = []

    def number(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:  # "[N/A]"
            return None

    def read() -> None:
        assert smi.stdout is not None
        for line in smi.stdout:
            fields = [field.strip() for field in line.split(",")]
            if len(fields) == 2:
                rows.append((time.time(), number(fields[0]), number(fields[1])))

    threading.Thread(target=read, daemon=True).start()
    return smi, rows


@pytest.mark.skipif(not WHOLE, reason="every GPU here is in MIG mode; this test loads a whole GPU")
def test_the_agent_at_its_defaults_against_nvidia_smi_at_rest_and_under_load(
    loader_command: list[str], tmp_path: Path
) -> None:
    """The agent at its defaults (1 s polls, the utilisation buffer read every 5 s, the energy counter once a minute
    and on a change of processes, carried forward by power between) beside nvidia-smi's own log of the same GPU,
    at rest, while a process computes, and at rest again: the busy seconds each sees, power, and the energy the agent
    hands over against the driver's counter read here."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is needed to compare the agent with the driver's own tool")
    import pynvml

    gpu = WHOLE[0]
    port = free_port()
    with (tmp_path / "agent.log").open("w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuwm.cli", "agent", "--listen", f"127.0.0.1:{port}", "--node-name", "gpu-node",
             "--pod-resources-socket", str(tmp_path / "none.sock"), "--proc-root", str(tmp_path / "proc"),
             "--log-format", "text"], env=_agent_env(), stdout=log_file, stderr=subprocess.STDOUT, text=True)
    agent = RunningAgent(process, f"http://127.0.0.1:{port}", tmp_path / "agent.log")
    smi, smi_rows = _smi_log(gpu["index"])
    stop = tmp_path / "stop"
    loader = None
    try:
        _wait_ready(agent)
        time.sleep(SMI_REST_SECONDS)
        loader_log = (tmp_path / "loader.log").open("w")
        loader = subprocess.Popen([*loader_command, str(stop)], stdout=loader_log, stderr=subprocess.STDOUT, text=True)
        loader_log.close()

        busy_from, idle_from = _compute_then_stop(tmp_path / "loader.log", stop, SMI_BUSY_SECONDS)
        time.sleep(SMI_AFTER_SECONDS + 6.0)  # and the agent's next buffer read (every 5 s) hands the last polls over
        pynvml.nvmlInit()
        try:
            counter_at, counter_joules = time.time(), pynvml.nvmlDeviceGetTotalEnergyConsumption(
                pynvml.nvmlDeviceGetHandleByIndex(gpu["index"])) / 1000.0
        finally:
            pynvml.nvmlShutdown()
        samples = [s for s in agent.snapshot()["samples"] if s["uuid"] == gpu["uuid"]]
    finally:
        smi.kill()
        smi.wait(timeout=15)
        if loader is not None:
            loader.kill()
            loader.wait(timeout=15)
        agent.process.terminate()
        agent.process.wait(timeout=15)

    busy_seconds = idle_from - busy_from
    window = [s for s in samples if s["t"] > busy_from - SMI_REST_SECONDS]
    agent_active = sum(later["t"] - earlier["t"] for earlier, later in itertools.pairwise(window)
                       if (later["sm_percent"] or 0.0) >= 1.0)
    smi_window = [row for row in smi_rows if busy_from - SMI_REST_SECONDS < row[0] <= window[-1]["t"]]
    smi_active = sum(later[0] - earlier[0] for earlier, later in itertools.pairwise(smi_window)
                     if (later[1] or 0.0) >= 1.0)
    rest = [s for s in window if s["t"] < busy_from - 1.0 or s["t"] > idle_from + 2.0]
    during = [s for s in window if busy_from + 1.0 < s["t"] < idle_from - 1.0]
    smi_during = [row[2] for row in smi_window if busy_from + 1.0 < row[0] < idle_from - 1.0 and row[2] is not None]
    first, last = window[0], window[-1]
    smi_power = [(row[0], row[2]) for row in smi_rows if first["t"] <= row[0] <= last["t"] and row[2] is not None]
    smi_joules = sum((later[0] - earlier[0]) * (earlier[1] + later[1]) / 2
                     for earlier, later in itertools.pairwise(smi_power))
    agent_joules = last["energy_joules"] - first["energy_joules"]
    # the counter read here, brought back to the agent's last poll by the power then
    counter_at_last = counter_joules - (last["power_watts"] or 0.0) * (counter_at - last["t"])
    _report("the agent at its defaults against nvidia-smi", {
        "loader_busy_seconds": busy_seconds, "agent_active_seconds": agent_active, "smi_active_seconds": smi_active,
        "agent_sm_percent_at_rest_max": max((s["sm_percent"] or 0.0) for s in rest),
        "agent_sm_percent_under_load_min": min((s["sm_percent"] or 0.0) for s in during),
        "agent_power_under_load_median_w": statistics.median(s["power_watts"] for s in during),
        "smi_power_under_load_median_w": statistics.median(smi_during),
        "agent_joules": agent_joules, "smi_power_integral_joules": smi_joules,
        "agent_last_joules": last["energy_joules"], "counter_at_agent_last_poll_joules": counter_at_last,
        "agent_samples": len(window), "smi_rows": len(smi_window),
    })
    joules = [s["energy_joules"] for s in window]
    assert all(later >= earlier for earlier, later in itertools.pairwise(joules))  # never back
    assert agent_active == pytest.approx(busy_seconds, abs=2.0)
    assert agent_active == pytest.approx(smi_active, abs=2.5)
    assert all((s["sm_percent"] or 0.0) < 1.0 for s in rest)
    assert all((s["sm_percent"] or 0.0) >= 50.0 for s in during)  # a busy GPU never reads idle
    assert statistics.median(s["power_watts"] for s in during) == pytest.approx(statistics.median(smi_during), rel=0.2)
    assert agent_joules == pytest.approx(smi_joules, rel=0.1)
    assert last["energy_joules"] == pytest.approx(counter_at_last, abs=0.03 * agent_joules + 100.0)


#: copies 1 GiB from pinned host memory to GPU 0 for argv[1] seconds, between a second of quiet on each side
COPIER = """
import sys, time
import torch
host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
device = torch.empty_like(host, device="cuda")
device.copy_(host, non_blocking=True)
torch.cuda.synchronize()
time.sleep(1.0)
copies, started = 0, time.time()
while time.time() - started < float(sys.argv[1]):
    device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    copies += 1
ended = time.time()
time.sleep(1.0)
print(started, ended, copies * host.numel(), flush=True)
"""


@pytest.mark.skipif(not WHOLE, reason="every GPU here is in MIG mode; PCIe is read for whole GPUs")
def test_host_to_gpu_copies_show_as_pcie_receive_throughput(loader_command: list[str], tmp_path: Path) -> None:
    """While the GPU copies from host memory, the agent's PCIe receive figure is about the copy rate."""
    gpu = WHOLE[0]
    agent = _start_agent(tmp_path, "--pod-resources-socket", str(tmp_path / "none.sock"))
    try:
        wait_for(lambda: agent.get("/healthz")[0] == 200 or agent.process.poll() is not None, 60.0, "agent /healthz")
        script = tmp_path / "copier.py"
        script.write_text(COPIER)
        copy_seconds = 3 * GAUGES_EVERY_SECONDS
        copied = subprocess.run([loader_command[0], str(script), str(copy_seconds)], capture_output=True, text=True,
                                timeout=180)
        assert copied.returncode == 0, copied.stderr
        started, ended, copied_bytes = (float(x) for x in copied.stdout.split())
        copy_rate = copied_bytes / (ended - started)
        samples = [s for s in agent.snapshot()["samples"] if s["uuid"] == gpu["uuid"]]
        # a sample this long after the copies began holds a reading taken during them (one a period at most)
        during = [s for s in samples if started + GAUGES_EVERY_SECONDS + 0.6 <= s["t"] <= ended]
        quiet = [s for s in samples if s["t"] < started - GAUGES_EVERY_SECONDS]
        _report("PCIe during the copies", {
            "copy_bytes_per_second": copy_rate,
            "agent_receive_bytes_per_second": sorted({s["pcie_rx_bytes_per_second"] for s in during}),
            "agent_transmit_bytes_per_second": sorted({s["pcie_tx_bytes_per_second"] for s in during}),
            "agent_receive_before": sorted({s["pcie_rx_bytes_per_second"] for s in quiet}),
        })
        assert during
        for sample in during:  # the data reaches the GPU as read completions: receive bytes, plus packet overhead
            assert 0.5 * copy_rate <= sample["pcie_rx_bytes_per_second"] <= 1.5 * copy_rate
            assert sample["pcie_tx_bytes_per_second"] < sample["pcie_rx_bytes_per_second"]
    finally:
        agent.process.terminate()
        agent.process.wait(timeout=15)
