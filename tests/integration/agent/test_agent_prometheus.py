"""Real Prometheus (the Debian `prometheus` package) scrapes a running agent; PromQL sees the figures."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fakenvml.podresources_server import PodResourcesServer
from tests.integration.agent.helpers import RunningAgent, free_port, http_get, wait_for

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
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: gpuwm-agent\n    static_configs:\n      - targets: ['{target}']\n"
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
        # the energy counter grows at the power draw, 350 W (deriv: a regression, not rate's range extrapolation)
        wait_for(
            lambda: _query(base, 'count_over_time(gpuwm_gpu_energy_joules_total{uuid="GPU-1111"}[30s]) >= 5'),
            timeout_seconds=30, what="five scrapes of the energy counter",
        )
        ((_, watts),) = _query(base, 'deriv(gpuwm_gpu_energy_joules_total{uuid="GPU-1111"}[30s])')
        assert watts == pytest.approx(350.0, rel=0.2)
    finally:
        prometheus.send_signal(signal.SIGTERM)
        try:
            prometheus.wait(timeout=20)
        except subprocess.TimeoutExpired:
            prometheus.kill()
            prometheus.wait()
