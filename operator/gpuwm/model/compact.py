"""Less memory for long-lived pydantic objects: one copy of each repeated string, one fields-set per shape.

What an agent sends repeats in every pull and across devices (node, model and resource names,
namespaces, the device's UUID the engine also keeps): parsed JSON gives each a new string, and a
long-lived model keeps it alive. Validation keeps the string objects it is given, so interning them
before validation leaves the model holding the interpreter's one copy.
"""

from __future__ import annotations

import sys
from typing import Any, TypeVar

from pydantic import BaseModel

_Model = TypeVar("_Model", bound=BaseModel)

#: one set per distinct combination of given fields (a handful per model class)
_SHARED_FIELDS_SETS: dict[frozenset[str], set[str]] = {}


def intern_strings(values: dict[str, Any]) -> dict[str, Any]:
    """`values` (a model's input) with each string value replaced by the interpreter's one copy of it."""
    return {name: sys.intern(value) if type(value) is str else value for name, value in values.items()}


def share_fields_set(instance: _Model) -> _Model:
    """An equal instance whose fields-set is the one shared by every instance given the same fields. Frozen models only.

    A validated model carries its own set of the field names it was given; frozen models never add to it
    (pydantic does so on assignment only), so instances given the same fields can share one.
    """
    if not instance.model_config.get("frozen"):
        raise TypeError(f"{type(instance).__name__} is not frozen: its fields-set can change, it cannot be shared")
    given = instance.model_fields_set
    shared = _SHARED_FIELDS_SETS.setdefault(frozenset(given), set(given))
    return type(instance).model_construct(shared, **dict(instance))
