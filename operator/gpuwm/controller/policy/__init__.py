"""Idle policies and cost: the room that acts on idle workloads and prices them (see `room`).

`access` holds the rights each action needs (and the SelfSubjectAccessReview check), `actions` what
each step does to a workload object, `report` the pure builders of statuses and Events, `metrics`
the Prometheus series. The decisions themselves are pure, below the controller
(`gpuwm.accounting.PolicyEvaluator`, `gpuwm.accounting.CostMeter`).
"""

from gpuwm.controller.policy.access import BASE_RULES, WEBHOOK_SECRET_RULE, rules_for
from gpuwm.controller.policy.metrics import PolicyCollector
from gpuwm.controller.policy.room import POLICY_PLURALS, PolicyRoom

__all__ = [
    "BASE_RULES", "POLICY_PLURALS", "WEBHOOK_SECRET_RULE", "PolicyCollector", "PolicyRoom", "rules_for",
]
