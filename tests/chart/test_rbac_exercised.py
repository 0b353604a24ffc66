"""The real `gpuwm controller` runs under the chart's ClusterRole, enforced by the API emulator.

The chart is installed (Helm's library) to render its controller ClusterRole; the integration
tests' Kubernetes emulator is then made to authorise every request against those rules, as the
real API server's RBAC authoriser does (403 Forbidden, naming verb, resource and group), and the
controller runs with peering on (two-replica mode) through a workload's life. Any request the
chart does not allow fails the test, with the rule to add.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from tests.chart.conftest import CHART, Installed
from tests.integration.fakeagent import FakeAgents, FakeNode
from tests.integration.kubeemu import EmulatorThread, KubeHttp, KubernetesEmulator

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NS = "team-a"
PEERING = "gpuwm"

Rules = list[dict[str, Any]]


def request_attributes(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str] | None:
    """(verb, API group, resource[/subresource]) of a resource request; None for discovery and health."""
    parts = [part for part in path.split("/") if part]
    if not parts or parts[0] not in {"api", "apis"}:
        return None
    if len(parts) <= (2 if parts[0] == "api" else 3):
        return None  # discovery: /api, /apis, a group, a group version
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in {"status", "finalize"}:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    if method == "GET":
        verb = "get" if named else ("watch" if query.get("watch") in {"true", "1"} else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete" if named else "deletecollection"}.get(method, method.lower())
    return verb, group, resource


def allows(rules: Rules, verb: str, group: str, resource: str) -> bool:
    return any(group in r.get("apiGroups", []) and resource in r.get("resources", []) and verb in r.get("verbs", [])
               for r in rules)


class RbacEmulator(KubernetesEmulator):
    """The emulator with an RBAC authoriser in front: only the given rules are allowed."""

    def __init__(self, crd_directory: Path, rules: Rules) -> None:
        super().__init__(crd_directory)
        self.rules = rules
        self.denied: list[str] = []
        self.allowed: set[tuple[str, str, str]] = set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        attributes = request_attributes(request.method, request.path, dict(request.query))
        if attributes is not None and request.headers.get("User-Agent", "").startswith("test-setup"):
            attributes = None  # the test's own setup requests act as cluster-admin
        if attributes is not None:
            verb, group, resource = attributes
            if not allows(self.rules, verb, group, resource):
                message = (f'system:serviceaccount:gpuwm:gpuwm-controller cannot {verb} resource "{resource}" '
                           f'in API group "{group}" ({request.method} {request.path})')
                self.denied.append(message)
                return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                          "reason": "Forbidden", "message": message, "code": 403}, status=403)
            self.allowed.add(attributes)
        return await super().handle(request)


def test_request_attributes_match_the_api_servers() -> None:
    assert request_attributes("GET", "/api/v1/pods", {"watch": "true"}) == ("watch", "", "pods")
    assert request_attributes("GET", "/api/v1/namespaces/a/pods", {}) == ("list", "", "pods")
    assert request_attributes("GET", "/api/v1/namespaces/a", {}) == ("get", "", "namespaces")
    assert request_attributes("PATCH", "/apis/gpuwm.io/v1alpha1/namespaces/a/gpuworkloadmetrics/x/status", {}) == (
        "patch", "gpuwm.io", "gpuworkloadmetrics/status")
    assert request_attributes("POST", "/apis/events.k8s.io/v1/namespaces/a/events", {}) == (
        "create", "events.k8s.io", "events")
    assert request_attributes("GET", "/apis/batch/v1", {}) is None
    assert request_attributes("GET", "/version", {}) is None
    assert request_attributes("GET", "/apis", {}) is None
    assert request_attributes("GET", "/api", {}) is None


@pytest.fixture
def chart_rules(install: Callable[..., Installed]) -> Rules:
    installed = install()
    assert installed.ok, installed.error
    rules: Rules = installed.one("ClusterRole", "-controller")["rules"]
    return rules


class SetupHttp(KubeHttp):
    """The test's own requests, marked so the authoriser lets them through."""

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                params: dict[str, str] | None = None) -> tuple[int, Any]:
        import json
        import urllib.error
        import urllib.parse
        import urllib.request

        url = self.base_url + path + (("?" + urllib.parse.urlencode(params)) if params else "")
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method,
                                         headers={"Content-Type": content_type, "User-Agent": "test-setup"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")


@pytest.fixture
def emulator(chart_rules: Rules) -> Iterator[tuple[RbacEmulator, EmulatorThread]]:
    emulator = RbacEmulator(ROOT / "crds", chart_rules)
    for crd in yaml.safe_load_all((CHART / "crds" / "kopf.dev_peerings.yaml").read_text()):
        if crd:
            emulator.install_crd(crd)
    with EmulatorThread(emulator) as thread:
        yield emulator, thread


def _wait(what: str, check: Callable[[], Any], log: Path, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = check()
        except (AssertionError, KeyError, TypeError):  # not there yet
            result = None
        if result:
            return result
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; controller log:\n{log.read_text()[-4000:]}")


def test_controller_runs_under_the_charts_cluster_role(
    emulator: tuple[RbacEmulator, EmulatorThread], tmp_path: Path
) -> None:
    rbac, thread = emulator
    http = SetupHttp(thread.url)
    assert http.request("DELETE", "/api/v1/namespaces/gpuwm/pods/none")[0] == 404  # setup acts as admin
    assert KubeHttp(thread.url).request("DELETE", "/api/v1/namespaces/gpuwm/pods/none")[0] == 403  # others do not
    rbac.denied.clear()

    http.create("/apis/kopf.dev/v1/clusterkopfpeerings", {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                                                          "metadata": {"name": PEERING}})
    http.create("/api/v1/namespaces", {"metadata": {"name": NS, "labels": {"gpuwm.io/project": "vision"}}})
    job = http.create(f"/apis/batch/v1/namespaces/{NS}/jobs", {"metadata": {"name": "train"}, "spec": {"template": {}}})
    owner = [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": job["metadata"]["uid"],
              "controller": True, "blockOwnerDeletion": True}]
    http.create(f"/api/v1/namespaces/{NS}/pods", {
        "metadata": {"name": "train-0", "ownerReferences": owner},
        "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "trainer",
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    })
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    http.ok("PATCH", f"/api/v1/namespaces/{NS}/pods/train-0/status", {"status": {
        "phase": "Running", "startTime": now,
        "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0, "image": "trainer", "imageID": "",
                               "state": {"running": {"startedAt": now}}}]}}, "application/merge-patch+json")
    node = FakeNode("node-a", ["GPU-a0"], sm_percent=70.0)
    node.hold("GPU-a0", NS, "train-0")
    agents = FakeAgents(thread, [node]).start()

    log = tmp_path / "controller.log"
    kubeconfig = thread.write_kubeconfig(tmp_path / "kubeconfig")
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUWM_")}
    env.update(KUBECONFIG=str(kubeconfig))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    arguments = [
        sys.executable, "-m", "gpuwm.cli", "controller", "--peering-name", PEERING, "--agents", agents.spec(),
        "--status-interval", "1", "--interval", "1", "--store", str(tmp_path / "gpuwm.db"),
        "--idle-condition-after", "2s", "--log-format", "text", "--api-listen", "127.0.0.1:0", "--auth", "none",
        "--api-tls=false",
    ]
    with log.open("ab") as handle:
        process = subprocess.Popen(arguments, env=env, stdout=handle, stderr=subprocess.STDOUT)
    gwm = f"/apis/gpuwm.io/v1alpha1/namespaces/{NS}/gpuworkloadmetrics/train"
    try:
        _wait("an active GPUWorkloadMetrics", lambda: (http.get(gwm)["status"].get("activeGpuSeconds") or 0) > 0, log)
        agents.set(sm_percent=0.0)
        _wait("the Idle condition", lambda: any(c["type"] == "Idle" and c["status"] == "True"
                                                for c in http.get(gwm)["status"]["conditions"]), log)
        _wait("a GpuIdle event", lambda: [e for source in ("/api/v1", "/apis/events.k8s.io/v1")
                                           for e in http.get(f"{source}/namespaces/{NS}/events")["items"]
                                           if e.get("reason") == "GpuIdle"], log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        agents.stop()

    assert not rbac.denied, "the chart's ClusterRole denied the controller:\n" + "\n".join(sorted(set(rbac.denied)))
    exercised = {(verb, resource) for verb, _, resource in rbac.allowed}
    for needed in [("watch", "pods"), ("get", "jobs"), ("create", "gpuworkloadmetrics"),
                   ("patch", "gpuworkloadmetrics/status"), ("patch", "clusterkopfpeerings"), ("watch", "nodes"),
                   ("list", "gpuprojectmetrics"), ("create", "events")]:
        assert needed in exercised, f"the controller never did {needed}; it did {sorted(exercised)}"
