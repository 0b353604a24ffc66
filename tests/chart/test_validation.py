"""The test API server's own checks: they must reject what a real API server rejects."""

from __future__ import annotations

import pytest

from tests.chart.validation import Invalid, structural_to_jsonschema, validate_metadata


@pytest.mark.parametrize(
    ("kind", "metadata", "fault"),
    [
        ("Deployment", {"name": "Bad_Name"}, "metadata.name"),
        ("Service", {"name": "s" * 64}, "metadata.name"),
        ("ConfigMap", {"name": "ok", "labels": {"team": "x" * 64}}, "metadata.labels"),
        ("ConfigMap", {"name": "ok", "labels": {"bad key!": "v"}}, "metadata.labels"),
        ("ConfigMap", {"name": "ok", "annotations": {"a": 1}}, "metadata.annotations"),
    ],
)
def test_metadata_rules_reject(kind: str, metadata: dict[str, object], fault: str) -> None:
    with pytest.raises(Invalid, match=fault):
        validate_metadata({"metadata": metadata}, kind)


def test_metadata_rules_accept_a_good_object() -> None:
    validate_metadata({"metadata": {"name": "gpuwm-controller", "labels": {"app.kubernetes.io/name": "gpuwm"}}}, "Service")


def test_structural_schema_is_strict_and_nullable() -> None:
    schema = structural_to_jsonschema(
        {"type": "object", "properties": {"a": {"type": "number", "nullable": True},
                                          "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                          "port": {"x-kubernetes-int-or-string": True}}},
        strict=True,
    )
    assert schema["additionalProperties"] is False
    assert schema["properties"]["a"]["type"] == ["number", "null"]
    assert "additionalProperties" not in schema["properties"]["free"]
    assert schema["properties"]["port"]["type"] == ["integer", "string"]
