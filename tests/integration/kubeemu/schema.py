"""Structural-schema validation and pruning, as the API server applies a CRD's openAPIV3Schema.

Unknown fields are dropped (pruning) unless `x-kubernetes-preserve-unknown-fields`; so are
object fields set to null where the schema is not `nullable` and has no default (the API
server prunes those before validating, since 1.20). Wrong types (3.5 for an integer), a
string that is not RFC 3339 where `format: date-time`, a null array item where not
`nullable`, missing `required` fields and values outside `enum` are errors (HTTP 422), each
naming the field path like the real server does.
"""

from __future__ import annotations

import re
from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


#: strfmt's date-time: RFC 3339 with a time zone, fractional seconds optional
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def expected_format(schema: dict[str, Any]) -> str | None:
    value = schema.get("format")
    return str(value) if value else None


def validate(value: Any, schema: dict[str, Any], path: str = "") -> tuple[Any, list[str]]:
    """(pruned value, errors) for `value` against `schema`."""
    errors: list[str] = []
    pruned = _check(value, schema, path or "<root>", errors)
    return pruned, errors


def _check(value: Any, schema: dict[str, Any], path: str, errors: list[str]) -> Any:
    if value is None:
        if not schema.get("nullable", False) and schema:
            errors.append(f"{path}: Invalid value: \"null\": {path} in body must be of type {schema.get('type', 'object')}")
        return value
    if expected_format(schema) == "date-time" and isinstance(value, str) and not _DATE_TIME.fullmatch(value):
        errors.append(f'{path}: Invalid value: "{value}": {path} in body must be of type date-time: "{value}"')
        return value
    expected = schema.get("type")
    if expected in _TYPES:
        ok = isinstance(value, _TYPES[expected]) and not (expected in {"integer", "number"} and isinstance(value, bool))
        if expected == "integer" and isinstance(value, float) and value.is_integer():
            ok = True
        if not ok:
            errors.append(f"{path}: Invalid value: {type(value).__name__}: {path} in body must be of type {expected}")
            return value
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: Unsupported value: {value!r}: supported values: {schema['enum']}")
    if isinstance(value, dict):
        properties: dict[str, Any] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
        result: dict[str, Any] = {}
        for key, item in value.items():
            child = f"{path}.{key}" if path != "<root>" else key
            if item is None and key in properties and not properties[key].get("nullable", False) \
                    and "default" not in properties[key]:
                continue  # a null where null is not allowed is pruned before validation (Kubernetes >= 1.20)
            if key in properties:
                result[key] = _check(item, properties[key], child, errors)
            elif isinstance(additional, dict):
                result[key] = _check(item, additional, child, errors)
            elif preserve or additional is True or (not properties and expected != "object" and not schema):
                result[key] = item
            # else: pruned, silently, like the real API server
        for name in schema.get("required") or []:
            if name not in value:
                child = f"{path}.{name}" if path != "<root>" else name
                errors.append(f"{child}: Required value")
        return result
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            return [_check(item, items, f"{path}[{index}]", errors) for index, item in enumerate(value)]
    return value
