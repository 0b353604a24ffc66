"""What kube-apiserver validates on every object, and on Events, before it stores them.

Ported rule by rule from the Kubernetes source the controller could run into:
- apimachinery `ValidateObjectMetaAccessor` (every create and update): the name is a valid
  path segment, `generateName` gets 5 random characters after at most 58 of its own, label
  keys are qualified names and label values at most 63 characters of `[A-Za-z0-9._-]` with
  alphanumeric ends, annotation keys qualified names and all annotations at most 256 KiB;
- the per-kind name rules: namespaces are DNS-1123 labels (63), most kinds DNS-1123
  subdomains (253); Events only need a path-segment name;
- `pkg/apis/core/validation/events.go` `ValidateEventCreate` for core/v1 and events.k8s.io/v1:
  the legacy form (no eventTime) must name the event's own namespace in involvedObject; an
  event with eventTime needs reportingController/Component, reportingInstance (<= 128), action
  (<= 128), reason (<= 128) and a message/note of at most 1 KiB; events.k8s.io/v1 also needs
  type Normal|Warning, eventTime, and none of the deprecated fields; `eventTime` is a MicroTime
  and must carry exactly six fractional digits (`2006-01-02T15:04:05.000000Z`), else 400.
"""

from __future__ import annotations

import random
import re
from datetime import datetime
from typing import Any

from .errors import ApiError

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_MICRO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")
#: apiserver storage's SimpleNameGenerator: no vowels (no words), no 0/1/3 (no look-alikes)
_GENERATED_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
MAX_GENERATED_NAME_PREFIX = 58
TOTAL_ANNOTATION_BYTES = 256 * 1024
EVENT_STRING_LIMIT = 128
EVENT_NOTE_LIMIT = 1024

#: kinds whose names are DNS-1123 labels, not subdomains
_LABEL_NAMED = {("", "namespaces"), ("", "services")}
#: kinds that only need a path-segment name (the legacy Event strategy validates no more)
_PATH_SEGMENT_NAMED = {("", "events")}


def generate_name(prefix: str) -> str:
    """`generateName` as the API server expands it: at most 58 characters, then 5 random ones."""
    return prefix[:MAX_GENERATED_NAME_PREFIX] + "".join(random.choice(_GENERATED_ALPHABET) for _ in range(5))


def _invalid(kind: str, name: str, problems: list[str]) -> ApiError:
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: ' + ", ".join(problems))


def qualified_name_problems(key: str, field: str) -> list[str]:
    """A label or annotation key: `[prefix/]name`, prefix a DNS subdomain, name <= 63 characters."""
    prefix, _, name = key.rpartition("/")
    problems = []
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        problems.append(f'{field}: Invalid value: "{key}": prefix part must be a lowercase RFC 1123 subdomain')
    if not name or len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        problems.append(f'{field}: Invalid value: "{key}": name part must consist of alphanumeric characters, '
                        "'-', '_' or '.', must start and end with an alphanumeric character and be at most 63 "
                        "characters")
    return problems


def label_value_problems(value: Any, field: str) -> list[str]:
    if not isinstance(value, str):
        return [f"{field}: Invalid value: must be a string"]
    if len(value) > 63:
        return [f'{field}: Invalid value: "{value}": must be no more than 63 characters']
    if not _LABEL_VALUE.fullmatch(value):
        return [f'{field}: Invalid value: "{value}": a valid label must be an empty string or consist of '
                "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"]
    return []


