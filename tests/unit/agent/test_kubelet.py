"""Kubelet stats summary: parsing, network rates between readings, bearer token auth, failures."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpuwm.agent.kubelet import KubeletStatsClient

TOKEN = "test-token-123"


def _summary(rx: int, tx: int) -> dict[str, Any]:
    return {
        "node": {"nodeName": "n1"},
        "pods": [
            {
                "podRef": {"name": "train-0", "namespace": "team", "uid": "u-1"},
                "cpu": {"usageNanoCores": 2_500_000_000},
                "memory": {"workingSetBytes": 3 * 1024**3},
                "network": {"interfaces": [{"name": "eth0", "rxBytes": rx, "txBytes": tx},
                                           {"name": "net1", "rxBytes": 1000, "txBytes": 0}]},
                "ephemeral-storage": {"usedBytes": 4096},
            },
            {"podRef": {"name": "bare", "namespace": "team", "uid": "u-2"}},
        ],
    }


class _Kubelet(BaseHTTPRequestHandler):
    summary: ClassVar[dict[str, Any]] = {}

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps(type(self).summary).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def kubelet() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Kubelet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_reads_pods_with_token_and_rates(kubelet: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    client = KubeletStatsClient(kubelet, "n1", str(token))
    _Kubelet.summary = _summary(rx=10_000, tx=5_000)
    first = {s.pod: s for s in client.read(now=100.0)}
    assert client.healthy
    pod = first["train-0"]
    assert (pod.pod_uid, pod.cpu_usage_cores, pod.memory_used_bytes, pod.ephemeral_storage_used_bytes) == (
        "u-1", 2.5, 3 * 1024**3, 4096,
    )
    assert pod.network_rx_bytes_per_second is None  # one reading: no rate yet
    assert first["bare"].cpu_usage_cores is None

    _Kubelet.summary = _summary(rx=30_000, tx=5_500)
    second = {s.pod: s for s in client.read(now=110.0)}
    assert second["train-0"].network_rx_bytes_per_second == pytest.approx(2000.0)
    assert second["train-0"].network_tx_bytes_per_second == pytest.approx(50.0)


def test_wrong_token_is_an_error_not_a_crash(kubelet: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("wrong")
    client = KubeletStatsClient(kubelet, "n1", str(token))
    assert client.read(now=1.0) == []
    assert not client.healthy
    assert "401" in (client.error or "")
    assert "wrong" not in (client.error or "")  # the token never reaches a message
