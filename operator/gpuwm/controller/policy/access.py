"""The rights each idle-policy action needs, and whether the controller holds them (SelfSubjectAccessReview).

One table (`ACTION_RULES`) says which kinds and verbs an action touches; the chart renders exactly
these rules for the actions `idlePolicies.actions` enables (a test compares them with
`gpuwm.controller.rbac.idle_policy_rules`), and the controller asks the API server at start which of
them it really holds, so a policy whose actions it could not take says so on its status at once
instead of failing when a workload is idle.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwm.controller.kube import KubeApiError, KubeClient

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    """Verbs on resources of one API group (a subresource written `plural/sub`)."""

    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]

    def as_rbac(self) -> dict[str, Any]:
        return {"apiGroups": [self.group], "resources": list(self.resources), "verbs": list(self.verbs)}


#: reading the policies and writing their status: whenever idle policies are enabled
BASE_RULES: tuple[Rule, ...] = (
    Rule("gpuwm.io", ("gpuidlepolicies", "clustergpuidlepolicies"), ("list", "watch")),
    Rule("gpuwm.io", ("gpuidlepolicies/status", "clustergpuidlepolicies/status"), ("patch",)),
)

_SUSPENDABLE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("batch", ("jobs",)),
    ("jobset.x-k8s.io", ("jobsets",)),
    ("kubeflow.org", ("pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "paddlejobs")),
    ("trainer.kubeflow.org", ("trainjobs",)),
    ("ray.io", ("rayjobs",)),
)
_SCALABLE_SUBRESOURCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("apps", ("deployments/scale", "statefulsets/scale")),
    ("leaderworkerset.x-k8s.io", ("leaderworkersets/scale",)),
)
_SCALABLE_OBJECTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kubeflow.org", ("notebooks",)),
    ("ray.io", ("rayclusters",)),
    ("serving.kserve.io", ("inferenceservices",)),
)
_DELETABLE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("", ("pods",)),
    ("apps", ("deployments", "statefulsets")),
    *_SUSPENDABLE,
    ("leaderworkerset.x-k8s.io", ("leaderworkersets",)),
    *_SCALABLE_OBJECTS,
)

ACTION_RULES: dict[str, tuple[Rule, ...]] = {
    # Events on the workload and its GPUWorkloadMetrics (the controller posts Idle events already)
    "warn": (Rule("", ("events",), ("create",)),),
    "scaleToZero": (
        # the object itself is read through its workloadKinds rule; the scale subresource is only written
        *(Rule(group, resources, ("patch",)) for group, resources in _SCALABLE_SUBRESOURCES),
        *(Rule(group, resources, ("get", "patch")) for group, resources in _SCALABLE_OBJECTS),
    ),
    "suspend": (
        *(Rule(group, resources, ("get", "patch")) for group, resources in _SUSPENDABLE),
        # a Kueue-admitted workload is suspended through its Workload (spec.active), found by its owner
        Rule("kueue.x-k8s.io", ("workloads",), ("list", "patch")),
    ),
    "delete": tuple(Rule(group, resources, ("get", "delete")) for group, resources in _DELETABLE),
}

#: the webhook's URL is read from a Secret in the controller's own namespace (a Role there, never cluster-wide)
WEBHOOK_SECRET_RULE = Rule("", ("secrets",), ("get",))


def rules_for(actions: Iterable[str]) -> list[Rule]:
    """The rules the given action types need, besides the base rules, in the table's order."""
    wanted = set(actions)
    return [rule for action, rules in ACTION_RULES.items() if action in wanted for rule in rules]


@dataclass(frozen=True)
class Access:
    """One verb on one resource (or subresource), as a SelfSubjectAccessReview asks it."""

    verb: str
    group: str
    resource: str
    subresource: str = ""

    @property
    def text(self) -> str:
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {self.group or 'core'}/{resource}"


def accesses(rules: Iterable[Rule]) -> list[Access]:
    found: list[Access] = []
    for rule in rules:
        for resource in rule.resources:
            plural, _, sub = resource.partition("/")
            found.extend(Access(verb, rule.group, plural, sub) for verb in rule.verbs)
    return found


class AccessCheck:
    """What the controller may do, asked once per access and kept (rights change with a chart upgrade, which
    restarts the controller)."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client
        self.allowed: dict[Access, bool] = {}

    async def check(self, wanted: Sequence[Access]) -> list[Access]:
        """The accesses of `wanted` the controller lacks (an access it cannot ask about counts as lacking)."""
        missing = []
        for access in wanted:
            if access not in self.allowed:
                self.allowed[access] = await self._review(access)
            if not self.allowed[access]:
                missing.append(access)
        return missing

    async def _review(self, access: Access) -> bool:
        attributes = {"verb": access.verb, "group": access.group, "resource": access.resource}
        if access.subresource:
            attributes["subresource"] = access.subresource
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes}}
        try:
            answer = await self._client.create("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body)
        except KubeApiError as error:
            logger.warning("cannot ask whether the controller may %s: %s", access.text, error)
            return False
        return bool(((answer or {}).get("status") or {}).get("allowed"))
