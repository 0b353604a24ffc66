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


def _cadvisor(read: int, written: int) -> str:
    """cAdvisor's exposition as the kubelet serves it: per container and device, the pod cgroup and pause too."""
    lines = ["# HELP container_fs_reads_bytes_total Cumulative count of bytes read",
             "# TYPE container_fs_reads_bytes_total counter"]
    for container, device, value in (("train", "/dev/nvme0n1", read), ("sidecar", "/dev/nvme0n1", 100),
                                     ("", "/dev/nvme0n1", 10**9), ("POD", "/dev/nvme0n1", 10**9)):
        lines.append(f'container_fs_reads_bytes_total{{container="{container}",device="{device}",id="/x",'
                     f'namespace="team",pod="train-0"}} {value} 1700000000000')
    lines += ["# HELP container_fs_writes_bytes_total Cumulative count of bytes written",
              "# TYPE container_fs_writes_bytes_total counter",
              f'container_fs_writes_bytes_total{{container="train",device="/dev/nvme0n1",namespace="team",pod="train-0"}} {written}',
              "# TYPE container_cpu_usage_seconds_total counter",
              'container_cpu_usage_seconds_total{container="train",namespace="team",pod="train-0"} 5']
    return "\n".join(lines) + "\n"


class _Kubelet(BaseHTTPRequestHandler):
    summary: ClassVar[dict[str, Any]] = {}
    cadvisor: ClassVar[str | None] = None

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_response(401)
            self.end_headers()
            return
        if self.path == "/metrics/cadvisor":
            if type(self).cadvisor is None:
                self.send_response(403)  # no nodes/metrics in the agent's role
                self.end_headers()
                return
            body = (type(self).cadvisor or "").encode()
        else:
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


def test_disk_rates_from_cadvisor_and_the_summary_without_them(kubelet: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    client = KubeletStatsClient(kubelet, "n1", str(token))
    _Kubelet.summary = _summary(rx=0, tx=0)
    _Kubelet.cadvisor = None
    # no nodes/metrics: the summary's figures still come, the disk rates do not, and the error says why
    (pod, _) = client.read(now=100.0)
    assert client.healthy and pod.cpu_usage_cores == 2.5 and pod.disk_read_bytes_per_second is None
    assert "403" in (client.disk_error or "") and "/metrics/cadvisor" in (client.disk_error or "")
    _Kubelet.cadvisor = _cadvisor(read=1_000, written=50)
    client.read(now=110.0)  # the first counters: no rate yet
    _Kubelet.cadvisor = _cadvisor(read=21_000, written=2_050)
    rates = {s.pod: s for s in client.read(now=120.0)}
    assert client.disk_error is None
    # the train and sidecar containers' bytes (the pod cgroup's and the pause container's left out)
    assert rates["train-0"].disk_read_bytes_per_second == pytest.approx(2000.0)
    assert rates["train-0"].disk_write_bytes_per_second == pytest.approx(200.0)
    assert rates["bare"].disk_read_bytes_per_second is None
    # a counter that goes back (a restarted container) gives no rate rather than a negative one
    _Kubelet.cadvisor = _cadvisor(read=10, written=0)
    assert {s.pod: s for s in client.read(now=130.0)}["train-0"].disk_read_bytes_per_second is None
    _Kubelet.cadvisor = None


@pytest.fixture
def kubelet_tls() -> Iterator[str]:
    """The same kubelet over HTTPS with a self-signed certificate, as kubeadm's kubelets serve by default."""
    import ssl

    from gpuwm.api.tls import self_signed

    files = self_signed("127.0.0.1")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.cert_file, files.key_file)
    server = HTTPServer(("127.0.0.1", 0), _Kubelet)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("insecure", [False, True])
def test_a_self_signed_kubelet_is_read_only_when_told_to_skip_verification(
    kubelet_tls: str, tmp_path: Path, insecure: bool
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    _Kubelet.summary = _summary(rx=10_000, tx=5_000)
    client = KubeletStatsClient(kubelet_tls, "n1", str(token), insecure_tls=insecure)
    pods = {sample.pod for sample in client.read(now=1.0)}
    assert client.healthy is insecure
    if insecure:
        assert pods == {"train-0", "bare"}
    else:
        assert pods == set() and "CERTIFICATE_VERIFY_FAILED" in (client.error or "")
