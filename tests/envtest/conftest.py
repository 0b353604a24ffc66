"""Fixtures of the envtest tier: one real control plane for the session, the CRDs applied to it.

Found through KUBEBUILDER_ASSETS (+ ETCD_BIN or etcd on PATH) as controller-runtime's envtest finds
it; skipped with the reason where it is missing, except under CI (CI=true), where .ci/run provides
it and a missing one fails every test of the tier instead of skipping it silently.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.envtest.controlplane import Assets, ControlPlane, find_assets

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
PEERING_CRDS = ROOT / "charts" / "gpuwm" / "crds" / "kopf.dev_peerings.yaml"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


@pytest.fixture(scope="session")
def envtest_assets() -> Assets:
    found = find_assets()
    if isinstance(found, str):
        if in_ci():
            pytest.fail(f"the envtest tier must run under CI, but {found}; .ci/run provides it from ../shared/envtest",
                        pytrace=False)
        pytest.skip(found)
    return found


@pytest.fixture(scope="session")
def control_plane(envtest_assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(envtest_assets, tmp_path_factory.mktemp("envtest")).start()
    try:
        yield plane
    finally:
        plane.stop()


def established(plane: ControlPlane, name: str) -> bool:
    status, crd = plane.admin().request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    return status == 200 and any(c["type"] == "Established" and c["status"] == "True"
                                 for c in (crd.get("status") or {}).get("conditions") or [])


@pytest.fixture(scope="session")
def crds(control_plane: ControlPlane) -> list[str]:
    """The repository's CRDs (and kopf's peering CRDs, which the chart installs), applied server-side and
    Established; their names."""
    applied = control_plane.kubectl("apply", "--server-side", "--field-manager=envtest", "-f", str(CRDS),
                                    "-f", str(PEERING_CRDS), "-o", "name").stdout.split()
    names = [line.split("/", 1)[1] for line in applied]
    deadline = time.monotonic() + 60
    while not all(established(control_plane, name) for name in names):
        assert time.monotonic() < deadline, f"CRDs not Established within 60 s: {names}"
        time.sleep(0.3)
    return names


def make_namespace(plane: ControlPlane, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A namespace, once kube-controller-manager has given it its `default` ServiceAccount (pods need it)."""
    http = plane.admin()
    created: dict[str, Any] = http.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": labels or {}}})
    deadline = time.monotonic() + 30
    while http.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] != 200:
        assert time.monotonic() < deadline, f"namespace {name} got no default ServiceAccount in 30 s"
        time.sleep(0.2)
    return created
