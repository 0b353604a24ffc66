"""Per-pod CPU, memory, network and ephemeral storage from the kubelet's `/stats/summary`, and disk
read and write rates from its cAdvisor endpoint `/metrics/cadvisor` (the summary has none).

Authenticated with the pod's service-account token (read on each call: projected tokens rotate); the
summary needs `nodes/stats`, cAdvisor `nodes/metrics` (never `nodes/proxy`, which would open every
kubelet call). Network and disk figures are cumulative byte counters; rates come from two readings.
"""

from __future__ import annotations

import json
import logging
import ssl
import urllib.request
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from gpuwm.model import PodStatsSample

log = logging.getLogger(__name__)
K = TypeVar("K")

_CA_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
_TIMEOUT_SECONDS = 5.0


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


#: cAdvisor's cumulative block-device byte counters, per container and device
_DISK_COUNTERS = ("container_fs_reads_bytes_total", "container_fs_writes_bytes_total")


def disk_totals(text: str) -> dict[tuple[str, str], tuple[float, float]]:
    """(namespace, pod) -> (bytes read, bytes written) so far, summed over the pod's containers and
    devices, from cAdvisor's exposition. The pod's own cgroup (container "") and the pause container
    ("POD") are left out: the first sums its containers' again, the second reads nothing of the job's."""
    totals: dict[tuple[str, str], list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name + "_total" not in _DISK_COUNTERS and family.name not in _DISK_COUNTERS:
            continue
        column = 0 if "reads" in family.name else 1
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            labels = sample.labels
            if labels.get("container") in ("", "POD", None) or not labels.get("pod") or not labels.get("namespace"):
                continue
            totals.setdefault((labels["namespace"], labels["pod"]), [0.0, 0.0])[column] += sample.value
    return {key: (value[0], value[1]) for key, value in totals.items()}


def _rates(previous: dict[K, tuple[float, float, float]], key: K, totals: tuple[float, float] | None,
           now: float) -> tuple[float | None, float | None]:
    """Bytes a second of two cumulative counters since their reading before, kept in `previous` under `key`."""
    if totals is None:
        return None, None
    before = previous.get(key)
    previous[key] = (now, *totals)
    if before is None or now <= before[0] or totals[0] < before[1] or totals[1] < before[2]:
        return None, None  # the first reading, or a counter that went back (a container restarted)
    return (totals[0] - before[1]) / (now - before[0]), (totals[1] - before[2]) / (now - before[0])


class KubeletStatsClient:
    """Reads the local kubelet's stats summary and turns it into `PodStatsSample`s."""

    def __init__(self, url: str, node: str, token_file: str | None, insecure_tls: bool = False) -> None:
        self.url = url.rstrip("/") + "/stats/summary"
        self.cadvisor_url = url.rstrip("/") + "/metrics/cadvisor"
        self._previous_disk: dict[tuple[str, str], tuple[float, float, float]] = {}
        self.disk_error: str | None = None
        self.node = node
        self.token_file = token_file
        self.healthy = False
        self.error: str | None = "not read yet"
        self._previous_network: dict[str, tuple[float, float, float]] = {}
        self._ssl: ssl.SSLContext | None = None
        if self.url.startswith("https"):
            self._ssl = ssl.create_default_context(cafile=_CA_FILE if Path(_CA_FILE).exists() else None)
            if insecure_tls:  # the kubelet's self-signed serving certificate (kubeadm's default)
                self._ssl.check_hostname = False
                self._ssl.verify_mode = ssl.CERT_NONE

    def _get(self, url: str, accept: str) -> bytes:
        request = urllib.request.Request(url, headers={"Accept": accept})
        if self.token_file and Path(self.token_file).exists():
            token = Path(self.token_file).read_text().strip()
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=_TIMEOUT_SECONDS, context=self._ssl) as response:
            body: bytes = response.read()
        return body

    def _disk(self) -> dict[tuple[str, str], tuple[float, float]] | None:
        """cAdvisor's disk counters, or None (and one warning per new error) when they cannot be read:
        the other figures do not depend on them."""
        try:
            totals = disk_totals(self._get(self.cadvisor_url, "text/plain").decode())
        except (OSError, ValueError) as error:
            message = f"kubelet cAdvisor metrics {self.cadvisor_url} unreadable: {error}"
            if self.disk_error != message:
                log.warning("%s; check the agent's RBAC for nodes/metrics (disk rates left out)", message)
            self.disk_error = message
            return None
        self.disk_error = None
        return totals

    def read(self, now: float) -> list[PodStatsSample]:
        """One sample per pod on the node; [] (and `error` set) when the kubelet cannot be read."""
        try:
            summary = json.loads(self._get(self.url, "application/json"))
        except (OSError, ValueError) as error:
            message = f"kubelet stats summary {self.url} unreadable: {error}"
            if self.error != message:
                log.warning("%s; check --kubelet-url and the agent's RBAC for nodes/stats", message)
            self.healthy, self.error = False, message
            return []
        self.healthy, self.error = True, None
        return self.parse(summary, now, self._disk())

    def parse(
        self, summary: dict[str, Any], now: float, disk: dict[tuple[str, str], tuple[float, float]] | None = None
    ) -> list[PodStatsSample]:
        """One sample per pod of the summary, with disk rates from `disk` (`disk_totals`) where given."""
        samples = []
        seen: set[str] = set()
        names: set[tuple[str | None, str | None]] = set()
        for pod in summary.get("pods") or []:
            ref = pod.get("podRef") or {}
            uid, name, namespace = ref.get("uid"), ref.get("name"), ref.get("namespace")
            names.add((namespace, name))
            if not (uid and name and namespace):
                continue
            seen.add(uid)
            cpu_nano = (pod.get("cpu") or {}).get("usageNanoCores")
            memory = (pod.get("memory") or {}).get("workingSetBytes")
            storage = (pod.get("ephemeral-storage") or {}).get("usedBytes")
            rx_rate, tx_rate = _rates(self._previous_network, uid, _network_totals(pod), now)
            read_rate, write_rate = _rates(self._previous_disk, (namespace, name),
                                           None if disk is None else disk.get((namespace, name)), now)
            samples.append(
                PodStatsSample(
                    t=now, node=self.node, namespace=namespace, pod=name, pod_uid=uid,
                    cpu_usage_cores=None if cpu_nano is None else float(cpu_nano) / 1e9,
                    memory_used_bytes=None if memory is None else float(memory),
                    network_rx_bytes_per_second=rx_rate,
                    network_tx_bytes_per_second=tx_rate,
                    ephemeral_storage_used_bytes=None if storage is None else float(storage),
                    disk_read_bytes_per_second=read_rate,
                    disk_write_bytes_per_second=write_rate,
                )
            )
        self._previous_network = {uid: kept for uid, kept in self._previous_network.items() if uid in seen}
        self._previous_disk = {key: kept for key, kept in self._previous_disk.items() if key in names}
        return samples
