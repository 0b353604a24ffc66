"""The controller's login: the pod's service account read without the official client; the kubeconfig outside."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import kopf
import pytest

from gpuwm.controller.kube import login
from gpuwm.controller.kube.login import InClusterError, in_cluster_login, kube_login

ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def service_account(directory: Path, token: str = "token-1", namespace: str | None = "gpuwm",
                    ca: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token + "\n")
    if namespace is not None:
        (directory / "namespace").write_text(namespace)
    if ca:
        (directory / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return directory


def test_in_cluster_reads_the_service_account_as_the_official_client_does(tmp_path: Path) -> None:
    directory = service_account(tmp_path / "sa")
    info = in_cluster_login(environ=ENV, directory=directory)
    assert info is not None
    assert info.server == "https://10.96.0.1:443"
    assert info.token == "token-1"
    assert info.ca_path == str(directory / "ca.crt")
    assert info.default_namespace == "gpuwm"
    assert info.scheme is None and info.certificate_path is None


def test_a_rotated_token_is_read_at_the_next_login(tmp_path: Path) -> None:
    directory = service_account(tmp_path / "sa")
    first = in_cluster_login(environ=ENV, directory=directory)
    (directory / "token").write_text("token-2")
    second = in_cluster_login(environ=ENV, directory=directory)
    assert first is not None and second is not None
    assert (first.token, second.token) == ("token-1", "token-2")


def test_ipv6_service_host_is_bracketed(tmp_path: Path) -> None:
    info = in_cluster_login(environ={"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"},
                            directory=service_account(tmp_path / "sa", namespace=None, ca=False))
    assert info is not None
    assert info.server == "https://[fd00::1]:6443"
    assert info.ca_path is None and info.default_namespace is None


@pytest.mark.parametrize("environ", [{}, {"KUBERNETES_SERVICE_PORT": "443"}])
def test_outside_a_pod_there_is_no_in_cluster_login(tmp_path: Path, environ: dict[str, str]) -> None:
    assert in_cluster_login(environ=environ, directory=service_account(tmp_path / "sa")) is None
    assert in_cluster_login(environ=ENV, directory=tmp_path / "missing") is None


def test_an_unusable_service_account_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(InClusterError, match=r"token .* is empty"):
        in_cluster_login(environ=ENV, directory=service_account(tmp_path / "empty", token=""))
    with pytest.raises(InClusterError, match="KUBERNETES_SERVICE_PORT='https'"):
        in_cluster_login(environ={**ENV, "KUBERNETES_SERVICE_PORT": "https"},
                         directory=service_account(tmp_path / "sa"))


def test_kube_login_prefers_the_pod_and_falls_back_to_the_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, logger = kopf.OperatorSettings(), logging.getLogger("test")
    monkeypatch.setattr(login, "SERVICE_ACCOUNT_DIR", service_account(tmp_path / "sa"))
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    info = kube_login(settings, logger)
    assert info is not None and info.server == "https://10.96.0.1:443"


    # outside a pod: the official client reads the kubeconfig (in a fresh process: it reads $KUBECONFIG at import)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: emu\n"
        "clusters: [{name: emu, cluster: {server: 'http://127.0.0.1:6443'}}]\n"
        "users: [{name: emu, user: {token: kubeconfig-token}}]\n"
        "contexts: [{name: emu, context: {cluster: emu, user: emu, namespace: team-a}}]\n"
    )
    code = (
        "import logging, kopf\n"
        "from gpuwm.controller.kube.login import kube_login\n"
        "info = kube_login(kopf.OperatorSettings(), logging.getLogger('test'))\n"
        "print(info.server, info.token)\n"
    )
    environ = {name: value for name, value in os.environ.items() if not name.startswith("KUBERNETES_SERVICE")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**environ, "KUBECONFIG": str(kubeconfig)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["http://127.0.0.1:6443", "kubeconfig-token"]


def test_the_controller_process_does_not_load_the_official_client() -> None:
    """kopf, the handlers and the API import without `kubernetes`; the one login handler is gpuwm's."""
    code = (
        "import sys\n"
        "from gpuwm.controller.kopf_import import import_kopf_without_clients\n"
        "assert import_kopf_without_clients()\n"  # as `gpuwm controller` does first
        "import gpuwm.controller.handlers as handlers, gpuwm.api.app\n"
        "loaded = sorted(name for name in ('kubernetes', 'pykube') if name in sys.modules)\n"
        "assert not loaded, loaded\n"
        "import kopf\n"
        "logins = [h.fn for h in handlers.REGISTRY._activities.get_handlers(kopf._core.intents.causes.Activity.AUTHENTICATION)]\n"
        "assert logins == [handlers.login], logins\n"
        "import kubernetes.config\n"  # and still importable for the kubeconfig login
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
