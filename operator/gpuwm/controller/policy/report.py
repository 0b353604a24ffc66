"""Pure builders of what the idle-policy room writes: a policy's status, the workload CR's trail and condition,
and the cost fields."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpuwm.accounting import Planned, Policy, PolicyOutlook, ProjectCost, WorkloadCost
from gpuwm.controller.status import rfc3339
from gpuwm.model import MAX_POLICY_LISTED, MAX_WORKLOAD_ACTIONS, ActionResult, ActionType

#: Event reasons of each step done, and of a step that failed
EVENT_REASONS: dict[str, str] = {"warn": "IdlePolicyWarning", "scaleToZero": "IdlePolicyScaledToZero",
                                 "suspend": "IdlePolicySuspended", "delete": "IdlePolicyDeleted"}
FAILED_REASON = "IdlePolicyActionFailed"
#: the IdlePolicy condition's reason after each step
CONDITION_REASONS: dict[str, str] = {"warn": "Warned", "scaleToZero": "ScaledToZero", "suspend": "Suspended",
                                     "delete": "Deleted"}
MAX_MESSAGE = 1024


def action_record(now: float, policy: str, action: ActionType, result: ActionResult, message: str,
                  namespace: str | None = None, name: str | None = None) -> dict[str, Any]:
    """One entry of `status.policyActions` (a workload's) or `status.recentActions` (a policy's: with whom)."""
    record: dict[str, Any] = {"time": rfc3339(now), "policy": policy, "action": action, "result": result,
                              "message": message[:MAX_MESSAGE]}
    if namespace is not None:
        record["namespace"] = namespace
        record["name"] = name
    return record


def newest_first(records: Sequence[dict[str, Any]], record: dict[str, Any], keep: int) -> list[dict[str, Any]]:
    return [record, *records][:keep]


class Transition(NamedTuple):
    """A condition's status, and since when it holds."""

    status: str
    since: float


@dataclass
class PolicyState:
    """One policy object as the room knows it: where it is, what it said, and what it did."""

    kind: str
    namespace: str | None
    name: str
    generation: int | None = None
    policy: Policy | None = None
    problem: str | None = None  # why its spec cannot be used
    recent: list[dict[str, Any]] = field(default_factory=list)
    taken: int = 0
    failed: int = 0
    missing: list[str] = field(default_factory=list)
    transitions: dict[str, Transition] = field(default_factory=dict)  # condition type -> its status since when

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


def _planned_json(planned: Planned) -> dict[str, Any]:
    return {"namespace": planned.namespace, "name": planned.name, "kind": planned.kind, "action": planned.action,
            "at": rfc3339(planned.at), "state": planned.state}


def _condition(state: PolicyState, kind: str, status: str, reason: str, message: str, now: float) -> dict[str, Any]:
    previous = state.transitions.get(kind)
    since = previous.since if previous is not None and previous.status == status else now
    state.transitions[kind] = Transition(status, since)
    return {"type": kind, "status": status, "reason": reason, "message": message[:MAX_MESSAGE],
            "lastTransitionTime": rfc3339(since)}


def policy_status(state: PolicyState, outlook: PolicyOutlook | None, now: float) -> dict[str, Any]:
    """The policy's status: what it covers, plans, did and cannot do."""
    outlook = outlook or PolicyOutlook()
    if state.problem is not None:
        ready = _condition(state, "Ready", "False", "InvalidSpec", state.problem, now)
    elif state.missing:
        ready = _condition(state, "Ready", "False", "PermissionsMissing",
                           "the controller lacks rights its actions need: " + ", ".join(state.missing), now)
    elif state.policy is not None and state.policy.spec.dry_run:
        ready = _condition(state, "Ready", "True", "DryRun", "lists what it would do; set dryRun: false to act", now)
    else:
        ready = _condition(state, "Ready", "True", "Acting", "acts on the workloads it selects", now)
    permissions = _condition(state, "PermissionsMissing", "True" if state.missing else "False",
                             "Missing" if state.missing else "AllGranted",
                             ", ".join(state.missing) or "the controller holds every right its actions need", now)
    return {
        "matchedWorkloads": outlook.matched, "idleWorkloads": outlook.triggered,
        "planned": [_planned_json(planned) for planned in outlook.planned[:MAX_POLICY_LISTED]],
        "recentActions": state.recent[:MAX_POLICY_LISTED], "actionsTaken": state.taken, "actionsFailed": state.failed,
        "missingPermissions": list(state.missing), "conditions": [ready, permissions],
        "observedGeneration": state.generation, "lastUpdateTime": rfc3339(now),
    }


def cost_fields(cost: WorkloadCost | ProjectCost, currency: str) -> dict[str, Any]:
    fields: dict[str, Any] = {"costPerHour": cost.cost_per_hour, "cost": cost.cost, "idleCost": cost.idle_cost,
                              "energyCost": cost.energy_cost, "currency": currency}
    if isinstance(cost, ProjectCost):
        fields["idleCostPerHour"] = cost.idle_cost_per_hour
    return fields


def idle_policy_condition(records: Sequence[Mapping[str, Any]], in_episode: bool, since: float | None
                          ) -> dict[str, Any] | None:
    """The workload's IdlePolicy condition: True while a step done by a policy still holds (its idle spell goes
    on); None for a workload no policy ever acted on."""
    done = [record for record in records if record.get("result") == "Succeeded"]
    if not done:
        return None
    latest = done[0]
    if in_episode:
        return {"type": "IdlePolicy", "status": "True", "reason": CONDITION_REASONS.get(latest["action"], "Acted"),
                "message": f"{latest['policy']}: {latest['message']}"[:MAX_MESSAGE], "lastTransitionTime": latest["time"]}
    return {"type": "IdlePolicy", "status": "False", "reason": "NotIdle",
            "message": "no idle policy step holds: the workload was active again, or resumed",
            "lastTransitionTime": rfc3339(since) if since is not None else latest["time"]}


def trail(records: Sequence[dict[str, Any]], record: dict[str, Any]) -> list[dict[str, Any]]:
    """A workload's policyActions with `record` added, newest first, at most MAX_WORKLOAD_ACTIONS."""
    return newest_first(records, record, MAX_WORKLOAD_ACTIONS)
