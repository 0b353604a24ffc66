"""`complete`: a model of every field, unvalidated, whose instances share one fields-set that nothing changes."""

from __future__ import annotations

import pytest

from gpuwm.model import GpuFigures, complete

_FIELDS = {name: field.default for name, field in GpuFigures.model_fields.items()} | {"node": "n", "uuid": "GPU-1"}


def test_complete_models_equal_validated_ones_and_share_their_fields_set() -> None:
    first, second = complete(GpuFigures, **_FIELDS), complete(GpuFigures, **_FIELDS | {"uuid": "GPU-2"})
    assert first == GpuFigures.model_validate(_FIELDS)
    assert first.model_dump_json() == GpuFigures.model_validate(_FIELDS).model_dump_json()
    assert first.model_fields_set is second.model_fields_set == set(GpuFigures.model_fields)
    first.units = 0.5  # assignment names a field the set holds already
    copied = first.model_copy(update={"units": 1.0})
    assert second.model_fields_set == set(GpuFigures.model_fields) and second.units == 0.0
    assert copied.model_fields_set is not first.model_fields_set and copied.units == 1.0


def test_a_missing_or_unknown_field_is_refused() -> None:
    missing = {name: value for name, value in _FIELDS.items() if name != "units"}
    with pytest.raises(TypeError, match="units"):
        complete(GpuFigures, **missing)
    with pytest.raises(TypeError, match="unit_seconds"):
        complete(GpuFigures, **missing, unit_seconds=1.0)
