"""The controller's ClusterRole reads exactly the workload kinds `workloadKinds` names: get, list and
watch on each, rendered from the value; the same rules as gpuwm.controller.rbac.workload_kind_rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuwm.config import DEFAULT_WORKLOAD_KINDS
from gpuwm.controller.rbac import workload_kind_rules
from tests.chart.conftest import Installed
from tests.chart.test_security import missing_grants


def _rules(installed: Installed) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = installed.one("ClusterRole", "-controller")["rules"]
    return rules


def test_every_default_kind_is_readable(install: Callable[..., Installed]) -> None:
    installed = install()
    assert installed.ok, installed.error
    assert not missing_grants(workload_kind_rules(DEFAULT_WORKLOAD_KINDS), _rules(installed))


def test_the_rules_follow_the_value(install: Callable[..., Installed]) -> None:
    kinds = ["example.com/v1/GpuNotebook", "ray.io/RayService", "policy.example/Policy"]
    installed = install(values={"workloadKinds": kinds})
    assert installed.ok, installed.error
    rules = _rules(installed)
    assert not missing_grants(workload_kind_rules(kinds), rules)
    assert {"apiGroups": ["policy.example"], "resources": ["policies"], "verbs": ["get", "list", "watch"]} in rules
    # kinds no longer named lose their list/watch (the owner walk keeps its `get` on the known owner kinds)
    assert missing_grants(workload_kind_rules(["kueue.x-k8s.io/Workload", "serving.kserve.io/InferenceService"]),
                          rules) == ["get kueue.x-k8s.io/workloads", "list kueue.x-k8s.io/workloads",
                                     "watch kueue.x-k8s.io/workloads", "get serving.kserve.io/inferenceservices",
                                     "list serving.kserve.io/inferenceservices",
                                     "watch serving.kserve.io/inferenceservices"]


def test_a_misspelt_kind_is_refused_by_the_schema(install: Callable[..., Installed]) -> None:
    installed = install(values={"workloadKinds": ["pytorchjobs"]})
    assert not installed.ok and "workloadKinds" in str(installed.error)
