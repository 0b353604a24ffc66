"""What the e2e checks act through: the release (Helm's library), the workload's CR, the fake GPU's scenario,
the controller replicas, the metrics API over HTTPS, and waiting with diagnostics that say what was there."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.clusters import ROOT, E2eCluster

CHART = ROOT / "charts" / "gpuwm"
DRIVER = ROOT / "tests" / "chart" / "helm_driver.py"
RELEASE = "gpuwm"
NAMESPACE = "gpuwm"
WORKLOAD_NAMESPACE = "e2e"
WORKLOAD = "gpu-job"
#: the chart's default status interval: the tier installs the chart's defaults
STATUS_INTERVAL_SECONDS = 15.0
#: the fake GPU's power: energy grows by this many joules a second
POWER_WATTS = 250.0
SPARE_GPU = "GPU-e2e-spare"


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Scene:
    """The release and the workload the checks share, in the order the checks build them."""

    cluster: E2eCluster
    helm_python: str
    work: Path
    #: the device the workload's pod holds, and its process's host PID
    gpu: str = "GPU-e2e-0"
    pid: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    # ------------------------------------------------------------------ Helm

    def helm(self, action: str, chart: Path | None = None, values: dict[str, Any] | None = None,
             wait_seconds: int = 300) -> dict[str, Any]:
        """helm_driver.py ACTION with the cluster's GPU-less values (and `values` over them); releases kept in
        Secrets, as `helm` keeps them, so a later upgrade and uninstall find them."""
        files: list[str] = []
        if action != "uninstall":
            merged = _merge(self.cluster.chart_values(), values or {})
            path = self.work / f"values-{action}.yaml"
            path.write_text(yaml.safe_dump(merged))
            files.append(str(path))
        env = {**os.environ, "HOME": os.environ.get("HOME", "/tmp")}
        env.pop("HELM_DRIVER", None)
        done = subprocess.run(
            [self.helm_python, str(DRIVER), action, str(chart or (CHART if action == "install" else "-")), *files,
             "--kubeconfig",
             str(self.cluster.kubeconfig), "--namespace", NAMESPACE, "--release", RELEASE, "--wait", str(wait_seconds)],
            capture_output=True, text=True, timeout=wait_seconds + 120, env=env)
        assert done.returncode == 0, f"helm_driver.py {action} crashed:\n{done.stderr[-4000:]}"
        answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        assert answer["ok"], f"helm {action} failed: {answer.get('error')}\n{self.diagnostics()}"
        return answer

    def clear_leftovers(self) -> list[str]:
        """Delete what an interrupted earlier run on this cluster left: its release (kept in its namespace's
        Secrets), its workload and its peering object, so the install starts from a cluster without gpuwm.
        CRDs stay, as `helm uninstall` leaves them. Returns the namespaces that were there."""
        found = [namespace for namespace in (WORKLOAD_NAMESPACE, NAMESPACE) if self.cluster.kubectl(
            "get", "namespace", namespace, check=False).returncode == 0]
        if found:
            self.cluster.kubectl("delete", "namespace", *found, "--wait=true", "--timeout=240s", timeout=300)
        self.cluster.kubectl("delete", "clusterkopfpeering", RELEASE, "--ignore-not-found", check=False)
        return found

    # ------------------------------------------------------------------ the fake GPU

    def set_gpu(self, sm_percent: float) -> None:
        """The fake NVML's scenario: the held GPU at `sm_percent` with the pod's process on it, a spare GPU idle."""
        process = f"proc device={self.gpu} pid={self.pid} used_mib=2000 sm={sm_percent:g} mem=10\n" if self.pid else ""
        text = (
            "driver version=550.54.15\n"
            f"gpu uuid={self.gpu} name=NVIDIA_H100_80GB_HBM3 memory_total_mib=81559 memory_used_mib=2048 "
            f"power_mw={POWER_WATTS * 1000:.0f} power_limit_mw=700000 energy_mj=0 util={sm_percent:g} "
            f"instant_util={sm_percent:g} mem_util=10\n"
            f"gpu uuid={SPARE_GPU} name=NVIDIA_H100_80GB_HBM3 memory_total_mib=81559 memory_used_mib=0 "
            "power_mw=70000 power_limit_mw=700000 energy_mj=0 util=0 instant_util=0 mem_util=0\n"
            + process
        )
        target = self.cluster.scenario_dir / "scenario"
        staged = target.with_name("scenario.new")
        staged.write_text(text)
        staged.chmod(0o644)
        staged.replace(target)  # the fake reads it whole or not at all

    # ------------------------------------------------------------------ reading the cluster

    def cr(self) -> dict[str, Any] | None:
        done = self.cluster.kubectl("-n", WORKLOAD_NAMESPACE, "get", "gpuworkloadmetrics", WORKLOAD, "-o", "json",
                                    check=False)
        return json.loads(done.stdout) if done.returncode == 0 else None

    def status(self) -> dict[str, Any]:
        cr = self.cr()
        assert cr is not None and cr.get("status"), f"no status on GPUWorkloadMetrics {WORKLOAD}\n{self.diagnostics()}"
        status: dict[str, Any] = cr["status"]
        return status

    def written_after(self, moment: float, timeout: float) -> dict[str, Any]:
        """The CR's status once it was written at least a second after `moment`."""
        found: dict[str, Any] = self.wait(
            f"a status of {WORKLOAD} written after {moment:.0f}",
            lambda: (cr := self.cr()) and cr.get("status", {}).get("lastUpdateTime") and
            epoch(cr["status"]["lastUpdateTime"]) >= moment + 1 and cr["status"], timeout)
        return found

    def pods(self, component: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cluster.json(
            "-n", NAMESPACE, "get", "pods", "-l", f"app.kubernetes.io/component={component}")["items"]
        return [pod for pod in items if not pod["metadata"].get("deletionTimestamp")]

    def ready(self, component: str) -> list[dict[str, Any]]:
        return [pod for pod in self.pods(component) if any(
            c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))]

    def leaders(self) -> list[str]:
        return [pod["metadata"]["name"] for pod in self.pods("controller")
                if (pod["metadata"].get("labels") or {}).get("gpuwm.io/leader") == "true"]

    def logs(self, pod: str, tail: int = 200) -> str:
        return self.cluster.kubectl("-n", NAMESPACE, "logs", pod, "--tail", str(tail), check=False).stdout

    def wait(self, what: str, check: Callable[[], Any], timeout: float, every: float = 2.0) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except (AssertionError, KeyError, TypeError, ValueError) as error:
                last = error
            else:
                if last:
                    return last
            time.sleep(every)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}\n{self.diagnostics()}")

    def diagnostics(self) -> str:
        parts = [self.cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout]
        for component in ("controller", "agent"):
            for pod in self.pods(component):
                name = pod["metadata"]["name"]
                parts.append(f"--- logs of {name}\n{self.logs(name, 60)[-6000:]}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ the metrics API

    @contextmanager
    def api(self) -> Iterator[Callable[..., tuple[int, str]]]:
        """`get(path, token=None)` -> (status, body) over HTTPS through `kubectl port-forward` to the API's
        Service, the certificate checked against the CA the controller keeps in its Secret."""
        port = free_port()
        forward = subprocess.Popen(
            [self.cluster.kubectl_path, "--kubeconfig", str(self.cluster.kubeconfig), "-n", NAMESPACE,
             "port-forward", f"svc/{RELEASE}-controller", f"{port}:8080"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            context = self._ca_context()

            def get(path: str, token: str | None = None) -> tuple[int, str]:
                request = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
                if token:
                    request.add_header("Authorization", f"Bearer {token}")
                try:
                    with urllib.request.urlopen(request, context=context, timeout=30) as answer:
                        return answer.status, answer.read().decode()
                except urllib.error.HTTPError as error:
                    return error.code, error.read().decode()

            self.wait("the API through port-forward", lambda: _answers(get), timeout=60, every=1.0)
            yield get
        finally:
            forward.terminate()
            forward.wait(timeout=10)

    def _ca_context(self) -> ssl.SSLContext:
        secret = self.cluster.json("-n", NAMESPACE, "get", "secret", f"{RELEASE}-controller-tls")
        import base64

        ca = base64.b64decode(secret["data"]["ca.crt"]).decode()
        context = ssl.create_default_context(cadata=ca)
        # the certificate names the Service's DNS names; the port-forward reaches it as 127.0.0.1
        context.check_hostname = False
        return context

    def copy_chart(self, version: str) -> Path:
        """The chart at another version (the next release's, for `helm upgrade`)."""
        copy = self.work / f"chart-{version}" / "gpuwm"
        shutil.copytree(CHART, copy, dirs_exist_ok=True)
        chart_yaml = copy / "Chart.yaml"
        lines = [f"version: {version}" if line.startswith("version:") else line
                 for line in chart_yaml.read_text().splitlines()]
        chart_yaml.write_text("\n".join(lines) + "\n")
        return copy


def _answers(get: Callable[..., tuple[int, str]]) -> bool:
    try:
        return get("/healthz")[0] == 200
    except (OSError, ssl.SSLError):
        return False


def _merge(base: Any, overlay: Any) -> Any:
    """Helm's values merge: maps key by key, anything else replaced."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        return {**base, **{key: _merge(base.get(key), value) for key, value in overlay.items()}}
    return overlay
