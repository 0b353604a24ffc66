"""Idle policies' rights: none without idlePolicies.enabled; with it, exactly what the enabled actions need."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpuwm.controller.rbac import IDLE_POLICY_WEBHOOK_RULE, REQUIRED_RULES, idle_policy_rules
from tests.chart.conftest import Installed

ACTING_VERBS = {"patch", "delete"}
ACTED_ON = {"deployments", "statefulsets", "jobs", "jobsets", "pytorchjobs", "notebooks", "rayclusters", "rayjobs",
            "workloads", "inferenceservices", "pods"}


def _acting(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rules that let the holder change or delete a workload kind (or its scale subresource)."""
    found = []
    for rule in rules:
        resources = {str(resource).split("/")[0] for resource in rule.get("resources") or []}
        if resources & ACTED_ON and ACTING_VERBS & set(rule.get("verbs") or []):
            found.append(rule)
    return found


def test_no_rights_to_act_unless_enabled(install: Callable[..., Installed]) -> None:
    installed = install()
    assert installed.ok, installed.error
    names = [role["metadata"]["name"] for role in installed.objects("ClusterRole")]
    assert not [name for name in names if name.endswith("-idle-policies")]
    assert not [role for role in installed.objects("Role") if role["metadata"]["name"].endswith("-webhooks")]
    for role in installed.objects("ClusterRole"):
        assert not _acting(role["rules"]), f"{role['metadata']['name']} may act on workloads"
    assert not _acting(REQUIRED_RULES)


@pytest.mark.parametrize("actions", [["warn"], ["warn", "scaleToZero", "suspend"], ["warn", "scaleToZero", "suspend",
                                                                                   "delete"], ["suspend"]])
def test_enabled_renders_the_rules_of_the_enabled_actions(install: Callable[..., Installed],
                                                          actions: list[str]) -> None:
    installed = install(values={"idlePolicies": {"enabled": True, "actions": actions}})
    assert installed.ok, installed.error
    role = installed.one("ClusterRole", "-idle-policies")
    assert role["rules"] == idle_policy_rules(actions)
    verbs = {verb for rule in role["rules"] for verb in rule["verbs"]}
    assert ("delete" in verbs) == ("delete" in actions)
    assert bool(_acting(role["rules"])) == (set(actions) != {"warn"})
    binding = installed.one("ClusterRoleBinding", "-idle-policies")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    service_account = installed.one("ServiceAccount", "-controller")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": service_account["name"],
                                    "namespace": service_account["namespace"]}]


def test_webhook_secrets_are_read_in_the_release_namespace_only(install: Callable[..., Installed]) -> None:
    installed = install(values={"idlePolicies": {"enabled": True, "webhooks": True}})
    assert installed.ok, installed.error
    role = installed.one("Role", "-idle-policy-webhooks")
    assert role["metadata"]["namespace"] == installed.one("ServiceAccount", "-controller")["metadata"]["namespace"]
    assert role["rules"] == [IDLE_POLICY_WEBHOOK_RULE]
    for cluster_role in installed.objects("ClusterRole"):
        assert not [rule for rule in cluster_role["rules"] if "secrets" in rule.get("resources", [])]
