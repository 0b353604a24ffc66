"""Fixtures for the chart tests: Helm's library in its own venv, and an API server to install into.

helm-sdkpy needs Python >= 3.12 and the project targets 3.11, so Helm runs in `.venv-helm`
(made by .ci/run, else here on first use: `python3.12 -m venv` and `pip install -r
.ci/helm-requirements.txt`; or taken from $GPUWM_HELM_PYTHON) and is driven through tests/chart/helm_driver.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.apiserver import ApiServer

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpuwm"
CI_VALUES = sorted((ROOT / ".ci").glob("*-values.yaml"))
DRIVER = Path(__file__).parent / "helm_driver.py"
MONITORING_CRDS = Path(__file__).parent / "fixtures" / "monitoring.coreos.com-subset.yaml"
CERT_MANAGER_CRDS = Path(__file__).parent / "fixtures" / "cert-manager.io-subset.yaml"
HELM_VENV = ROOT / ".venv-helm"
RELEASE_NAMESPACE = "gpuwm"


def _python312() -> list[str] | None:
    """A command that runs Python >= 3.12, or None."""
    for candidate in ("python3.13", "python3.12"):
        path = shutil.which(candidate)
        if path is None:
            continue
        env = {**os.environ, "PYENV_VERSION": os.environ.get("PYENV_VERSION", "3.12.1")}
        probe = subprocess.run(
            [path, "-c", "import sys; print(sys.version_info >= (3, 12))"], capture_output=True, text=True, env=env
        )
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return [path]
    return None


def find_helm_python() -> str | None:
    """The Python of a venv that has helm-sdkpy, built on first use; None without a Python >= 3.12."""
    given = os.environ.get("GPUWM_HELM_PYTHON")
    if given:
        return given
    python = HELM_VENV / "bin" / "python"
    if python.exists():
        check = subprocess.run([str(python), "-c", "import helm_sdkpy, yaml"], capture_output=True)
        if check.returncode == 0:
            return str(python)
    interpreter = _python312()
    if interpreter is None:
        return None
    env = {**os.environ, "PYENV_VERSION": os.environ.get("PYENV_VERSION", "3.12.1")}
    subprocess.run([*interpreter, "-m", "venv", "--clear", str(HELM_VENV)], check=True, env=env)
    requirements = ROOT / ".ci" / "helm-requirements.txt"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-r", str(requirements)], check=True, timeout=600)
    return str(python)


@pytest.fixture(scope="session")
def helm_python() -> str:
    """The Python of a venv that has helm-sdkpy; built on first use."""
    found = find_helm_python()
    if found is None:
        pytest.skip("helm-sdkpy needs Python >= 3.12 and no python3.12/python3.13 is on PATH")
    return found


def run_helm(helm_python: str, *arguments: str) -> dict[str, Any]:
    """Run helm_driver.py; Helm keeps releases in memory (HELM_DRIVER=memory), not in Secrets."""
    env = {**os.environ, "HELM_DRIVER": "memory", "HOME": os.environ.get("HOME", "/tmp")}
    done = subprocess.run(
        [helm_python, str(DRIVER), *arguments], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, f"helm_driver.py {arguments[0]} crashed:\n{done.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@dataclass
class Installed:
    """A release installed into the test API server: Helm's answer and the objects it stored."""

    ok: bool
    error: str
    server: ApiServer
    release: dict[str, Any]

    def objects(self, kind: str) -> list[dict[str, Any]]:
        return list(self.server.store.objects_of(kind))

    def one(self, kind: str, name_suffix: str = "") -> dict[str, Any]:
        found = [obj for obj in self.objects(kind) if obj["metadata"]["name"].endswith(name_suffix)]
        assert len(found) == 1, f"expected one {kind} named *{name_suffix}, got {[o['metadata']['name'] for o in found]}"
        return found[0]

    def chart_objects(self) -> list[dict[str, Any]]:
        """Everything Helm created (CRDs from crds/ and the rendered templates)."""
        return [
            obj
            for obj in self.server.store.objects.values()
            if obj["kind"] == "CustomResourceDefinition"
            or (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "Helm"
        ]


@pytest.fixture
def api_server() -> Iterator[ApiServer]:
    server = ApiServer()
    server.start()
    store = server.store
    store.objects[("v1", "namespaces", "", RELEASE_NAMESPACE)] = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": RELEASE_NAMESPACE},
    }
    for crd in [*yaml.safe_load_all(MONITORING_CRDS.read_text()), *yaml.safe_load_all(CERT_MANAGER_CRDS.read_text())]:
        store.served_crd(crd)
        store.objects[("apiextensions.k8s.io/v1", "customresourcedefinitions", "", crd["metadata"]["name"])] = crd
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def install(
    helm_python: str, api_server: ApiServer, tmp_path: Path
) -> Callable[..., Installed]:
    """Install the chart (or a copy) with values files and/or inline values."""

    def _install(*values_files: Path, values: dict[str, Any] | None = None, chart: Path = CHART) -> Installed:
        files = [str(path) for path in values_files]
        if values is not None:
            inline = tmp_path / f"inline-{len(list(tmp_path.iterdir()))}.yaml"
            inline.write_text(yaml.safe_dump(values))
            files.append(str(inline))
        kubeconfig = tmp_path / "kubeconfig.yaml"
        kubeconfig.write_text(api_server.kubeconfig(RELEASE_NAMESPACE))
        answer = run_helm(
            helm_python, "install", str(chart), *files,
            "--kubeconfig", str(kubeconfig), "--namespace", RELEASE_NAMESPACE, "--release", "gpuwm",
        )
        return Installed(ok=answer["ok"], error=answer.get("error", ""), server=api_server,
                         release=answer.get("result") or {})

    return _install


def containers(pod_owner: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod_owner["spec"]["template"]["spec"]["containers"]}


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in container.get("env", [])}
