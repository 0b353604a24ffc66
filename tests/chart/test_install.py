"""The chart linted by Helm's library and installed into an API server that validates every object."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.conftest import CHART, CI_VALUES, ROOT, Installed, containers, env_of, run_helm

# Helm's lint severities (pkg/lint/support): 1 info, 2 warning, 3 error.
LINT_WARNING = 2


def _lint(helm_python: str, *values_files: Path) -> dict[str, Any]:
    answer = run_helm(helm_python, "lint", str(CHART), *(str(path) for path in values_files))
    assert answer["ok"], answer.get("error")
    result: dict[str, Any] = answer["result"]
    return result


def test_ci_values_files_exist() -> None:
    names = {path.name for path in CI_VALUES}
    assert "all-features-values.yaml" in names, names


def test_lint_default_values_has_no_warnings(helm_python: str) -> None:
    result = _lint(helm_python)
    assert result["TotalChartsLinted"] == 1
    bad = [message for message in result["Messages"] if message["Severity"] >= LINT_WARNING]
    assert not bad, f"helm lint reports problems in {[m['Path'] for m in bad]}"


@pytest.mark.parametrize("values_file", CI_VALUES, ids=lambda path: path.name)
def test_lint_ci_values_has_no_warnings(helm_python: str, values_file: Path) -> None:
    result = _lint(helm_python, values_file)
    bad = [message for message in result["Messages"] if message["Severity"] >= LINT_WARNING]
    assert not bad, f"helm lint -f {values_file.name} reports problems in {[m['Path'] for m in bad]}"


def test_lint_catches_a_broken_template(helm_python: str, tmp_path: Path) -> None:
    """The lint check can fail: a template calling a missing value is an error."""
    chart = tmp_path / "gpuwm"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "broken.yaml").write_text("{{ .Values.doesNotExist.deeper }}\n")
    result = run_helm(helm_python, "lint", str(chart))["result"]
    assert any(m["Severity"] > LINT_WARNING and m["Path"].startswith("templates") for m in result["Messages"])


def test_install_default_values(install: Callable[..., Installed]) -> None:
    installed = install()
    assert installed.ok, installed.error
    crds = {obj["metadata"]["name"] for obj in installed.objects("CustomResourceDefinition")}
    assert {"gpuworkloadmetrics.gpuwm.io", "gpuprojectmetrics.gpuwm.io", "clusterkopfpeerings.kopf.dev"} <= crds
    deployment = installed.one("Deployment", "-controller")
    assert deployment["spec"]["replicas"] == 2
    controller = containers(deployment)["controller"]
    assert controller["args"][0] == "controller"
    ports = {port["name"]: port["containerPort"] for port in controller["ports"]}
    assert ports == {"http": 8080}
    # the API's /healthz, served in the operator's loop: kopf serves its own liveness endpoint only once a
    # replica leads, and a standby waits in kopf's startup
    assert controller["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http", "scheme": "HTTPS"}
    # the API speaks HTTPS by default (apiTls)
    assert controller["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http", "scheme": "HTTPS"}
    # the API's Service routes to the leading replica only: the one whose store is being written
    service = installed.one("Service", "-controller")
    assert service["spec"]["selector"]["gpuwm.io/leader"] == "true"
    assert "GPUWM_PEERING_PRIORITY" not in env_of(controller)  # each replica derives its own
    daemonset = installed.one("DaemonSet", "-agent")
    assert containers(daemonset)["agent"]["args"][0] == "agent"
    peering = installed.one("ClusterKopfPeering")
    assert peering["metadata"]["name"] == "gpuwm"
    assert installed.one("PodDisruptionBudget")["spec"]["minAvailable"] == 1
    kinds = {obj["kind"] for obj in installed.chart_objects()}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"}, kinds
    assert "NetworkPolicy" in kinds  # on by default


def test_install_every_optional_feature(install: Callable[..., Installed]) -> None:
    installed = install(ROOT / ".ci" / "all-features-values.yaml")
    assert installed.ok, installed.error
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap", "PodDisruptionBudget"):
        assert installed.objects(kind), f"no {kind} rendered with every feature on"
    assert len(installed.objects("NetworkPolicy")) == 2
    dashboard = installed.one("ConfigMap", "-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["gpuwm.json"])["uid"] == "gpuwm-overview"
    rule = installed.one("PrometheusRule")
    idle = next(r for r in rule["spec"]["groups"][0]["rules"] if r["alert"] == "GpuwmWorkloadGpuIdle")
    assert "gpuwm_workload_idle_seconds) > 2700" in idle["expr"], idle["expr"]  # 45 minutes
    agent_spec = installed.one("DaemonSet")["spec"]["template"]["spec"]
    assert agent_spec["runtimeClassName"] == "nvidia"
    mounts = {m["name"]: m for m in containers(installed.one("DaemonSet"))["agent"]["volumeMounts"]}
    assert mounts["host-proc"] == {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True}
    assert env_of(containers(installed.one("DaemonSet"))["agent"])["GPUWM_PROC_ROOT"]["value"] == "/host/proc"
    role = installed.one("ClusterRole", "-controller")
    assert {"apiGroups": ["example.com"], "resources": ["trainingruns"], "verbs": ["get"]} in role["rules"]
    assert installed.one("Deployment")["metadata"]["labels"]["team"] == "ml-platform"


def test_install_namespaced(install: Callable[..., Installed]) -> None:
    installed = install(ROOT / ".ci" / "namespaced-values.yaml")
    assert installed.ok, installed.error
    peering = installed.one("KopfPeering")
    assert peering["metadata"]["namespace"] == "team-a"
    assert not installed.objects("DaemonSet")
    volumes = {v["name"]: v for v in installed.one("Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == "gpuwm-data"
    env = env_of(containers(installed.one("Deployment"))["controller"])
    assert env["GPUWM_NAMESPACE"]["value"] == "team-a"
    assert env["GPUWM_AUTH"]["value"] == "none"


def test_standalone_runs_one_replica_without_peering(install: Callable[..., Installed]) -> None:
    installed = install(values={"standalone": True})
    assert installed.ok, installed.error
    assert installed.one("Deployment")["spec"]["replicas"] == 1
    assert not installed.objects("ClusterKopfPeering")
    assert not installed.objects("PodDisruptionBudget")


def test_image_tag_defaults_to_app_version(install: Callable[..., Installed]) -> None:
    installed = install()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for kind in ("Deployment", "DaemonSet"):
        for container in containers(installed.one(kind)).values():
            assert container["image"] == f"ghcr.io/gpuwm/gpuwm:{chart['appVersion']}"


def test_app_version_is_the_package_version() -> None:
    import tomllib

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"], "bump charts/gpuwm/Chart.yaml appVersion with pyproject.toml"


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"idleThresholdPercent": 150}, "idleThresholdPercent"),
        ({"idleThreshold": 5}, "idleThreshold"),
        ({"logLevel": "loud"}, "logLevel"),
        ({"interval": "fast"}, "interval"),
        ({"controller": {"replicas": 0}}, "replicas"),
        ({"agent": {"privileged": True}}, "privileged"),
    ],
)
def test_values_schema_rejects_bad_values_naming_them(
    install: Callable[..., Installed], values: dict[str, Any], named: str
) -> None:
    installed = install(values=values)
    assert not installed.ok, f"{values} was accepted"
    assert "values don't meet the specifications of the schema" in installed.error
    assert named in installed.error, installed.error
    assert not installed.objects("Deployment"), "nothing is created when the values are invalid"


def test_api_server_rejects_an_invalid_object(install: Callable[..., Installed], tmp_path: Path) -> None:
    """Server-side validation is real: a misspelt field in a template fails the install, naming it."""
    chart = tmp_path / "gpuwm"
    shutil.copytree(CHART, chart)
    template = chart / "templates" / "controller-service.yaml"
    template.write_text(template.read_text().replace("targetPort: http", "targetPortt: http"))
    installed = install(chart=chart)
    assert not installed.ok
    assert "targetPortt" in installed.error and "Service" in installed.error, installed.error


def _exported_metric_names() -> set[str]:
    """The series the controller's /metrics exports (counters also as NAME_total)."""
    from gpuwm.api.prom_metrics import WorkloadMetricsCollector

    class EmptyStore:
        def workloads(self) -> list[Any]:
            return []

        def projects(self) -> list[Any]:
            return []

    names = {family.name for family in WorkloadMetricsCollector(EmptyStore(), runai_compatible=False).collect()}  # type: ignore[arg-type]
    return names | {f"{name}_total" for name in names}


