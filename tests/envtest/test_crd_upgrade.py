"""docs/install.md's CRD upgrade and RBAC examples, done on a real kube-apiserver so the doc stays true.

Helm creates the chart's `crds/` on the first install (client-side, under its own field manager) and
never touches them again. Applying newer CRDs server-side over those is refused: the new `.spec.versions`
differs from the value Helm's manager owns, a conflict that only `--force-conflicts` resolves. Each test
starts from CRDs of the previous release made the way Helm makes them, runs the plain command (refused,
nothing changed) and then the command the doc's Upgrade section gives (accepted, the new schema served).
The control plane is this module's own: the session's has the CRDs applied by the `crds` fixture already.
"""

from __future__ import annotations

import copy
import shlex
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.conftest import CHART, helm_python, run_helm  # noqa: F401 - helm_python is a fixture
from tests.chart.test_docs import DOCS, section, yaml_blocks
from tests.envtest.conftest import CRDS, established
from tests.envtest.controlplane import Assets, ControlPlane

pytestmark = pytest.mark.envtest

GWM_CRD = "gpuworkloadmetrics.gpuwm.io"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.fixture(scope="module")
def plane(envtest_assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    control_plane = ControlPlane(envtest_assets, tmp_path_factory.mktemp("crd-upgrade")).start()
    try:
        yield control_plane
    finally:
        control_plane.stop()


def previous_release(crd: dict[str, Any]) -> dict[str, Any]:
    """The GPUWorkloadMetrics CRD as the release before dc39a81 shipped it: no status.idleSince, and the Idle
    printer column reading idleSeconds. Any change of `.spec.versions` conflicts alike; this is a real one."""
    old = copy.deepcopy(crd)
    version = old["spec"]["versions"][0]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert "idleSince" in status, "the CRD has no status.idleSince any more: pick another field that changed"
    del status["idleSince"]
    idle = next(column for column in version["additionalPrinterColumns"] if column["name"] == "Idle")
    idle.update(type="number", jsonPath=".status.idleSeconds", description="Seconds since the GPUs were last active.")
    return old


def write_previous_crds(folder: Path) -> Path:
    """crds/ as the previous release had it, in `folder` (the other files unchanged)."""
    folder.mkdir(parents=True, exist_ok=True)
    for source in sorted(CRDS.glob("*.yaml")):
        shutil.copy(source, folder / source.name)
    gwm = folder / f"gpuwm.io_{GWM_CRD.split('.')[0]}.yaml"
    gwm.write_text(yaml.safe_dump(previous_release(yaml.safe_load(gwm.read_text())), sort_keys=False))
    return folder


def served_gwm(plane: ControlPlane) -> dict[str, Any]:
    crd: dict[str, Any] = plane.admin().get(f"{CRD_PATH}/{GWM_CRD}")
    return crd


def has_idle_since(crd: dict[str, Any]) -> bool:
    version = crd["spec"]["versions"][0]
    return "idleSince" in version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]


def documented_upgrade_command() -> list[str]:
    """The `kubectl apply` line of the doc's Upgrade section, its chart path pointed at this checkout."""
    lines = [line.split("#", 1)[0].strip() for line in section(DOCS, "## Upgrade").splitlines()]
    found = [line for line in lines if line.startswith("kubectl apply")]
    assert len(found) == 1, f"docs/install.md's Upgrade section should give one kubectl apply line, has {found}"
    words = shlex.split(found[0])[1:]
    return [str(CHART / "crds") if word.rstrip("/") == "charts/gpuwm/crds" else word for word in words]


def delete_crds(plane: ControlPlane) -> None:
    plane.kubectl("delete", "--ignore-not-found", "--wait=true", "-f", str(CRDS), timeout=120)


def wait_established(plane: ControlPlane, names: list[str]) -> None:
    deadline = time.monotonic() + 60
    while not all(established(plane, name) for name in names):
        assert time.monotonic() < deadline, f"CRDs not Established within 60 s: {names}"
        time.sleep(0.3)


def helm_cli_create(plane: ControlPlane, folder: Path, request: pytest.FixtureRequest) -> str:
    """What the `helm` binary does with a chart's crds/ on install: a plain create under field manager `helm`."""
    plane.kubectl("create", "--field-manager=helm", "-f", str(folder))
    return "helm"


def helm_library_install(plane: ControlPlane, folder: Path, request: pytest.FixtureRequest) -> str:
    """`helm install` itself (Helm's library, client-side as the default install is), of the chart with the
    previous release's CRDs; its field manager is named after the process (`python` here, `helm` for the CLI)."""
    python: str = request.getfixturevalue("helm_python")
    chart = folder.parent / "chart"
    shutil.copytree(CHART, chart)
    shutil.rmtree(chart / "crds")
    shutil.copytree(folder, chart / "crds")
    plane.admin().create("/api/v1/namespaces", {"metadata": {"name": "gpuwm"}})
    install = ("install", str(chart), "--kubeconfig", str(plane.admin_kubeconfig), "--namespace", "gpuwm",
               "--release", "gpuwm")
    answer = run_helm(python, *install)
    if not answer["ok"] and "ensure CRDs are installed first" in str(answer.get("error")):
        # Helm created the chart's CRDs, then built the release's objects before discovery served their kinds (the
        # ClusterKopfPeering's group, on a loaded machine): it stored no release and the CRDs stay, so once they
        # are Established the same install goes on from there, as a user's second `helm install` would
        wait_established(plane, [line.split("/", 1)[1] for line in
                                 plane.kubectl("get", "-f", str(folder), "-o", "name").stdout.split()])
        answer = run_helm(python, *install)
    assert answer["ok"], f"helm install into the real API server failed: {answer.get('error')}"
    managers = [entry["manager"] for entry in served_gwm(plane)["metadata"]["managedFields"]
                if entry["operation"] == "Update" and entry["manager"] != "kube-apiserver"]
    assert len(managers) == 1, f"expected Helm's field manager alone beside the API server's, got {managers}"
    return str(managers[0])


