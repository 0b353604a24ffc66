"""Models alike share one fields-set, and interned input strings stay shared; nothing they say or dump changes."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from gpuwm.model.compact import intern_strings, share_fields_set
from gpuwm.model.trace import TraceWorkload


def _workload(index: int, created: float | None) -> TraceWorkload:
    return TraceWorkload(api_version="batch/v1", kind="Job", name=f"train-{index}", uid=f"w-{index}",
                         **({"created": created} if created is not None else {}))


def test_models_that_set_the_same_fields_share_one_set() -> None:
    before = [_workload(index, 5.0).model_dump(mode="json", exclude_unset=True) for index in range(3)]
    shared = [share_fields_set(_workload(index, 5.0)) for index in range(3)]
    assert [workload.model_dump(mode="json", exclude_unset=True) for workload in shared] == before
    assert shared[0].model_fields_set is shared[1].model_fields_set is shared[2].model_fields_set
    assert shared[0] == _workload(0, 5.0)
    # one given fewer fields keeps its own (shared with its equals, not with these)
    other = share_fields_set(_workload(9, None))
    assert other.model_fields_set == {"api_version", "kind", "name", "uid"}
    assert other.model_dump(exclude_unset=True) == {"api_version": "batch/v1", "kind": "Job", "name": "train-9",
                                                    "uid": "w-9"}
    assert shared[0].model_fields_set == {"api_version", "kind", "name", "uid", "created"}


def test_a_model_that_can_change_is_refused() -> None:
    class Mutable(BaseModel):
        value: int = 0

    with pytest.raises(TypeError, match="Mutable is not frozen"):
        share_fields_set(Mutable(value=1))


def test_interned_strings_are_the_ones_a_model_keeps() -> None:
    parsed = [{"api_version": "batch/v1", "kind": "".join(["J", "ob"]), "name": "n", "uid": "u"} for _ in range(2)]
    assert parsed[0]["kind"] is not parsed[1]["kind"]
    first, second = (TraceWorkload.model_validate(intern_strings(values)) for values in parsed)
    assert first.kind is second.kind
    assert intern_strings({"units": 0.5, "name": "x"}) == {"units": 0.5, "name": "x"}
