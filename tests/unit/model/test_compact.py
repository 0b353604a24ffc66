"""Kept pod events share their fields-sets; nothing they say or dump changes."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from gpuwm.model.compact import compact_pod_event, share_fields_set
from gpuwm.model.trace import DeviceAllocation, PodEvent, TraceWorkload


def _event(index: int, created: float | None) -> PodEvent:
    workload = TraceWorkload(api_version="batch/v1", kind="Job", name=f"train-{index}", uid=f"w-{index}",
                             **({"created": created} if created is not None else {}))
    return PodEvent(t=float(index), event="pod", namespace="team-a", name=f"train-{index}-0", uid=f"p-{index}",
                    phase="Running", node="node-a", labels={"gpuwm.io/project": "vision"}, workload=workload,
                    devices=[DeviceAllocation(uuid="GPU-0", units=1.0)])


def test_events_that_set_the_same_fields_share_one_set() -> None:
    before = [_event(index, 5.0).model_dump(mode="json", exclude_unset=True) for index in range(3)]
    events = [compact_pod_event(_event(index, 5.0)) for index in range(3)]
    assert [event.model_dump(mode="json", exclude_unset=True) for event in events] == before
    assert events[0].__pydantic_fields_set__ is events[1].__pydantic_fields_set__
    assert events[0].workload.__pydantic_fields_set__ is events[2].workload.__pydantic_fields_set__
    assert events[0].devices[0].__pydantic_fields_set__ is events[1].devices[0].__pydantic_fields_set__
    # a workload given fewer fields keeps its own (shared with its equals, not with these)
    other = compact_pod_event(_event(9, None))
    assert other.workload.__pydantic_fields_set__ == {"api_version", "kind", "name", "uid"}
    assert other.workload.model_dump(exclude_unset=True) == {"api_version": "batch/v1", "kind": "Job",
                                                             "name": "train-9", "uid": "w-9"}
    assert events[0].workload.__pydantic_fields_set__ == {"api_version", "kind", "name", "uid", "created"}


def test_a_model_that_can_change_is_refused() -> None:
    class Mutable(BaseModel):
        value: int = 0

    with pytest.raises(TypeError, match="Mutable is not frozen"):
        share_fields_set(Mutable(value=1))