# Helm's own install first, on a plane where these CRDs never existed: Helm then creates them and at once the
# chart's peering object, which a just-deleted CRD's group could still fail to map.
@pytest.mark.parametrize("make", [helm_library_install, helm_cli_create], ids=["helm-library", "helm-cli-create"])
def test_crds_helm_made_upgrade_only_with_force_conflicts(plane: ControlPlane, tmp_path: Path,
                                                          request: pytest.FixtureRequest, make: Any) -> None:
    try:
        manager = make(plane, write_previous_crds(tmp_path / "crds"), request)
        names = [line.split("/", 1)[1] for line in plane.kubectl("get", "-f", str(CRDS), "-o", "name").stdout.split()]
        wait_established(plane, names)
        assert not has_idle_since(served_gwm(plane))

        plain = plane.kubectl("apply", "--server-side", "-f", str(CHART / "crds"), check=False)
        assert plain.returncode == 1, plain.stdout + plain.stderr
        assert f'conflict with "{manager}"' in plain.stderr and ".spec.versions" in plain.stderr, plain.stderr
        assert "--force-conflicts" in plain.stderr, plain.stderr
        unchanged = [name for name in names if name != GWM_CRD]
        assert all(f"{name} serverside-applied" in plain.stdout for name in unchanged), plain.stdout
        assert not has_idle_since(served_gwm(plane)), "a refused apply must leave the old schema served"

        documented = plane.kubectl(*documented_upgrade_command())
        assert f"{GWM_CRD} serverside-applied" in documented.stdout, documented.stdout
        crd = served_gwm(plane)
        assert has_idle_since(crd)
        idle = next(c for c in crd["spec"]["versions"][0]["additionalPrinterColumns"] if c["name"] == "Idle")
        assert idle["jsonPath"] == ".status.idleSince"
        assert any(e["manager"] == "kubectl" and e["operation"] == "Apply" for e in crd["metadata"]["managedFields"])

        # the new field is served: a status written with it keeps it (an old schema would prune it)
        http = plane.admin()
        http.request("POST", "/api/v1/namespaces", {"metadata": {"name": "upgraded"}})
        gwm = "/apis/gpuwm.io/v1alpha1/namespaces/upgraded/gpuworkloadmetrics"
        spec = {"project": "p", "workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u"}}
        deadline = time.monotonic() + 30
        while (answer := http.request("POST", gwm, {"apiVersion": "gpuwm.io/v1alpha1", "kind": "GPUWorkloadMetrics",
                                                    "metadata": {"name": "j"}, "spec": spec}))[0] != 201:
            assert time.monotonic() < deadline, f"GPUWorkloadMetrics not creatable after the upgrade: {answer}"
            time.sleep(0.3)
        written = http.merge(f"{gwm}/j/status", {"status": {"idleSince": "2026-11-27T10:00:00Z"}})
        assert written["status"].get("idleSince") == "2026-11-27T10:00:00Z", written["status"]

        # kubectl owns .spec.versions now: the next release's CRDs apply without forcing
        again = plane.kubectl("apply", "--server-side", "-f", str(CHART / "crds"), check=False)
        assert again.returncode == 0, again.stderr
    finally:
        delete_crds(plane)


def test_docs_reader_roles_apply_and_grant_what_they_say(plane: ControlPlane) -> None:
    """The doc's user-facing reader Role (one namespace) and the chart's metrics-reader ClusterRole, as the
    doc prints them, apply on the server and grant exactly what the doc says."""
    rbac = [obj for obj in yaml_blocks(DOCS) if obj.get("apiVersion", "").startswith("rbac.authorization.k8s.io/")
            or obj.get("kind") == "ServiceAccount"]
    kinds = sorted({obj["kind"] for obj in rbac})
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"], kinds
    for namespace in sorted({obj["metadata"]["namespace"] for obj in rbac if "namespace" in obj["metadata"]}):
        plane.kubectl("create", "namespace", namespace, check=False)
    plane.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(rbac))

    def can(user: str, verb: str, what: str, namespace: str | None = None) -> bool:
        """A SubjectAccessReview, as gpuwm's API asks (kubectl auth can-i would need the CRDs served)."""
        attributes: dict[str, Any] = ({"nonResourceAttributes": {"verb": verb, "path": what}} if what.startswith("/")
                                      else {"resourceAttributes": {"verb": verb, "group": "gpuwm.io", "resource": what,
                                                                   "namespace": namespace}})
        review = plane.admin().create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {"user": user, **attributes}})
        return bool(review["status"].get("allowed"))

    reader = "system:serviceaccount:team-a:metrics-reader"
    assert can(reader, "get", "gpuworkloadmetrics", "team-a")
    assert can(reader, "list", "gpuworkloadmetrics", "team-a")
    assert not can(reader, "get", "gpuworkloadmetrics", "team-b")
    assert not can(reader, "update", "gpuworkloadmetrics", "team-a")
    assert not can(reader, "get", "/metrics")
    prometheus = "system:serviceaccount:monitoring:prometheus"
    assert can(prometheus, "get", "/metrics")
    assert not can(prometheus, "get", "gpuworkloadmetrics", "team-a")
