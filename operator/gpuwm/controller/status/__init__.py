"""Building and writing the CRs' status and Events from the engine's figures.

`build` is pure (figures → status bodies, conditions, whether a write is worth it), `idleness`
decides the Idle and Sampling conditions, `writer` paces the `/status` writes and `events`
the Idle Events. It writes through `kube` and knows nothing of agents or pods.
"""

from gpuwm.controller.status.build import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    ConditionMemo,
    CrOwner,
    build_project_status,
    build_workload_status,
    claim_cr_name,
    dns_name,
    label_value,
    memo_from_json,
    memo_to_json,
    project_counters,
    project_signature,
    remembered,
    rfc3339,
    workload_counters,
    workload_labels,
    workload_signature,
)
from gpuwm.controller.status.events import COMPONENT, IdleEvents, event_body
from gpuwm.controller.status.idleness import ConditionStatus, IdleWatch, Seen, idle_condition, seen_now
from gpuwm.controller.status.writer import API_VERSION, PROJECT_PLURAL, WORKLOAD_PLURAL, Desired, StatusWriter

__all__ = [
    "API_VERSION", "COMPONENT", "MANAGED_BY", "MANAGED_BY_LABEL", "PROJECT_PLURAL", "WORKLOAD_PLURAL",
    "ConditionMemo", "ConditionStatus", "CrOwner", "Desired", "IdleEvents", "IdleWatch", "Seen",
    "StatusWriter", "build_project_status", "build_workload_status", "claim_cr_name", "dns_name",
    "event_body", "idle_condition", "label_value", "memo_from_json", "memo_to_json", "project_counters",
    "project_signature", "remembered", "rfc3339", "seen_now", "workload_counters", "workload_labels",
    "workload_signature",
]
