"""`model.model_dump_json()` for gpuwm's plain models, through orjson, which takes less CPU than pydantic.

Plain: no aliases in the dump, no serialisers, no computed fields; field values of JSON types or
nested plain models. What gpuwm writes in bulk is such models: the agent's buffered samples and the
store's latest figures (every running workload's each interval). The bytes are pydantic's own
(floats, NaN as null, non-ASCII as is); tests check them against model_dump_json.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel


def _fields(value: Any) -> dict[str, Any]:
    """orjson's hook for nested models (a sample's processes, a workload's pods and GPUs)."""
    if isinstance(value, BaseModel):
        return value.__dict__
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def model_json(model: BaseModel) -> bytes:
    """`model.model_dump_json().encode()`, byte for byte, for a plain model (see the module)."""
    return orjson.dumps(model.__dict__, default=_fields)
