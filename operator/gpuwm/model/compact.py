"""Less memory for the pydantic objects the engine keeps for a long time (finished pods' last events).

A finished workload's pods stay in the engine for the retention (7 days by default), so a
large cluster holds tens of thousands of them. Each validated model carries its own
`__pydantic_fields_set__`, a set of the field names given: the biggest part
of a small model. Frozen models never add to it (pydantic does so on assignment only), so
instances that were given the same fields can share one set.
"""

from __future__ import annotations

import sys
from typing import TypeVar

from pydantic import BaseModel

from gpuwm.model.trace import PodEvent

_Model = TypeVar("_Model", bound=BaseModel)

#: one set per distinct combination of given fields (a handful per model class)
_SHARED_FIELDS_SETS: dict[frozenset[str], set[str]] = {}


def share_fields_set(instance: _Model) -> _Model:
    """The same instance, its fields-set replaced by the one shared by its equals. Frozen models only."""
    if not instance.model_config.get("frozen"):
        raise TypeError(f"{type(instance).__name__} is not frozen: its fields-set can change, it cannot be shared")
    own = instance.__pydantic_fields_set__
    shared = _SHARED_FIELDS_SETS.setdefault(frozenset(own), own)
    if shared is not own:
        object.__setattr__(instance, "__pydantic_fields_set__", shared)
    return instance


def intern_strings(instance: _Model) -> _Model:
    """The same instance, its string values replaced by the interpreter's one copy of each. Frozen models only.

    What an agent sends repeats in every pull and across devices (node, model and resource
    names, namespaces, the device's UUID the engine also keeps): parsed JSON gives each a new
    string, and a long-lived model keeps it alive.
    """
    if not instance.model_config.get("frozen"):
        raise TypeError(f"{type(instance).__name__} is not frozen: its values can change, they are not shared")
    values = instance.__dict__
    for name, value in values.items():
        if type(value) is str:
            values[name] = sys.intern(value)
    return instance


def compact_pod_event(event: PodEvent) -> PodEvent:
    """A pod event and its workload and devices with shared fields-sets."""
    share_fields_set(event)
    share_fields_set(event.workload)
    for device in event.devices:
        share_fields_set(device)
    return event
