"""Patch semantics: JSON merge patch (RFC 7386), JSON patch (RFC 6902), server-side apply (approximated)."""

from __future__ import annotations

import copy
from typing import Any

from .errors import ApiError

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"JSON patch path {path!r} must start with /")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(document: Any, parts: list[str]) -> Any:
    node = document
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def json_patch(document: Any, operations: Any) -> Any:
    """RFC 6902 add/remove/replace/test/move/copy; a failed op or test is 422 like the real server."""
    if not isinstance(operations, list):
        raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
    result = copy.deepcopy(document)
    try:
        for operation in operations:
            op, parts = operation["op"], _pointer(operation["path"])
            if op in {"move", "copy"}:
                source = _pointer(operation["from"])
                parent = _parent(result, source)
                value = parent[int(source[-1])] if isinstance(parent, list) else parent[source[-1]]
                if op == "move":
                    json_patch_remove(parent, source[-1])
                op, operation = "add", {**operation, "value": copy.deepcopy(value)}
            parent = _parent(result, parts)
            key = parts[-1]
            if op == "add":
                if isinstance(parent, list):
                    parent.insert(len(parent) if key == "-" else int(key), operation["value"])
                else:
                    parent[key] = operation["value"]
            elif op == "remove":
                json_patch_remove(parent, key)
            elif op == "replace":
                if isinstance(parent, list):
                    parent[int(key)] = operation["value"]
                else:
                    if key not in parent:
                        raise KeyError(key)
                    parent[key] = operation["value"]
            elif op == "test":
                actual = parent[int(key)] if isinstance(parent, list) else parent[key]
                if actual != operation["value"]:
                    raise ApiError(422, "Invalid", f"the JSON patch test at {operation['path']} failed")
            else:
                raise ApiError(400, "BadRequest", f"unknown JSON patch op {op!r}")
    except (KeyError, IndexError, ValueError, TypeError) as error:
        raise ApiError(422, "Invalid", f"the JSON patch cannot be applied: {error!r}") from None
    return result


def json_patch_remove(parent: Any, key: str) -> None:
    if isinstance(parent, list):
        del parent[int(key)]
    else:
        del parent[key]