def test_alerts_and_dashboard_use_series_the_controller_exports(install: Callable[..., Installed]) -> None:
    import re

    installed = install(ROOT / ".ci" / "all-features-values.yaml")
    exprs = [rule["expr"] for rule in installed.one("PrometheusRule")["spec"]["groups"][0]["rules"]]
    dashboard = json.loads(installed.one("ConfigMap", "-dashboard")["data"]["gpuwm.json"])
    exprs += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exprs += [variable["query"] for variable in dashboard["templating"]["list"] if variable["type"] == "query"]
    used = {name for expr in exprs for name in re.findall(r"\bgpuwm_[a-z0-9_]+", expr)}
    assert used, exprs
    unknown = used - _exported_metric_names()
    assert not unknown, f"series not exported by gpuwm.api.prom_metrics: {sorted(unknown)}"


def test_notes_tell_what_to_run_next(install: Callable[..., Installed]) -> None:
    installed = install()
    notes = installed.release["info"]["notes"]
    assert "kubectl get gpuworkloadmetrics -A" in notes
    assert "https://gpuwm-controller.gpuwm.svc:8080/api/v1/workloads" in notes  # HTTPS by default (apiTls)
    assert "--audience gpuwm" in notes  # a token for the API's audience, or a 401
    assert "kubectl apply --server-side --force-conflicts" in notes  # over Helm-made CRDs, or a conflict
