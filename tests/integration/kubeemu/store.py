"""Object storage with the API server's bookkeeping: resourceVersion, uid, generation, watch history."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .errors import ApiError
from .resources import ResourceType
from .validation import generate_name, validate_object_meta


def now_rfc3339() -> str:
    return datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- selectors

_SET_REQUIREMENT = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_requirements(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part.strip() for part in parts if part.strip()]


def label_selector_matches(selector: str | None, labels: dict[str, str]) -> bool:
    """Equality (`=`, `==`, `!=`), set (`in`, `notin`) and existence (`key`, `!key`) requirements."""
    if not selector:
        return True
    for requirement in _split_requirements(selector):
        set_match = _SET_REQUIREMENT.match(requirement)
        if set_match:
            key, operator, values = set_match.group(1), set_match.group(2), {v.strip() for v in set_match.group(3).split(",")}
            if (operator == "in") != (labels.get(key) in values and key in labels):
                return False
        elif "!=" in requirement:
            key, value = requirement.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in requirement:
            key, value = requirement.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif requirement.startswith("!"):
            if requirement[1:].strip() in labels:
                return False
        elif requirement not in labels:
            return False
    return True


def _field(obj: dict[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def field_selector_matches(selector: str | None, obj: dict[str, Any]) -> bool:
    if not selector:
        return True
    for requirement in _split_requirements(selector):
        negate = "!=" in requirement
        key, value = re.split(r"!=|==|=", requirement, maxsplit=1)
        actual = _field(obj, key.strip())
        if (str(actual if actual is not None else "") == value.strip()) == negate:
            return False
    return True


# ---------------------------------------------------------------- storage


@dataclass
class Watcher:
    rtype: ResourceType
    namespace: str | None
    label_selector: str | None
    field_selector: str | None
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)

    def wants(self, rtype: ResourceType, obj: dict[str, Any]) -> bool:
        metadata = obj.get("metadata") or {}
        return (
            (rtype.group, rtype.plural) == (self.rtype.group, self.rtype.plural)
            and (self.namespace is None or metadata.get("namespace") == self.namespace)
            and label_selector_matches(self.label_selector, metadata.get("labels") or {})
            and field_selector_matches(self.field_selector, obj)
        )


def _spec_of(obj: dict[str, Any]) -> dict[str, Any]:
    """Everything but metadata and status: what `generation` counts changes of."""
    return {k: v for k, v in obj.items() if k not in {"metadata", "status", "apiVersion", "kind"}}


class ObjectStore:
    """Objects per (group, plural), a global resourceVersion, and a bounded event history for watches."""

    def __init__(self, history_size: int = 20_000) -> None:
        self.keep_client_uids = False
        self.resource_version = 0
        self.objects: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
        self.history: deque[tuple[int, ResourceType, str, dict[str, Any]]] = deque(maxlen=history_size)
        self.watchers: list[Watcher] = []

    def _bump(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)

    def bucket(self, rtype: ResourceType) -> dict[tuple[str, str], dict[str, Any]]:
        return self.objects.setdefault((rtype.group, rtype.plural), {})

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self.bucket(rtype).get((namespace or "", name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{rtype.plural}.{rtype.group or "core"} "{name}" not found')
        return obj

    def select(self, rtype: ResourceType, namespace: str | None, label_selector: str | None = None,
               field_selector: str | None = None) -> list[dict[str, Any]]:
        items = [
            obj for (ns, _), obj in sorted(self.bucket(rtype).items())
            if (namespace is None or ns == namespace)
            and label_selector_matches(label_selector, (obj.get("metadata") or {}).get("labels") or {})
            and field_selector_matches(field_selector, obj)
        ]
        return items

    def _emit(self, rtype: ResourceType, event_type: str, obj: dict[str, Any]) -> None:
        snapshot = copy.deepcopy(obj)
        self.history.append((self.resource_version, rtype, event_type, snapshot))
        for watcher in self.watchers:
            if watcher.wants(rtype, snapshot):
                watcher.queue.put_nowait({"type": event_type, "object": snapshot})

    def create(self, rtype: ResourceType, namespace: str | None, obj: dict[str, Any], manager: str | None) -> dict[str, Any]:
        metadata = obj.setdefault("metadata", {})
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = generate_name(str(metadata["generateName"]))
        name = metadata.get("name")
        if not name:
            raise ApiError(422, "Invalid", f"{rtype.kind} is invalid: metadata.name: Required value")
        validate_object_meta(rtype.kind, rtype.group, rtype.plural, metadata)
        key = (namespace or "", name)
        if key in self.bucket(rtype):
            raise ApiError(409, "AlreadyExists", f'{rtype.plural}.{rtype.group or "core"} "{name}" already exists')
        if rtype.namespaced:
            metadata["namespace"] = namespace
        else:
            metadata.pop("namespace", None)
        # the real server always assigns the uid; `keep_client_uids` is a test knob for fixtures whose
        # UIDs are fixed elsewhere (the fake NVML's cgroup paths name pod UIDs)
        metadata["uid"] = str(metadata["uid"]) if self.keep_client_uids and metadata.get("uid") else str(uuid.uuid4())
        metadata["creationTimestamp"] = now_rfc3339()
        metadata["generation"] = 1
        metadata.pop("deletionTimestamp", None)
        metadata["managedFields"] = [{"manager": manager or "unknown", "operation": "Update",
                                      "apiVersion": rtype.api_version, "time": now_rfc3339()}]
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
        metadata["resourceVersion"] = self._bump()
        self.bucket(rtype)[key] = obj
        self._emit(rtype, "ADDED", obj)
        return obj

    def replace(self, rtype: ResourceType, old: dict[str, Any], new: dict[str, Any], manager: str | None,
                subresource: str | None) -> dict[str, Any]:
        """Store `new` in place of `old`, keeping what the API server owns."""
        old_meta, new_meta = old["metadata"], new.setdefault("metadata", {})
        wanted_rv = new_meta.get("resourceVersion")
        if wanted_rv and wanted_rv != old_meta["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {rtype.plural}.{rtype.group or "core"} '
                                            f'"{old_meta["name"]}": the object has been modified; please apply your '
                                            "changes to the latest version and try again")
        for owned in ("uid", "creationTimestamp", "namespace", "name", "generation", "deletionTimestamp"):
            if owned in old_meta:
                new_meta[owned] = old_meta[owned]
        validate_object_meta(rtype.kind, rtype.group, rtype.plural, new_meta)
        if subresource == "status":  # only the status stanza changes through /status
            merged = copy.deepcopy(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
            new_meta = new["metadata"]
        elif rtype.status_subresource:  # and never through the main resource
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        if json.dumps(_spec_of(new), sort_keys=True) != json.dumps(_spec_of(old), sort_keys=True):
            new_meta["generation"] = int(old_meta.get("generation") or 1) + 1
        if json.dumps(new, sort_keys=True, default=str) == json.dumps(old, sort_keys=True, default=str):
            return old  # a no-op write: no new resourceVersion, no watch event (like the real server)
        managed = [entry for entry in old_meta.get("managedFields") or []
                   if (entry.get("manager"), entry.get("subresource")) != (manager, subresource)]
        managed.append({"manager": manager or "unknown", "operation": "Update", "apiVersion": rtype.api_version,
                        "time": now_rfc3339(), **({"subresource": subresource} if subresource else {})})
        new_meta["managedFields"] = managed
        new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
        new_meta["resourceVersion"] = self._bump()
        self.bucket(rtype)[(old_meta.get("namespace") or "", old_meta["name"])] = new
        if new_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
            return self._remove(rtype, new)
        self._emit(rtype, "MODIFIED", new)
        return new

    def mark_deleting(self, rtype: ResourceType, obj: dict[str, Any], when: str,
                      status: dict[str, Any] | None = None) -> dict[str, Any]:
        """Set deletionTimestamp (and a status) on an object that is going but not gone yet."""
        updated = copy.deepcopy(obj)
        updated["metadata"]["deletionTimestamp"] = when
        if status is not None:
            updated["status"] = {**(updated.get("status") or {}), **status}
        updated["metadata"]["resourceVersion"] = self._bump()
        metadata = updated["metadata"]
        self.bucket(rtype)[(metadata.get("namespace") or "", metadata["name"])] = updated
        self._emit(rtype, "MODIFIED", updated)
        return updated

    def remove(self, rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """Remove an object whatever its finalizers (what the namespace controller's finalizer step ends in)."""
        return self._remove(rtype, obj)

    def delete(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self.get(rtype, namespace, name)
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                return self.mark_deleting(rtype, obj, now_rfc3339())
            return obj
        return self._remove(rtype, obj)

    def _remove(self, rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        metadata = obj["metadata"]
        del self.bucket(rtype)[(metadata.get("namespace") or "", metadata["name"])]
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = self._bump()
        self._emit(rtype, "DELETED", gone)
        return gone

    def events_since(self, watcher: Watcher, resource_version: int) -> list[dict[str, Any]]:
        """History after `resource_version` for a new watch; 410 Gone when it was compacted away."""
        if self.history and resource_version < self.history[0][0] - 1:
            raise ApiError(410, "Expired", f"too old resource version: {resource_version} ({self.history[0][0] - 1})")
        return [{"type": event_type, "object": obj} for rv, rtype, event_type, obj in self.history
                if rv > resource_version and watcher.wants(rtype, obj)]
