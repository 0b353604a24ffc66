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


def _renamed(event: dict[str, Any], renames: dict[str, str], api_version: str) -> dict[str, Any]:
    converted: dict[str, Any] = {"apiVersion": api_version, "kind": "Event"}
    for field, value in event.items():
        if field in renames:
            converted[renames[field]] = value
        elif field in _SHARED:
            converted[field] = value
    return converted


def core_to_v1(event: dict[str, Any]) -> dict[str, Any]:
    converted = _renamed(event, _CORE_TO_V1, "events.k8s.io/v1")
    converted.setdefault("eventTime", None)  # a legacy Event has none: clients that need it see null
    return converted


def v1_to_core(event: dict[str, Any]) -> dict[str, Any]:
    return _renamed(event, _V1_TO_CORE, "v1")
