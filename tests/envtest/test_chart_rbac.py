"""The real controller runs as the chart's ServiceAccount, under the chart's RBAC, on a real kube-apiserver.

The chart is installed into the API server by Helm's own library (tests/chart/helm_driver.py in the
Python 3.12 venv), so its ServiceAccounts, ClusterRoles, bindings, ClusterKopfPeering, DaemonSet and
Deployment are the rendered ones. The controller gets a token for `gpuwm-controller` from the
TokenRequest API and the Deployment's own settings (peering on, agents found as the DaemonSet's pods,
`--auth=kubernetes`); an agent pod made from the DaemonSet's template points at the real agent. Through a
Job's life (busy, idle, the Idle event, the API asked with a token) no call may be refused, while a call
outside the role is refused by the server.
"""

from __future__ import annotations

import json
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chart.conftest import CHART, helm_python, run_helm  # noqa: F401 - helm_python is a fixture
from tests.envtest.conftest import make_namespace
from tests.envtest.controlplane import ControlPlane, free_port
from tests.envtest.gpunode import GpuNode, busy, create_job, idle, job_pod, rfc3339, run_pod
from tests.fakenvml import build_fake_nvml
from tests.integration.test_controller import Controller, wait_until

pytestmark = pytest.mark.envtest

RELEASE_NS = "gpuwm"
NS = "rbac-team"
SA = "gpuwm-controller"


