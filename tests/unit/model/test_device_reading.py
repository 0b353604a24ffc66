"""`DeviceReading`: a device's latest sample as the controller keeps it, the fields of a GpuSample."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import TypeAdapter

from gpuwm.model import DeviceReading, GpuSample


def test_a_reading_has_every_field_of_a_sample_in_its_order() -> None:
    assert [field.name for field in dataclasses.fields(DeviceReading)] == list(GpuSample.model_fields)


@pytest.mark.parametrize(("used", "total", "percent"), [(4e10, 8e10, 50.0), (None, 8e10, None), (1.0, 0.0, None)])
def test_a_reading_of_a_sample_holds_its_figures(used: float | None, total: float | None, percent: float | None) -> None:
    sample = GpuSample(t=3.0, node="n1", uuid="GPU-1", seq=4, sm_percent=5.0, memory_used_bytes=used,
                       memory_total_bytes=total, processes=[{"pid": 7, "pod_uid": "p", "sm_percent": 5.0}])
    reading = DeviceReading.of(sample)
    assert TypeAdapter(DeviceReading).dump_python(reading) == sample.model_dump()
    assert reading.memory_percent == sample.memory_percent == percent
    with pytest.raises(dataclasses.FrozenInstanceError):
        reading.sm_percent = 6.0  # type: ignore[misc]
