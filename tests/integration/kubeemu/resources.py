"""The emulator's resource types: built-in kinds plus CRDs (from crds/ or POSTed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: list[str] = field(default_factory=list)
    status_subresource: bool = False
    schema: dict[str, Any] | None = None
    verbs: list[str] = field(default_factory=lambda: ["create", "delete", "get", "list", "patch", "update", "watch"])

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def discovery(self) -> list[dict[str, Any]]:
        verbs = self.verbs
        entries = [{
            "name": self.plural, "singularName": self.singular or self.kind.lower(), "namespaced": self.namespaced,
            "kind": self.kind, "verbs": verbs, **({"shortNames": self.short_names} if self.short_names else {}),
        }]
        if self.status_subresource:
            entries.append({"name": f"{self.plural}/status", "singularName": "", "namespaced": self.namespaced,
                            "kind": self.kind, "verbs": ["get", "patch", "update"]})
        return entries


BUILTIN: list[ResourceType] = [
    ResourceType("", "v1", "namespaces", "Namespace", False, status_subresource=True),
    ResourceType("", "v1", "pods", "Pod", True, status_subresource=True),
    ResourceType("", "v1", "nodes", "Node", False, status_subresource=True),
    ResourceType("", "v1", "events", "Event", True),
    ResourceType("", "v1", "configmaps", "ConfigMap", True),
    ResourceType("", "v1", "replicationcontrollers", "ReplicationController", True, status_subresource=True),
    ResourceType("apps", "v1", "replicasets", "ReplicaSet", True, status_subresource=True),
    ResourceType("apps", "v1", "deployments", "Deployment", True, status_subresource=True),
    ResourceType("apps", "v1", "statefulsets", "StatefulSet", True, status_subresource=True),
    ResourceType("apps", "v1", "daemonsets", "DaemonSet", True, status_subresource=True),
    ResourceType("batch", "v1", "jobs", "Job", True, status_subresource=True),
    ResourceType("batch", "v1", "cronjobs", "CronJob", True, status_subresource=True),
    ResourceType("events.k8s.io", "v1", "events", "Event", True),
    ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
                 status_subresource=True),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True),
    # create-only: answered by reviews.py, never stored
    ResourceType("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False, verbs=["create"]),
    ResourceType("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False, verbs=["create"]),
]


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """One ResourceType per served version of a CustomResourceDefinition."""
    spec = crd["spec"]
    names = spec["names"]
    result = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        result.append(ResourceType(
            group=spec["group"], version=version["name"], plural=names["plural"], kind=names["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced", singular=names.get("singular", ""),
            short_names=list(names.get("shortNames") or []),
            status_subresource="status" in (version.get("subresources") or {}),
            schema=(version.get("schema") or {}).get("openAPIV3Schema"),
        ))
    return result


def load_crd_files(directory: Path) -> list[dict[str, Any]]:
    """Every CRD document in `directory/*.yaml`."""
    documents = []
    for path in sorted(directory.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") == "CustomResourceDefinition":
                documents.append(document)
    return documents


def minimal_crd(group: str, version: str, kind: str, plural: str, namespaced: bool = True) -> dict[str, Any]:
    """A CRD that keeps any content (for third-party owner kinds in tests: PyTorchJob, JobSet...)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group, "scope": "Namespaced" if namespaced else "Cluster",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [{"name": version, "served": True, "storage": True, "subresources": {"status": {}},
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
        },
    }
