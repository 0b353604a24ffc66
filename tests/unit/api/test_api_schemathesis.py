"""Property tests from the OpenAPI document with every schemathesis check (issue 34 §7): no 5xx, every
response as documented, valid requests accepted and invalid ones refused; bounded to a few minutes.

start/end/step/by/idle declare their forms as patterns, so what the fuzzer calls valid can be. One check
is left out: positive_data_acceptance, because some limits cannot be said in the document (end before
start, more than 11,000 points a series, a step under 1 ms): those well-formed requests get a 400 that
names the parameter, which the other checks hold to the documented error body."""

from __future__ import annotations

import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from gpuwm.api.app import create_app
from gpuwm.config import Settings

from .api_data import populate

_DIRECTORY = tempfile.TemporaryDirectory(prefix="gpuwm-schemathesis-")
_STORE = populate(Path(_DIRECTORY.name) / "gpuwm.db")
APP = create_app(_STORE, Settings(auth="none"))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@schema.parametrize()
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms_to_its_openapi_document(case: schemathesis.Case) -> None:  # type: ignore[type-arg]
    case.call_and_validate(excluded_checks=[positive_data_acceptance])
