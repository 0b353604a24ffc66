"""Per-pod CPU, memory, network and ephemeral storage from the kubelet's `/stats/summary`.

Authenticated with the pod's service-account token (read on each call: projected tokens rotate).
Network figures in the summary are cumulative byte counters; rates come from two readings.
"""

from __future__ import annotations

import json
import logging
import ssl
import urllib.request
from pathlib import Path
from typing import Any

from gpuwm.model import PodStatsSample

log = logging.getLogger(__name__)

_CA_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"


def _network_totals(pod: dict[str, Any]) -> tuple[float, float] | None:
    network = pod.get("network") or {}
    interfaces = network.get("interfaces")
    if interfaces:
        rx = sum(float(i.get("rxBytes") or 0) for i in interfaces)
        tx = sum(float(i.get("txBytes") or 0) for i in interfaces)
        return rx, tx
    if "rxBytes" in network or "txBytes" in network:
        return float(network.get("rxBytes") or 0), float(network.get("txBytes") or 0)
    return None


class KubeletStatsClient:
    """Reads the local kubelet's stats summary and turns it into `PodStatsSample`s."""

    def __init__(
        self,
        url: str,
        node: str,
        token_file: str | None,
        insecure_tls: bool = False,
        ca_file: str = _CA_FILE,
        timeout_seconds: float = 5.0,
    ) -> None:
        self.url = url.rstrip("/") + "/stats/summary"
        self.node = node
        self.token_file = token_file
        self.timeout_seconds = timeout_seconds
        self.healthy = False
        self.error: str | None = "not read yet"
        self._previous_network: dict[str, tuple[float, float, float]] = {}
        self._ssl: ssl.SSLContext | None = None
        if self.url.startswith("https"):
            if insecure_tls:
                self._ssl = ssl._create_unverified_context()
            else:
                self._ssl = ssl.create_default_context(cafile=ca_file if Path(ca_file).exists() else None)

    def _request(self) -> dict[str, Any]:
        request = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        if self.token_file and Path(self.token_file).exists():
            token = Path(self.token_file).read_text().strip()
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=self.timeout_seconds, context=self._ssl) as response:
            payload: dict[str, Any] = json.load(response)
        return payload

    def read(self, now: float) -> list[PodStatsSample]:
        """One sample per pod on the node; [] (and `error` set) when the kubelet cannot be read."""
        try:
            summary = self._request()
        except (OSError, ValueError) as error:
            message = f"kubelet stats summary {self.url} unreadable: {error}"
            if self.error != message:
                log.warning("%s; check --kubelet-url and the agent's RBAC for nodes/stats", message)
            self.healthy, self.error = False, message
            return []
        self.healthy, self.error = True, None
        return self.parse(summary, now)

    def parse(self, summary: dict[str, Any], now: float) -> list[PodStatsSample]:
        samples = []
        seen: set[str] = set()
        for pod in summary.get("pods") or []:
            ref = pod.get("podRef") or {}
            uid, name, namespace = ref.get("uid"), ref.get("name"), ref.get("namespace")
            if not (uid and name and namespace):
                continue
            seen.add(uid)
            cpu_nano = (pod.get("cpu") or {}).get("usageNanoCores")
            memory = (pod.get("memory") or {}).get("workingSetBytes")
            storage = (pod.get("ephemeral-storage") or {}).get("usedBytes")
            rx_rate = tx_rate = None
            totals = _network_totals(pod)
            if totals is not None:
                previous = self._previous_network.get(uid)
                if previous is not None and now > previous[0] and totals[0] >= previous[1] and totals[1] >= previous[2]:
                    rx_rate = (totals[0] - previous[1]) / (now - previous[0])
                    tx_rate = (totals[1] - previous[2]) / (now - previous[0])
                self._previous_network[uid] = (now, totals[0], totals[1])
            samples.append(
                PodStatsSample(
                    t=now, node=self.node, namespace=namespace, pod=name, pod_uid=uid,
                    cpu_usage_cores=None if cpu_nano is None else float(cpu_nano) / 1e9,
                    memory_used_bytes=None if memory is None else float(memory),
                    network_rx_bytes_per_second=rx_rate,
                    network_tx_bytes_per_second=tx_rate,
                    ephemeral_storage_used_bytes=None if storage is None else float(storage),
                )
            )
        for uid in list(self._previous_network):
            if uid not in seen:
                del self._previous_network[uid]
        return samples
