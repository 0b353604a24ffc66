"""A running `gpuwm agent` on the fake NVML library: /metrics, /v1/snapshot, health, faults."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwm.feed import MergeRequest
from gpuwm.feed.decode import parse_columns
from gpuwm.model import GpuSample
from tests.fakenvml import write_scenario
from tests.fakenvml.podresources_server import PodResourcesServer
from tests.integration.agent.helpers import SCENARIO, UID_TRAIN, RunningAgent, wait_for
from tests.snapshot_rows import AgentSnapshot

pytestmark = pytest.mark.integration

StartAgent = Callable[..., RunningAgent]
Metrics = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _metrics(agent: RunningAgent) -> Metrics:
    status, body = agent.get("/metrics")
    assert status == 200
    values = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            values[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return values


def _find(values: Metrics, name: str, **labels: str) -> list[float]:
    wanted = set(labels.items())
    return [v for (n, ls), v in values.items() if n == name and wanted <= ls]


def test_metrics_and_snapshot_feed(
    start_agent: StartAgent, fake_nvml_lib: Path, scenario: Path, fake_proc: Path, pod_resources: PodResourcesServer
) -> None:
    agent = start_agent(  # buffers read every other poll: the feed below sees new polls within 0.6 s
        fake_nvml_lib, scenario, "--interval", "0.2", "--nvml-buffer-read-seconds", "0.4", "--proc-root", str(fake_proc),
        "--pod-resources-socket", str(pod_resources.socket_path),
    )
    def counting() -> Metrics | None:
        values = _metrics(agent)
        return values if _find(values, "gpuwm_gpu_active_seconds_total", uuid="GPU-1111")[0] > 0 else None

    values = wait_for(counting, what="active seconds to count")
    assert _find(values, "gpuwm_gpu_power_watts", uuid="GPU-1111", node="node-1", gpu="0", pod="train-0",
                 namespace="team-a", container="main", model="NVIDIA H100 80GB HBM3") == [350.0]
    assert _find(values, "gpuwm_gpu_memory_used_bytes", uuid="GPU-1111") == [2048 * 1024**2]
    assert _find(values, "gpuwm_gpu_pcie_rx_bytes_per_second", uuid="GPU-1111") == [1000 * 1024.0]
    (energy,) = _find(values, "gpuwm_gpu_energy_joules_total", uuid="GPU-1111")
    assert energy >= 5000.0
    assert sorted(_find(values, "gpuwm_gpu_allocated", uuid="GPU-3333")) == [0.25, 0.25]
    assert _find(values, "gpuwm_gpu_allocated", uuid="MIG-5555", mig_profile="3g.40gb", pod="mig-job") == [
        pytest.approx(3 / 7)
    ]
    assert _find(values, "gpuwm_gpu_healthy", uuid="GPU-6666") == [0.0]
    assert _find(values, "gpuwm_gpu_healthy", uuid="GPU-1111") == [1.0]
    # a shared GPU names no single pod on its device series
    assert _find(values, "gpuwm_gpu_utilization_percent", uuid="GPU-3333", pod="") == [40.0]
    assert _find(values, "gpuwm_agent_process_resident_memory_bytes")[0] > 0
    assert _find(values, "gpuwm_agent_pod_resources_up") == [1.0]
    label_names = {name for (metric, labels) in values for name, _ in labels if metric.startswith("gpuwm_gpu_")}
    assert label_names == {"node", "gpu", "uuid", "model", "mig_profile", "namespace", "pod", "container"}

    # the feed: everything after `since`, in order, nothing twice
    first = AgentSnapshot.model_validate(agent.snapshot(0))
    assert first.seq > 0 and first.samples
    seqs = [s.seq or 0 for s in first.samples]
    assert seqs == sorted(seqs) and seqs[-1] == first.seq
    time.sleep(0.6)
    second = AgentSnapshot.model_validate(agent.snapshot(first.seq))
    assert second.agent_id == first.agent_id and not second.truncated
    assert second.samples and all((s.seq or 0) > first.seq for s in second.samples)
    assert [s.seq for s in second.samples] == list(range(first.seq + 1, second.seq + 1))
    assert {s.uuid for s in second.samples} >= {"GPU-1111", "MIG-5555"}
    assert all(set(s.model_dump()) == set(GpuSample.model_fields) for s in second.samples)
    status, body = agent.get("/v1/snapshot?since=banana")
    assert status == 400 and b"since" in body

    # merged polls (gpuwm.feed.merge), as the controller asks for them: fewer rows, each device's first and last
    # poll as they were, runs on the steadily busy shared GPU (GPU-1111's polls read 0, 50 or 100 % of the device,
    # and one holder gets the device's figure: those do not merge)
    time.sleep(2.0)  # ten more polls
    answers = []
    for merge in ("", MergeRequest(15.0, 1.0, gap_seconds=0.6).query()):
        status, body = agent.get(f"/v1/snapshot?since={first.seq}&limit=120&format=columns{merge}")
        assert status == 200, body
        columns = parse_columns(json.loads(body))
        answers.append(columns.samples(list(range(len(columns)))))
    every, merged = answers
    assert len(merged) < len(every)
    assert any(sample.merged_seconds for sample in merged if sample.uuid == "GPU-3333")
    for uuid in {sample.uuid for sample in every}:
        polls, sent = [s for s in every if s.uuid == uuid], [s for s in merged if s.uuid == uuid]
        assert (sent[0], sent[-1]) == (polls[0], polls[-1])
        assert sum(1 + round((s.merged_seconds or 0.0) / 0.2) for s in sent) >= len(polls) - 2  # every poll in some run
    status, body = agent.get("/v1/snapshot?since=0&merge_seconds=soon")
    assert status == 400 and b"merge_seconds" in body


def test_a_gpu_lost_while_running_and_pod_resources_gone(
    start_agent: StartAgent, fake_nvml_lib: Path, scenario: Path, fake_proc: Path, pod_resources: PodResourcesServer
) -> None:
    agent = start_agent(
        fake_nvml_lib, scenario, "--interval", "0.2", "--proc-root", str(fake_proc),
        "--pod-resources-socket", str(pod_resources.socket_path),
    )
    write_scenario(scenario, SCENARIO.replace("gpu uuid=GPU-3333 ", "gpu uuid=GPU-3333 error=15 "))

    def lost() -> AgentSnapshot | None:
        snapshot = AgentSnapshot.model_validate(agent.snapshot(0))
        latest = {s.uuid: s for s in snapshot.samples}
        return snapshot if not latest["GPU-3333"].healthy else None

    snapshot = wait_for(lost, what="GPU-3333 to be reported lost")
    latest = {s.uuid: s for s in snapshot.samples}
    assert "GPU is lost" in (latest["GPU-3333"].error or "")
    assert latest["GPU-1111"].healthy and latest["GPU-1111"].sm_percent is not None

    pod_resources.stop()  # the kubelet socket goes away: samples flow on, attributed by cgroups

    def cgroup_only() -> AgentSnapshot | None:
        snapshot = AgentSnapshot.model_validate(agent.snapshot(0))
        train = [d for d in snapshot.devices if d.uuid == "GPU-1111"]
        return snapshot if train and train[0].attributed_by == "cgroup" else None

    before = agent.snapshot(0)["seq"]
    snapshot = wait_for(cgroup_only, what="cgroup attribution")
    (train,) = [d for d in snapshot.devices if d.uuid == "GPU-1111"]
    assert train.pod_uid == UID_TRAIN
    assert snapshot.seq > before
    assert agent.get("/readyz")[0] == 200
    assert "attributing by process cgroups only" in agent.log()
    assert agent.process.poll() is None


def test_no_driver_serves_health_and_fails_readiness(start_agent: StartAgent) -> None:
    agent = start_agent(None, None, "--interval", "0.2", wait_ready=False)
    time.sleep(1.0)  # several poll intervals: it must not crash-loop or log again
    assert agent.process.poll() is None
    status, body = agent.get("/readyz")
    assert status == 503 and b"NVIDIA driver not found" in body
    assert agent.get("/healthz")[0] == 200
    assert agent.get("/metrics")[0] == 200
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(timeout=10) == 0
    log = agent.log()
    assert "Traceback" not in log
    assert sum("NVIDIA driver not found" in line for line in log.splitlines()) == 1


def test_kubelet_stats_reach_snapshot_and_metrics(
    start_agent: StartAgent, fake_nvml_lib: Path, scenario: Path, tmp_path: Path
) -> None:
    token = "agent-sa-token"
    summary = {"pods": [{
        "podRef": {"name": "train-0", "namespace": "team-a", "uid": UID_TRAIN},
        "cpu": {"usageNanoCores": 1_500_000_000}, "memory": {"workingSetBytes": 2 * 1024**3},
        "network": {"rxBytes": 1000, "txBytes": 2000}, "ephemeral-storage": {"usedBytes": 12345},
    }]}

    class Kubelet(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            ok = self.path == "/stats/summary" and self.headers.get("Authorization") == f"Bearer {token}"
            body = json.dumps(summary).encode() if ok else b"{}"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    kubelet = HTTPServer(("127.0.0.1", 0), Kubelet)
    threading.Thread(target=kubelet.serve_forever, daemon=True).start()
    token_file = tmp_path / "token"
    token_file.write_text(token)
    try:
        agent = start_agent(
            fake_nvml_lib, scenario, "--interval", "0.2", "--pod-resources-socket", str(tmp_path / "none.sock"),
            "--kubelet-url", f"http://127.0.0.1:{kubelet.server_address[1]}", "--kubelet-token-file", str(token_file),
        )
        def with_stats() -> AgentSnapshot | None:
            snapshot = AgentSnapshot.model_validate(agent.snapshot(0))
            return snapshot if snapshot.pod_stats else None

        snapshot = wait_for(with_stats, what="pod stats in the snapshot")
        (stats,) = snapshot.pod_stats
        assert (stats.pod_uid, stats.cpu_usage_cores, stats.memory_used_bytes, stats.ephemeral_storage_used_bytes) == (
            UID_TRAIN, 1.5, 2 * 1024**3, 12345,
        )
        assert stats.node == "node-1" and stats.seq is not None and stats.seq <= snapshot.seq
        values = _metrics(agent)
        assert _find(values, "gpuwm_cpu_usage_cores", namespace="team-a", pod="train-0", node="node-1") == [1.5]
        assert _find(values, "gpuwm_ephemeral_storage_used_bytes", pod="train-0") == [12345.0]
        assert token not in agent.log()
    finally:
        kubelet.shutdown()
        kubelet.server_close()