def name_problems(group: str, plural: str, name: str) -> list[str]:
    if name in {".", ".."} or "/" in name or "%" in name:
        return [f'metadata.name: Invalid value: "{name}": may not be "." or ".." and may not contain "/" or "%"']
    if (group, plural) in _PATH_SEGMENT_NAMED:
        return []
    if (group, plural) in _LABEL_NAMED:
        if len(name) > 63 or not _DNS_LABEL.fullmatch(name):
            return [f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 label must consist of lower '
                    "case alphanumeric characters or '-', and must start and end with an alphanumeric character "
                    "(at most 63 characters)"]
        return []
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        return [f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"]
    return []


def validate_object_meta(kind: str, group: str, plural: str, metadata: dict[str, Any]) -> None:
    """422 naming each field at fault, as `ValidateObjectMetaAccessor` and the kind's name rule do."""
    name = str(metadata.get("name") or "")
    problems = name_problems(group, plural, name) if name else ["metadata.name: Required value"]
    labels = metadata.get("labels") or {}
    if not isinstance(labels, dict):
        problems.append("metadata.labels: Invalid value: must be an object")
        labels = {}
    for key, value in labels.items():
        problems += qualified_name_problems(str(key), "metadata.labels")
        problems += label_value_problems(value, "metadata.labels")
    annotations = metadata.get("annotations") or {}
    if not isinstance(annotations, dict):
        problems.append("metadata.annotations: Invalid value: must be an object")
        annotations = {}
    for key, value in annotations.items():
        problems += qualified_name_problems(str(key), "metadata.annotations")
        if not isinstance(value, str):
            problems.append(f"metadata.annotations: Invalid value: {key}: must be a string")
    if sum(len(str(k)) + len(str(v)) for k, v in annotations.items()) > TOTAL_ANNOTATION_BYTES:
        problems.append("metadata.annotations: Too long: must have at most 262144 bytes")
    if problems:
        raise _invalid(kind, name, problems)


def _is_set(value: Any) -> bool:
    return value not in (None, "", 0, {}) and value != {"component": "", "host": ""}


def _parse_time(value: Any, field: str, micro: bool) -> bool:
    """Whether a time is set; 400 when it does not decode (as the JSON decoder fails before validation)."""
    if value is None or value == "":
        return False
    pattern = _MICRO_TIME if micro else _TIME
    if not isinstance(value, str) or not pattern.fullmatch(value):
        layout = "2006-01-02T15:04:05.000000Z07:00" if micro else "2006-01-02T15:04:05Z07:00"
        raise ApiError(400, "BadRequest", f'parsing time "{value}" as "{layout}": cannot parse ({field})')
    datetime.fromisoformat(value.replace("Z", "+00:00"))
    return True


def validate_event(group: str, namespace: str | None, event: dict[str, Any]) -> None:
    """`ValidateEventCreate` for core/v1 (group "") and events.k8s.io/v1 bodies."""
    name = str((event.get("metadata") or {}).get("name") or "")
    strict = group == "events.k8s.io"
    involved = (event.get("regarding") if strict else event.get("involvedObject")) or {}
    involved_field = "regarding" if strict else "involvedObject"
    message_field = "note" if strict else "message"
    controller_field = "reportingController" if strict else "reportingComponent"
    has_event_time = _parse_time(event.get("eventTime"), "eventTime", micro=True)
    for field in ("deprecatedFirstTimestamp", "deprecatedLastTimestamp") if strict else ("firstTimestamp",
                                                                                            "lastTimestamp"):
        _parse_time(event.get(field), field, micro=False)
    problems: list[str] = []
    involved_namespace = str(involved.get("namespace") or "")
    if not has_event_time:
        if not involved_namespace:
            if namespace not in {None, "", "default"}:
                problems.append(f"{involved_field}.namespace: Invalid value: \"\": does not match event.namespace")
        elif involved_namespace != namespace:
            problems.append(f'{involved_field}.namespace: Invalid value: "{involved_namespace}": does not match '
                            "event.namespace")
    else:
        if not involved_namespace and namespace not in {"default", "kube-system"}:
            problems.append(f"{involved_field}.namespace: Invalid value: \"\": does not match event.namespace")
        controller = str(event.get(controller_field) or "")
        if not controller:
            problems.append(f"{controller_field}: Required value")
        else:
            problems += qualified_name_problems(controller, controller_field)
        for field in ("reportingInstance", "action", "reason"):
            value = str(event.get(field) or "")
            if not value:
                problems.append(f"{field}: Required value")
            elif len(value) > EVENT_STRING_LIMIT:
                problems.append(f"{field}: Invalid value: \"\": can have at most {EVENT_STRING_LIMIT} characters")
        if len(str(event.get(message_field) or "")) > EVENT_NOTE_LIMIT:
            problems.append(f"{message_field}: Invalid value: \"\": can have at most {EVENT_NOTE_LIMIT} characters")
    if strict:
        if not has_event_time:
            problems.append("eventTime: Required value")
        if event.get("type") not in {"Normal", "Warning"}:
            problems.append(f'type: Invalid value: "": has invalid value: {event.get("type")}')
        for field in ("deprecatedFirstTimestamp", "deprecatedLastTimestamp", "deprecatedCount", "deprecatedSource"):
            if _is_set(event.get(field)):
                problems.append(f'{field}: Invalid value: "": needs to be unset')
    if problems:
        raise _invalid("Event", name, problems)


#: field selectors each kind supports (the rest answer 400 "field label not supported")
_FIELD_LABELS: dict[tuple[str, str], frozenset[str]] = {
    ("", "pods"): frozenset({"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
                             "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs",
                             "status.nominatedNodeName"}),
    ("", "events"): frozenset({"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                               "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                               "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"}),
    ("", "namespaces"): frozenset({"status.phase"}),
    ("", "nodes"): frozenset({"spec.unschedulable"}),
    ("batch", "jobs"): frozenset({"status.successful"}),
}


def check_field_selector(group: str, plural: str, selector: str | None) -> None:
    """400 for a field the kind cannot be selected by (custom resources: metadata.name/namespace only)."""
    if not selector:
        return
    supported = {"metadata.name", "metadata.namespace"} | _FIELD_LABELS.get((group, plural), frozenset())
    for requirement in selector.split(","):
        key = re.split(r"!=|==|=", requirement, maxsplit=1)[0].strip()
        if key not in supported:
            raise ApiError(400, "BadRequest", f'"{key}" is not a known field selector: only '
                                              f'"{", ".join(sorted(supported))}"')


def _mutable_view(spec: dict[str, Any]) -> dict[str, Any]:
    """A pod spec without what an update may change (images, deadline, tolerations, scheduling gates)."""
    view = {k: v for k, v in spec.items() if k not in {"activeDeadlineSeconds", "tolerations", "schedulingGates"}}
    for field in ("containers", "initContainers", "ephemeralContainers"):
        if isinstance(view.get(field), list):
            view[field] = [{k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c
                           for c in view[field]]
    return view


def check_pod_spec_update(old: dict[str, Any], new: dict[str, Any]) -> None:
    """`ValidatePodUpdate`: a pod's spec is immutable but for a few fields; nodeName is set through binding."""
    if _mutable_view(old.get("spec") or {}) != _mutable_view(new.get("spec") or {}):
        name = (old.get("metadata") or {}).get("name")
        raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields '
                                       "other than `spec.containers[*].image`, `spec.initContainers[*].image`, "
                                       "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
                                       "tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set to 1 "
                                       "if it was previously negative)")
