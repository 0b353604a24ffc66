"""The exact RBAC rules the controller's code uses: no secrets, no wildcards.

The chart's ClusterRole must grant these (its test compares them); `python -m
gpuwm.controller.rbac` prints them as a ClusterRole YAML. Owner kinds beyond this list
can be added through chart values: where `get` is missing, the owner walk stops there
and the last owner reached is the workload.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from gpuwm.config import DEFAULT_WORKLOAD_KINDS
from gpuwm.controller.policy import BASE_RULES, WEBHOOK_SECRET_RULE, rules_for
from gpuwm.controller.watch import parse_workload_kinds

#: owner kinds the controller walks through (`get` only), by API group
OWNER_KINDS: dict[str, list[str]] = {
    "": ["replicationcontrollers"],
    "apps": ["replicasets", "deployments", "statefulsets", "daemonsets"],
    "batch": ["jobs", "cronjobs"],
    "jobset.x-k8s.io": ["jobsets"],
    "kubeflow.org": ["pytorchjobs", "tfjobs", "mpijobs", "notebooks"],
    "ray.io": ["rayjobs", "rayclusters", "rayservices"],
    "leaderworkerset.x-k8s.io": ["leaderworkersets"],
}


def workload_kind_rules(kinds: Iterable[str] = DEFAULT_WORKLOAD_KINDS) -> list[dict[str, Any]]:
    """get/list/watch on each watched workload kind (`workloadKinds`; the chart renders the same from its value)."""
    return [{"apiGroups": [kind.group], "resources": [kind.plural], "verbs": ["get", "list", "watch"]}
            for kind in parse_workload_kinds(kinds)]


REQUIRED_RULES: list[dict[str, Any]] = [
    # the GPU pods (kopf watch + agent discovery; the startup list ends pods deleted while down)
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    # project label and quota annotation; kopf's namespace observation
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    # time-slicing replicas: node labels nvidia.com/gpu.replicas and nvidia.com/device-plugin.config (watched)
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    # Idle events on workloads; kopf's warnings
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    # the CRs: created once, labels/spec merge-patched on adoption, deleted after retention
    {"apiGroups": ["gpuwm.io"], "resources": ["gpuworkloadmetrics"],
     "verbs": ["list", "create", "patch", "delete"]},
    # project CRs: adopted at start (list), deleted once the project has no workloads left
    {"apiGroups": ["gpuwm.io"], "resources": ["gpuprojectmetrics"], "verbs": ["list", "create", "patch", "delete"]},
    # status only through the status subresource
    {"apiGroups": ["gpuwm.io"], "resources": ["gpuworkloadmetrics/status", "gpuprojectmetrics/status"],
     "verbs": ["patch"]},
    # kopf: CRD observation and peering (HA with one active replica)
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
    {"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings", "kopfpeerings"],
     "verbs": ["get", "list", "watch", "patch"]},
    # the owner walk
    *({"apiGroups": [group], "resources": resources, "verbs": ["get"]} for group, resources in OWNER_KINDS.items()),
    # the workload objects themselves: queued and pending workloads, requested GPUs
    *workload_kind_rules(),
]


#: with --device-plugin-config NAMESPACE/NAME: `get` on that one ConfigMap, granted by a Role in its
#: namespace (the chart's devicePluginConfig), never cluster-wide: ConfigMaps may hold anything
DEVICE_PLUGIN_CONFIG_RULE: dict[str, Any] = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}


def idle_policy_rules(actions: Iterable[str]) -> list[dict[str, Any]]:
    """The ClusterRole rules for idle policies with these action types enabled (the chart renders the same,
    only with idlePolicies.enabled): reading the policies, writing their status, and each action's kinds and verbs."""
    return [rule.as_rbac() for rule in (*BASE_RULES, *rules_for(actions))]


#: with idlePolicies.webhooks: `get` on Secrets in the controller's own namespace (a Role), for the webhook URLs
IDLE_POLICY_WEBHOOK_RULE: dict[str, Any] = WEBHOOK_SECRET_RULE.as_rbac()


def cluster_role(name: str = "gpuwm-controller") -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
            "rules": REQUIRED_RULES}


if __name__ == "__main__":
    import yaml

    yaml.safe_dump(cluster_role(), sys.stdout, sort_keys=False)
