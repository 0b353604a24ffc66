"""Property tests from the OpenAPI document: no 5xx, every response matches its documented schema."""

from __future__ import annotations

import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gpuwm.api.app import create_app
from gpuwm.config import Settings

from .api_data import populate

_DIRECTORY = tempfile.TemporaryDirectory(prefix="gpuwm-schemathesis-")
_STORE = populate(Path(_DIRECTORY.name) / "gpuwm.db")
APP = create_app(_STORE, Settings(auth="none"))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms_to_its_openapi_document(case: schemathesis.Case) -> None:  # type: ignore[type-arg]
    case.call_and_validate(
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ]
    )
