"""Idle policies and cost: the room that acts on idle workloads and prices them (see `room`).

`access` holds the rights each action needs (and the SelfSubjectAccessReview check), `actions` what
each step does to a workload object, `report` the pure builders of statuses and Events, `metrics`
the Prometheus series. The decisions themselves are pure, below the controller
(`gpuwm.accounting.PolicyEvaluator`, `gpuwm.accounting.CostMeter`).
"""

from gpuwm.controller.policy.access import (
    ACTION_RULES,
    BASE_RULES,
    WEBHOOK_SECRET_RULE,
    Access,
    AccessCheck,
    Rule,
    accesses,
    rules_for,
)
from gpuwm.controller.policy.metrics import PolicyCollector
from gpuwm.controller.policy.room import POLICY_PLURALS, PolicyRoom

__all__ = [
    "ACTION_RULES", "BASE_RULES", "POLICY_PLURALS", "WEBHOOK_SECRET_RULE", "Access", "AccessCheck", "PolicyCollector",
    "PolicyRoom", "Rule", "accesses", "rules_for",
]
