"""With devicePluginConfig the controller may read that one ConfigMap, in its namespace only."""

from __future__ import annotations

from collections.abc import Callable

from gpuwm.controller.rbac import DEVICE_PLUGIN_CONFIG_RULE, REQUIRED_RULES
from tests.chart.conftest import Installed


def test_no_configmap_access_without_the_value(install: Callable[..., Installed]) -> None:
    installed = install()
    assert installed.ok, installed.error
    assert not [role for role in installed.objects("Role") if role["metadata"]["name"].endswith("-device-plugin-config")]
    cluster_rules = installed.one("ClusterRole", "-controller")["rules"]
    assert not [rule for rule in cluster_rules if "configmaps" in rule["resources"]]  # never cluster-wide
    assert DEVICE_PLUGIN_CONFIG_RULE not in REQUIRED_RULES


def test_the_value_grants_get_on_that_configmap(install: Callable[..., Installed]) -> None:
    installed = install(values={"devicePluginConfig": "gpu-operator/time-slicing-config/any"})
    assert installed.ok, installed.error
    role = installed.one("Role", "-device-plugin-config")
    assert role["metadata"]["namespace"] == "gpu-operator"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": ["time-slicing-config"], "verbs": ["get"]}]
    binding = installed.one("RoleBinding", "-device-plugin-config")
    assert binding["metadata"]["namespace"] == "gpu-operator"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    service_account = installed.one("ServiceAccount", "-controller")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": service_account["name"],
                                    "namespace": service_account["namespace"]}]
    nodes = [rule for rule in installed.one("ClusterRole", "-controller")["rules"] if "nodes" in rule["resources"]]
    assert nodes and set(nodes[0]["verbs"]) == {"get", "list", "watch"}  # the node labels are watched
