"""Real Prometheus (the Debian `prometheus` package) scrapes a running agent; PromQL sees the figures.

It also scrapes a real `gpuwm api` (its /metrics maps pods to workloads), so the Prometheus
store backend and the HTTP API on it answer workload and node queries from what was scraped.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwm.store import RangeQuery
from gpuwm.store.embedded import EmbeddedStore
from gpuwm.store.prometheus import PrometheusStore
from tests.fakenvml.podresources_server import PodResourcesServer
from tests.integration.agent.helpers import RunningAgent, free_port, http_get, wait_for
from tests.unit.store.store_data import cluster, project, workload

pytestmark = pytest.mark.integration

PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)


def _query(base: str, promql: str) -> list[tuple[dict[str, str], float]]:
    status, body = http_get(f"{base}/api/v1/query?query={urllib.parse.quote(promql)}")
    if status != 200:
        return []
    payload = json.loads(body)
    return [(r["metric"], float(r["value"][1])) for r in payload["data"]["result"]]


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus binary not found (apt-get install prometheus)")
def test_prometheus_scrapes_the_agent(
    start_agent: Callable[..., RunningAgent], fake_nvml_lib: Path, scenario: Path, fake_proc: Path,
    pod_resources: PodResourcesServer, tmp_path: Path,
) -> None:
    agent = start_agent(
        fake_nvml_lib, scenario, "--interval", "0.5", "--proc-root", str(fake_proc),
        "--pod-resources-socket", str(pod_resources.socket_path),
    )
    target = agent.url.removeprefix("http://")
    api_port = free_port()
    api = _start_api(tmp_path, api_port)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: gpuwm-agent\n    static_configs:\n      - targets: ['{target}']\n"
        f"  - job_name: gpuwm-controller\n    static_configs:\n      - targets: ['127.0.0.1:{api_port}']\n"
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    assert PROMETHEUS is not None
    with (tmp_path / "prometheus.log").open("w") as log:
        prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        power = wait_for(
            lambda: _query(base, 'gpuwm_gpu_power_watts{uuid="GPU-1111"}'), timeout_seconds=60,
            what="Prometheus to scrape the agent",
        )
        ((labels, value),) = power
        assert value == 350.0
        assert (labels["namespace"], labels["pod"], labels["container"], labels["node"]) == (
            "team-a", "train-0", "main", "node-1",
        )
        ((_, shared),) = _query(base, 'sum(gpuwm_gpu_allocated{uuid="GPU-3333"})')
        assert shared == 0.5
        ((_, by_namespace),) = _query(base, 'sum by (namespace) (gpuwm_gpu_allocated{namespace="team-c"})')
        assert by_namespace == pytest.approx(3 / 7)
        assert [v for _, v in _query(base, 'gpuwm_gpu_healthy{uuid="GPU-6666"}')] == [0.0]
        # the energy counter grows at the power draw, 350 W (deriv: a regression, not rate's range extrapolation).
        # The agent reads the counter every nvmlBufferReadSeconds (5 s) and spreads it over the polls since, so
        # /metrics moves in steps of 5 s: the regression spans several steps (a few would bias it)
        wait_for(
            lambda: _query(base, 'count_over_time(gpuwm_gpu_energy_joules_total{uuid="GPU-1111"}[60s]) >= 40'),
            timeout_seconds=90, what="forty scrapes of the energy counter",
        )
        ((_, watts),) = _query(base, 'deriv(gpuwm_gpu_energy_joules_total{uuid="GPU-1111"}[60s])')
        assert watts == pytest.approx(350.0, rel=0.2)
        _check_prometheus_store(base)
    finally:
        api.terminate()
        api.wait(timeout=20)
        prometheus.send_signal(signal.SIGTERM)
        try:
            prometheus.wait(timeout=20)
        except subprocess.TimeoutExpired:
            prometheus.kill()
            prometheus.wait()


def _start_api(tmp_path: Path, port: int) -> subprocess.Popen[bytes]:
    """`gpuwm api` over an embedded store that knows team-a/train (pod train-0 holds GPU-1111 on node-1)."""
    store = EmbeddedStore(tmp_path / "gpuwm.db")
    train = workload("train", [("GPU-1111", 1.0, 50.0)], namespace="team-a", node="node-1", project="alpha")
    store.record(time.time(), [], [train], [project("alpha", [train])], cluster(1))
    store.close()
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuwm.cli", "api", "--store", str(tmp_path / "gpuwm.db"),
         "--api-listen", f"127.0.0.1:{port}", "--auth", "none", "--api-tls=false"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "api.log").open("w"),
    )
    wait_for(lambda: http_get(f"http://127.0.0.1:{port}/metrics")[0] == 200 or None, timeout_seconds=60,
             what="gpuwm api to serve /metrics")
    return process


def _check_prometheus_store(base: str) -> None:
    """The store backend's PromQL over the scraped series: the workload through the pod-info join, and the node."""
    wait_for(lambda: _query(base, 'gpuwm_workload_pod_info{workload_uid="uid-train"}'), timeout_seconds=30,
             what="Prometheus to scrape gpuwm api's pod-info series")
    time.sleep(2)  # a few scrapes of both targets together
    backend = PrometheusStore(base, timeout_seconds=30)
    end = float(int(time.time()))
    query = RangeQuery("workload", "uid-train", ("gpu_power_watts", "gpu_memory_used_bytes"), end - 4, end, 1.0)
    power, memory = backend.query_range(query)
    values = [value for _, value in power.points if value is not None]
    assert values and all(value == 350.0 for value in values), power.points  # GPU-1111 alone: 350 W
    assert {value for _, value in memory.points if value is not None} == {2048 * 2**20}
    node = backend.query_range(RangeQuery("node", "node-1", ("gpu_power_watts",), end - 4, end, 1.0))[0]
    node_values = [value for _, value in node.points if value is not None]
    assert node_values and all(value > 350.0 for value in node_values)  # every GPU of node-1, not train's alone
    other = backend.query_range(RangeQuery("workload", "uid-nobody", ("gpu_power_watts",), end - 4, end, 1.0))
    assert all(value is None for series in other for _, value in series.points)
    # `gpuwm api` alone on the Prometheus store: the workload found by name, its metrics through HTTP
    port = free_port()
    api = subprocess.Popen([sys.executable, "-m", "gpuwm.cli", "api", "--store", base, "--api-listen",
                            f"127.0.0.1:{port}", "--auth", "none", "--api-tls=false"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = (f"http://127.0.0.1:{port}/api/v1/namespaces/team-a/workloads/train/metrics"
               f"?metric=gpu_power_watts&start={int(end) - 4}&end={int(end)}&step=1s")
        status, body = wait_for(lambda: (lambda answer: answer if answer[0] != 0 else None)(http_get(url)),
                                timeout_seconds=60, what="gpuwm api on the Prometheus store")
        assert status == 200, body
        (series,) = json.loads(body)["series"]
        assert series["metric"] == "gpu_power_watts"
        assert {point[1] for point in series["points"] if point[1] is not None} == {350.0}
        bad_status, bad_body = http_get(url.replace("step=1s", "step=0s"))
        assert bad_status == 400 and "step" in json.loads(bad_body)["message"]
    finally:
        api.terminate()
        api.wait(timeout=20)