@pytest.fixture(scope="module")
def chart(control_plane: ControlPlane, crds: list[str], helm_python: str,  # noqa: F811
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`helm install gpuwm charts/gpuwm -n gpuwm` into the real API server; the Deployment it stored."""
    make_namespace(control_plane, RELEASE_NS)
    answer = run_helm(helm_python, "install", str(CHART), "--kubeconfig", str(control_plane.admin_kubeconfig),
                      "--namespace", RELEASE_NS, "--release", "gpuwm")
    assert answer["ok"], f"helm install into the real API server failed: {answer.get('error')}"
    deployment: dict[str, Any] = control_plane.admin().get(f"/apis/apps/v1/namespaces/{RELEASE_NS}/deployments/{SA}")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == SA
    return deployment


def _agent_pod(plane: ControlPlane, node: GpuNode) -> None:
    """A pod of the chart's agent DaemonSet (its template as stored) on `node`, its port the real agent's."""
    assert node.agent is not None
    http = plane.admin()
    daemonsets = http.get(f"/apis/apps/v1/namespaces/{RELEASE_NS}/daemonsets")["items"]
    assert len(daemonsets) == 1, [d["metadata"]["name"] for d in daemonsets]
    template = daemonsets[0]["spec"]["template"]
    port = int(node.agent.url.rsplit(":", 1)[1])
    spec = json.loads(json.dumps(template["spec"]))
    spec["nodeName"] = node.name
    for container in spec["containers"]:
        for declared in container.get("ports") or []:
            declared["containerPort"] = port
            declared.pop("hostPort", None)
    pod = http.create(f"/api/v1/namespaces/{RELEASE_NS}/pods",
                      {"metadata": {"name": f"gpuwm-agent-{node.name}", "labels": template["metadata"]["labels"]},
                       "spec": spec})
    http.merge(f"/api/v1/namespaces/{RELEASE_NS}/pods/{pod['metadata']['name']}/status", {"status": {
        "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "startTime": rfc3339(time.time()),
    }})


@pytest.fixture
def node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuNode]:
    directory = tmp_path_factory.mktemp("rbac-node")
    gpu_node = GpuNode(control_plane, "gpu-rbac", directory, build_fake_nvml(directory / "nvml"))
    yield gpu_node
    gpu_node.stop()


def test_the_controller_runs_as_the_charts_service_account(
    control_plane: ControlPlane, chart: dict[str, Any], node: GpuNode, tmp_path: Path,
) -> None:
    plane = control_plane
    make_namespace(plane, NS, {"gpuwm.io/project": "rbac-project"})
    node.create()
    node.set(busy(60.0))
    create_job(plane, NS, "train", node.name)
    pod = job_pod(plane, NS, "train")
    node.hold(pod)
    node.start()
    _agent_pod(plane, node)
    run_pod(plane, pod, float(int(time.time())))

    token = plane.token(RELEASE_NS, SA)
    kubeconfig = plane.write_kubeconfig(tmp_path / "kubeconfig", token=token, namespace=RELEASE_NS)
    # the Deployment's settings as the chart renders them, but for where this process listens and stores
    container = chart["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "controller"
    settings = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("GPUWM_") and "value" in e}
    assert settings["GPUWM_AUTH"] == "kubernetes" and settings["GPUWM_STANDALONE"] == "false"
    api_port, liveness_port = free_port(), free_port()
    settings.update(GPUWM_STORE=str(tmp_path / "gpuwm.db"), GPUWM_API_LISTEN=f"127.0.0.1:{api_port}",
                    GPUWM_LIVENESS=f"http://127.0.0.1:{liveness_port}/healthz", GPUWM_LOG_FORMAT="text",
                    GPUWM_INTERVAL="0.5", GPUWM_STATUS_INTERVAL="1s", GPUWM_IDLE_CONDITION_AFTER="2s")
    tls = ssl.create_default_context()  # the API's own self-signed certificate where the chart names none
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    if "GPUWM_API_TLS_CERT_FILE" in settings:  # the chart's Secret, mounted in the pod: a certificate of ours here
        settings.update(GPUWM_API_TLS_CERT_FILE=str(plane.pki / "apiserver.crt"),
                        GPUWM_API_TLS_KEY_FILE=str(plane.pki / "apiserver.key"))
        tls = ssl.create_default_context(cafile=str(plane.pki / "ca.crt"))
    audience = settings.get("GPUWM_API_TOKEN_AUDIENCE")
    user_token = plane.token(RELEASE_NS, SA, audiences=[audience] if audience else None)
    log = tmp_path / "controller.log"
    controller = Controller(kubeconfig, "", tmp_path / "unused.db", log)
    controller.args = [controller.args[0], "-m", "gpuwm.cli", *container["args"]]
    controller.env = {k: v for k, v in controller.env.items() if not k.startswith("GPUWM_")}
    controller.env.update(settings, POD_NAME="gpuwm-controller-0", POD_NAMESPACE=RELEASE_NS)
    gwm = f"/apis/gpuwm.io/v1alpha1/namespaces/{NS}/gpuworkloadmetrics/train"
    http = plane.admin()
    controller.start()
    try:
        wait_until("an active GPUWorkloadMetrics", lambda: (http.get(gwm)["status"].get("activeGpuSeconds") or 0) > 1,
                   log=log, timeout=90)
        node.set(idle())
        wait_until("the Idle condition", lambda: any(c["type"] == "Idle" and c["status"] == "True"
                                                     for c in http.get(gwm)["status"]["conditions"]), log=log, timeout=60)
        wait_until("a GpuIdle event", lambda: [e for source in ("/api/v1", "/apis/events.k8s.io/v1")
                                                for e in http.get(f"{source}/namespaces/{NS}/events")["items"]
                                                if e.get("reason") == "GpuIdle"], log=log)
        wait_until("the project CR", lambda: http.get("/apis/gpuwm.io/v1alpha1/gpuprojectmetrics/rbac-project"),
                   log=log)
        # the API (--auth=kubernetes, the chart's) asks TokenReview and SubjectAccessReview as the controller
        request = urllib.request.Request(f"https://127.0.0.1:{api_port}/api/v1/namespaces/{NS}/workloads/train",
                                         headers={"Authorization": f"Bearer {user_token}"})
        answer = wait_until("the metrics API", lambda: _get(request, tls), log=log)
        assert answer[0] == 200, answer
        # kopf's peering: the controller announced itself in the chart's ClusterKopfPeering
        peering = http.get("/apis/kopf.dev/v1/clusterkopfpeerings/gpuwm")
        assert peering.get("status"), peering
    finally:
        controller.stop()

    text = log.read_text()
    refused = [line for line in text.splitlines() if re.search(r"\b403\b|forbidden", line, re.IGNORECASE)]
    assert not refused, "the chart's RBAC refused the controller:\n" + "\n".join(refused[:20])
    assert "Traceback" not in text, text[-4000:]

    # a call outside its role is refused by the server, so the check above can fail
    as_controller = plane.as_token(token)
    for method, path, body in [
        ("GET", "/api/v1/namespaces/kube-system/secrets", None),
        ("DELETE", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}", None),
        ("PATCH", f"/apis/batch/v1/namespaces/{NS}/jobs/train", {"spec": {"suspend": True}}),
    ]:
        status, reply = as_controller.request(method, path, body, "application/merge-patch+json")
        assert status == 403 and reply["reason"] == "Forbidden", (method, path, status, reply)
        assert f"system:serviceaccount:{RELEASE_NS}:{SA}" in reply["message"]
    # and what it did need, it has (the server's own answer, not the chart's text)
    status, _ = as_controller.request("GET", f"/apis/gpuwm.io/v1alpha1/namespaces/{NS}/gpuworkloadmetrics")
    assert status == 200


def _get(request: urllib.request.Request, context: ssl.SSLContext) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return None
