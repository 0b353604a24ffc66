"""events.k8s.io/v1 Events are the core/v1 Events, seen through a conversion (one storage, two views).

The real API server stores one Event kind and converts field by field; an Event posted through
either API is listed and watched through both.
"""

from __future__ import annotations

from typing import Any

#: core/v1 field -> events.k8s.io/v1 field (the rest keep their names)
_CORE_TO_V1 = {
    "involvedObject": "regarding", "message": "note", "reportingComponent": "reportingController",
    "source": "deprecatedSource", "firstTimestamp": "deprecatedFirstTimestamp",
    "lastTimestamp": "deprecatedLastTimestamp", "count": "deprecatedCount",
}
_V1_TO_CORE = {v1: core for core, v1 in _CORE_TO_V1.items()}
_SHARED = ("metadata", "eventTime", "series", "related", "action", "reason", "type", "reportingInstance")


def core_to_v1(event: dict[str, Any]) -> dict[str, Any]:
    converted: dict[str, Any] = {"apiVersion": "events.k8s.io/v1", "kind": "Event"}
    for field, value in event.items():
        if field in _CORE_TO_V1:
            converted[_CORE_TO_V1[field]] = value
        elif field in _SHARED:
            converted[field] = value
    converted.setdefault("eventTime", None)  # a legacy Event has none: clients that need it see null
    return converted


def v1_to_core(event: dict[str, Any]) -> dict[str, Any]:
    converted: dict[str, Any] = {"apiVersion": "v1", "kind": "Event"}
    for field, value in event.items():
        if field in _V1_TO_CORE:
            converted[_V1_TO_CORE[field]] = value
        elif field in _SHARED:
            converted[field] = value
    return converted
