"""The real agent on the fake NVML: a GPU lost before it could be opened, and busy GPUs whose processes are hidden.

- A GPU whose `nvmlDeviceGetHandleByIndex` fails at the agent's start is listed by index under
  its stand-in UUID, unhealthy with the error, on `/v1/snapshot` and `/metrics`; the controller's
  parser and engine count it (a GPU, not a healthy one, not monitored); once NVML opens it again
  the agent picks it up under its real UUID.
- A busy GPU held by one pod, with no process in NVML's running list (another PID namespace,
  `listed=0` in the fake), is `active`, and the agent counts the poll on
  `gpuwm_agent_unattributed_samples_total`; a process the running list leaves out but the
  per-process utilisation names (its host PID) is sent with its pod, found through `--proc-root`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.agent.readings import unopened_uuid
from gpuwm.feed.decode import parse_snapshot
from gpuwm.model import GpuSample
from tests.fakenvml import write_scenario
from tests.fakenvml.podresources_server import FakePod, PodResourcesServer
from tests.integration.agent.helpers import RunningAgent, wait_for

pytestmark = pytest.mark.integration

StartAgent = Callable[..., RunningAgent]
UID_JOB = "77777777-0000-4000-8000-000000000007"
UID_SHARED_A = "88888888-0000-4000-8000-00000000000a"
UID_SHARED_B = "88888888-0000-4000-8000-00000000000b"

LOST_AT_START = """
driver version=580.159.04
gpu uuid=GPU-aaaa util=50
gpu uuid=GPU-bbbb util=70 open_error=15
"""

HIDDEN = """
driver version=580.159.04
gpu uuid=GPU-cccc util=80
gpu uuid=GPU-dddd util=60
gpu uuid=GPU-eeee util=0
proc device=GPU-dddd pid=2001 used_mib=100 sm=60 listed=0
"""


def _metric(agent: RunningAgent, name: str, **labels: str) -> list[float]:
    status, body = agent.get("/metrics")
    assert status == 200
    wanted = set(labels.items())
    return [sample.value for family in text_string_to_metric_families(body.decode()) for sample in family.samples
            if sample.name == name and wanted <= set(sample.labels.items())]


def test_a_gpu_lost_at_start_stays_visible_and_is_picked_up_when_it_returns(
    start_agent: StartAgent, fake_nvml_lib: Path, tmp_path: Path
) -> None:
    scenario = write_scenario(tmp_path / "scenario.txt", LOST_AT_START)
    agent = start_agent(fake_nvml_lib, scenario, "--interval", "0.2", "--proc-root", str(tmp_path / "no-proc"),
                        "--pod-resources-socket", str(tmp_path / "none.sock"))
    stand_in = unopened_uuid("node-1", 1)
    assert stand_in == "GPU-unopened-node-1-1"

    snapshot = agent.snapshot(0)
    devices = {device["index"]: device for device in snapshot["devices"]}
    assert devices[0]["uuid"] == "GPU-aaaa" and devices[0]["healthy"] is True
    lost = devices[1]
    assert (lost["uuid"], lost["healthy"], lost["state"]) == (stand_in, False, "unknown")
    assert "GPU 1 could not be opened" in lost["error"] and "GPU is lost" in lost["error"]
    samples = [GpuSample.model_validate(s) for s in snapshot["samples"] if s["uuid"] == stand_in]
    assert samples and all(not s.healthy and s.sm_percent is None and s.index == 1 for s in samples)
    assert _metric(agent, "gpuwm_gpu_healthy", gpu="1", uuid=stand_in) == [0.0]
    assert _metric(agent, "gpuwm_gpu_healthy", gpu="0", uuid="GPU-aaaa") == [1.0]
    assert "GPU 1 could not be opened" in agent.log()

    # the controller's reading of the feed (columns, as it pulls) and its engine: two GPUs, one healthy,
    # the lost one unmonitored
    status, body = agent.get("/v1/snapshot?since=0&format=columns")
    assert status == 200
    parsed = parse_snapshot(body, "node-1")
    assert parsed.columns is not None
    engine = Engine(EngineConfig(interval_seconds=0.2, idle_threshold_percent=1.0))
    engine.observe_samples(parsed.columns.batch(_identity(len(parsed.columns.t))))
    now = max(parsed.columns.t.tolist())
    cluster = engine.cluster(now)
    assert (cluster.gpus, cluster.healthy_gpus) == (2, 1)
    by_uuid = {gpu.uuid: gpu for gpu in engine.gpus(now)}
    assert (by_uuid[stand_in].healthy, by_uuid[stand_in].monitored, by_uuid[stand_in].index) == (False, False, 1)
    assert by_uuid["GPU-aaaa"].monitored

    # NVML opens it again: the agent finds it under its real UUID (retried with backoff) and drops the stand-in
    write_scenario(scenario, LOST_AT_START.replace(" open_error=15", ""))

    def back() -> dict[str, Any] | None:
        devices = {device["uuid"]: device for device in agent.snapshot(0)["devices"]}
        return devices if "GPU-bbbb" in devices and stand_in not in devices else None

    devices_back = wait_for(back, 30.0, "GPU 1 to be opened again")
    assert devices_back["GPU-bbbb"]["healthy"] is True and devices_back["GPU-bbbb"]["index"] == 1
    assert devices_back["GPU-bbbb"]["state"] == "active"  # 70 %, nobody known to hold it: active, holder unknown
    assert wait_for(lambda: _metric(agent, "gpuwm_gpu_utilization_percent", gpu="1", uuid="GPU-bbbb"),
                    10.0, "GPU 1's figures on /metrics") == [70.0]


def _identity(count: int) -> Any:
    import numpy

    return numpy.arange(count, dtype=numpy.int64)


@pytest.fixture
def kubelet() -> Iterator[str]:
    """The kubelet's stats summary naming the shared GPU's two pods: how the agent knows their UIDs."""
    summary = json.dumps({"pods": [
        {"podRef": {"name": "a", "namespace": "serve", "uid": UID_SHARED_A}},
        {"podRef": {"name": "b", "namespace": "serve", "uid": UID_SHARED_B}},
    ]}).encode()

    class Kubelet(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(summary)))
            self.end_headers()
            self.wfile.write(summary)

    server = HTTPServer(("127.0.0.1", 0), Kubelet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_busy_gpus_with_hidden_processes_read_active_and_are_counted(
    start_agent: StartAgent, fake_nvml_lib: Path, tmp_path: Path, kubelet: str
) -> None:
    scenario = write_scenario(tmp_path / "scenario.txt", HIDDEN)
    proc_root = tmp_path / "host-proc"  # the host's /proc as mounted into an agent without hostPID
    (proc_root / "2001").mkdir(parents=True)
    (proc_root / "2001" / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{UID_SHARED_A.replace('-', '_')}.slice/cri-containerd-{2001:064x}.scope\n")
    server = PodResourcesServer(tmp_path / "pr.sock")
    server.pods = [
        FakePod("ml", "job-0", {"main": [("nvidia.com/gpu", ["GPU-cccc"])]}),
        FakePod("serve", "a", {"main": [("nvidia.com/gpu.shared", ["GPU-dddd::0"])]}),
        FakePod("serve", "b", {"main": [("nvidia.com/gpu.shared", ["GPU-dddd::1"])]}),
        FakePod("ml", "idle-0", {"main": [("nvidia.com/gpu", ["GPU-eeee"])]}),
    ]
    server.allocatable = {"nvidia.com/gpu": ["GPU-cccc", "GPU-eeee"],
                          "nvidia.com/gpu.shared": ["GPU-dddd::0", "GPU-dddd::1"]}
    server.start()
    try:
        token_file = tmp_path / "token"
        token_file.write_text("agent-token")
        agent = start_agent(fake_nvml_lib, scenario, "--interval", "0.2", "--proc-root", str(proc_root),
                            "--pod-resources-socket", str(server.socket_path), "--kubelet-url", kubelet,
                            "--kubelet-token-file", str(token_file))
        wait_for(lambda: _metric(agent, "gpuwm_agent_unattributed_samples_total", uuid="GPU-cccc") >= [2.0],
                 20.0, "unattributed samples of GPU-cccc")
        snapshot = agent.snapshot(0)
        states = {(d["uuid"], d["pod"]): d["state"] for d in snapshot["devices"]}
        # held whole, 80 %, no process listed: active (not allocated-empty), the list sent as NVML gave it
        assert states[("GPU-cccc", "job-0")] == "active"
        latest = {s["uuid"]: s for s in snapshot["samples"]}
        assert latest["GPU-cccc"]["processes"] == []
        # shared: the hidden process comes from the per-process utilisation with its host PID, its pod from
        # --proc-root; pod a's 60 % over its half is active, pod b has no process of its own
        (process,) = latest["GPU-dddd"]["processes"]
        assert (process["pid"], process["pod_uid"], process["sm_percent"], process["memory_used_bytes"]) == (
            2001, UID_SHARED_A, 60.0, None)
        assert states[("GPU-dddd", "a")] == "active"
        assert states[("GPU-dddd", "b")] == "allocated-empty"
        assert states[("GPU-eeee", "idle-0")] == "allocated-empty"  # an empty list on an idle GPU: idle
        assert _metric(agent, "gpuwm_agent_unattributed_samples_total", uuid="GPU-dddd") == [0.0]
        assert _metric(agent, "gpuwm_agent_unattributed_samples_total", uuid="GPU-eeee") == [0.0]
        assert _metric(agent, "gpuwm_agent_unattributed_samples_total", uuid="GPU-cccc", gpu="0", pod="job-0",
                       namespace="ml", container="main")[0] >= 2.0
    finally:
        server.stop()
