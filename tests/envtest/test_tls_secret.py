"""The API's certificate kept in a Secret, on a real kube-apiserver, as the chart's ServiceAccount under the
chart's RBAC: the first start creates `gpuwm-controller-tls` (a CA and a certificate for the
Service's names), a restart serves the same certificate, which verifies with the Secret's ca.crt for the
Service's name; the ServiceAccount may not list Secrets nor read another one.

The chart is the one test_chart_rbac.py installs (Helm keeps releases in memory, so a second install of the
same objects would fail): reused when it is there, installed here when this module runs alone.
"""

from __future__ import annotations

import base64
import functools
import re
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest

from tests.chart.conftest import CHART, helm_python, run_helm  # noqa: F401 - helm_python is a fixture
from tests.envtest.conftest import make_namespace
from tests.envtest.controlplane import ControlPlane, free_port
from tests.integration.test_controller import Controller, wait_until

pytestmark = pytest.mark.envtest

RELEASE_NS = "gpuwm"
SA = "gpuwm-controller"
SECRET = "gpuwm-controller-tls"
SECRET_PATH = f"/api/v1/namespaces/{RELEASE_NS}/secrets/{SECRET}"


@pytest.fixture(scope="module")
def deployment(control_plane: ControlPlane, crds: list[str], helm_python: str) -> dict[str, Any]:  # noqa: F811
    """The chart's controller Deployment as stored (installed now unless an earlier module did)."""
    http = control_plane.admin()
    path = f"/apis/apps/v1/namespaces/{RELEASE_NS}/deployments/{SA}"
    if http.request("GET", path)[0] != 200:
        if http.request("GET", f"/api/v1/namespaces/{RELEASE_NS}")[0] != 200:
            make_namespace(control_plane, RELEASE_NS)
        answer = run_helm(helm_python, "install", str(CHART), "--kubeconfig", str(control_plane.admin_kubeconfig),
                          "--namespace", RELEASE_NS, "--release", "gpuwm")
        assert answer["ok"], f"helm install into the real API server failed: {answer.get('error')}"
    found: dict[str, Any] = http.get(path)
    return found


def _served_certificate(port: int, ca_pem: bytes, tmp_path: Path) -> bytes:
    """The API's certificate (DER), verified with `ca_pem` for the Service's name."""
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca_pem)
    context = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=f"{SA}.{RELEASE_NS}.svc") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der
    return der


def _start(plane: ControlPlane, deployment: dict[str, Any], tmp_path: Path, log: Path, port: int) -> Controller:
    """`gpuwm controller` with the Deployment's settings and its ServiceAccount's token (only where it listens and
    stores differs)."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    settings = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("GPUWM_") and "value" in e}
    assert settings["GPUWM_API_TLS_SECRET"] == SECRET and "GPUWM_API_TLS_CERT_FILE" not in settings
    settings.update(GPUWM_STORE=str(tmp_path / "gpuwm.db"), GPUWM_API_LISTEN=f"127.0.0.1:{port}",
                    GPUWM_LIVENESS=f"http://127.0.0.1:{free_port()}/healthz", GPUWM_LOG_FORMAT="text")
    kubeconfig = plane.write_kubeconfig(tmp_path / "kubeconfig", token=plane.token(RELEASE_NS, SA),
                                        namespace=RELEASE_NS)
    controller = Controller(kubeconfig, "", tmp_path / "unused.db", log)
    controller.args = [controller.args[0], "-m", "gpuwm.cli", *container["args"]]
    controller.env = {k: v for k, v in controller.env.items() if not k.startswith("GPUWM_")}
    controller.env.update(settings, POD_NAME="gpuwm-controller-tls-test", POD_NAMESPACE=RELEASE_NS)
    controller.start()
    return controller


def _listening(log: Path, starts: int) -> bool:
    return log.read_text().count("metrics API listening on https://") >= starts


def test_a_restart_serves_the_certificate_kept_in_the_secret(
    control_plane: ControlPlane, deployment: dict[str, Any], tmp_path: Path,
) -> None:
    plane = control_plane
    http = plane.admin()
    http.request("DELETE", SECRET_PATH)  # test_chart_rbac's controller may have made it: start from none
    wait_until("the Secret gone", lambda: http.request("GET", SECRET_PATH)[0] == 404)
    log = tmp_path / "controller.log"
    port = free_port()
    served: list[bytes] = []
    for start in (1, 2):
        controller = _start(plane, deployment, tmp_path, log, port)
        try:
            wait_until(f"the API on HTTPS (start {start})", functools.partial(_listening, log, start), log=log,
                       timeout=90)
            secret = http.get(SECRET_PATH)
            assert secret["type"] == "kubernetes.io/tls"
            ca_pem = base64.b64decode(secret["data"]["ca.crt"])
            served.append(_served_certificate(port, ca_pem, tmp_path))
            if start == 1:
                version = secret["metadata"]["resourceVersion"]
            else:
                assert secret["metadata"]["resourceVersion"] == version, "the restart rewrote the Secret"
        finally:
            controller.stop()
    assert served[0] == served[1], "the restart served another certificate"
    text = log.read_text()
    assert "made a CA and a certificate" in text and "serving the certificate kept in Secret" in text, text[-3000:]
    refused = [line for line in text.splitlines() if re.search(r"\b403\b|forbidden", line, re.IGNORECASE)]
    assert not refused, "the chart's RBAC refused the controller:\n" + "\n".join(refused[:20])

    # the ServiceAccount may touch that Secret and no other, and may not list any
    as_controller = plane.as_token(plane.token(RELEASE_NS, SA))
    assert as_controller.request("GET", SECRET_PATH)[0] == 200
    http.create(f"/api/v1/namespaces/{RELEASE_NS}/secrets", {"metadata": {"name": "someone-elses"},
                                                              "stringData": {"password": "x"}})
    for method, path in [
        ("GET", f"/api/v1/namespaces/{RELEASE_NS}/secrets"),
        ("GET", f"/api/v1/namespaces/{RELEASE_NS}/secrets?watch=true&timeoutSeconds=1"),
        ("GET", f"/api/v1/namespaces/{RELEASE_NS}/secrets/someone-elses"),
        ("GET", "/api/v1/namespaces/kube-system/secrets"),
        ("GET", "/api/v1/secrets"),
    ]:
        status, reply = as_controller.request(method, path)
        assert status == 403 and reply["reason"] == "Forbidden", (method, path, status, reply)
    status, _ = as_controller.request("PATCH", f"/api/v1/namespaces/{RELEASE_NS}/secrets/someone-elses",
                                      {"stringData": {"password": "y"}}, "application/merge-patch+json")
    assert status == 403
    http.request("DELETE", f"/api/v1/namespaces/{RELEASE_NS}/secrets/someone-elses")
