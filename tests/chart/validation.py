"""Server-side validation for the test API server: metadata rules and CRD structural schemas."""

from __future__ import annotations

import re
from typing import Any

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Kinds whose names are DNS labels (63 characters) rather than DNS subdomains.
_DNS_LABEL_KINDS = {"Namespace", "Service"}


class Invalid(Exception):
    """An object the API server rejects; `str()` is the message a client sees."""


def structural_to_jsonschema(schema: Any, strict: bool) -> Any:
    """A CRD structural schema as JSON Schema: nullable, int-or-string, and unknown fields rejected.

    A real API server prunes unknown fields and, under strict field validation (kubectl's
    default), rejects them; so do we, unless the schema preserves unknown fields.
    """
    if isinstance(schema, list):
        return [structural_to_jsonschema(item, strict) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: structural_to_jsonschema(value, strict) for key, value in schema.items() if not key.startswith("x-")}
    if "properties" in result:
        result["properties"] = {
            name: structural_to_jsonschema(sub, strict) for name, sub in schema["properties"].items()
        }
    if schema.get("x-kubernetes-int-or-string"):
        result["type"] = ["integer", "string"]
    if schema.get("nullable"):
        result.pop("nullable", None)
        if "type" in result:
            types = result["type"] if isinstance(result["type"], list) else [result["type"]]
            result["type"] = [*types, "null"]
        for key in ("enum",):
            if key in result:
                result[key] = [*result[key], None]
    if (
        strict
        and result.get("type") == "object"
        and "properties" in result
        and "additionalProperties" not in result
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        result["additionalProperties"] = False
    return result


def validate_metadata(obj: dict[str, Any], kind: str) -> None:
    """The API server's checks on names, labels and annotations."""
    metadata = obj.get("metadata") or {}
    name = metadata.get("name", "")
    where = f"{kind} {name!r}"
    pattern, limit = (_DNS_LABEL, 63) if kind in _DNS_LABEL_KINDS else (_DNS_SUBDOMAIN, 253)
    if kind not in {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} and (
        not pattern.match(name) or len(name) > limit
    ):
        raise Invalid(f"{where}: metadata.name: Invalid value: must be a DNS name of at most {limit} characters")
    for key, value in (metadata.get("labels") or {}).items():
        prefix, _, label_name = key.rpartition("/")
        if (prefix and not _DNS_SUBDOMAIN.match(prefix)) or not _LABEL_NAME.match(label_name) or len(label_name) > 63:
            raise Invalid(f"{where}: metadata.labels: Invalid value: {key!r}: not a valid label key")
        if not isinstance(value, str) or not _LABEL_VALUE.match(value) or len(value) > 63:
            raise Invalid(f"{where}: metadata.labels: Invalid value: {value!r}: not a valid label value")
    annotations = metadata.get("annotations") or {}
    if any(not isinstance(value, str) for value in annotations.values()):
        raise Invalid(f"{where}: metadata.annotations: values must be strings")
