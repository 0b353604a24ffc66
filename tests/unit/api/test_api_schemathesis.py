"""Property tests from the OpenAPI document with every schemathesis check (issue 34 §7): no 5xx, every
response as documented, valid requests accepted and invalid ones refused; bounded to a few minutes.

positive_data_acceptance runs too. A request the document calls valid may still get a 400 for a rule no
OpenAPI schema can state, and only for those (CANNOT_STATE): a rule across parameters (end before start),
the answer's size (points per response), what the server holds (a `continue` token it never gave), or how
it is configured (FOCUS charges without `pricing`).
schemathesis is told 400 is an accepted answer to valid data, and `refused_only_for_rules_the_document_cannot_state`
holds every such 400 to that list, so a 400 for a value the document admits but the API does not (a
pattern too loose, a missing enum) still fails here. The parameters whose form the document does not declare
yet are UNDECLARED, each with the one refusal it excuses; `test_the_undeclared_forms_are_still_undeclared` fails once one is declared, so the
list cannot outlive the gap."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings

from gpuwm.api.app import create_app
from gpuwm.config import Settings

from .api_data import populate

_DIRECTORY = tempfile.TemporaryDirectory(prefix="gpuwm-schemathesis-")
_STORE = populate(Path(_DIRECTORY.name) / "gpuwm.db")
APP = create_app(_STORE, Settings(auth="none"))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
# the defaults, and 400: held to CANNOT_STATE by the check below
schema.config.checks.positive_data_acceptance.expected_statuses = [
    "2xx", "3xx", "401", "403", "404", "409", "429", "5xx", "400"]

#: (parameter, message) of the 400s a valid request may get: rules an OpenAPI schema cannot state
CANNOT_STATE = [
    ("end", re.compile(r"is before start|must be after start")),  # across parameters
    ("continue", re.compile(r"is not a token this API gave")),  # what the server issued
    (None, re.compile(r"points")),  # the answer's size: series x points, apiMaxPointsPerResponse
    ("format", re.compile(r"set `pricing`")),  # how the server is configured: FOCUS charges need prices
]
#: parameters whose form the document does not declare in full (a gap of the document, not of this test): the
#: message of the 400 it causes, why, and a value the document admits that the API refuses. limit, state, the
#: report's by and format, and metric are declared (bounds, enums, a pattern of the known names) and refused by
#: the document's own check; a step of zero and impossible months, days, hours and zones are outside the patterns
UNDECLARED: dict[str, tuple[re.Pattern[str], str, str]] = {
    "step": (re.compile(r"is outside"), "the pattern admits any step but zero; the API takes 1 ms .. the year 9999",
             "0.0001"),
    "start": (re.compile(r"is not RFC 3339|is outside|is after the year 9999"), "the pattern admits a day past its "
              "month's end, a zone that moves 1970-01-01 before the epoch and epoch millis past the year 9999",
              "2026-02-30T00:00:00Z"),
    "end": (re.compile(r"is not RFC 3339|is outside|is after the year 9999"), "as start", "2026-02-30T00:00:00Z"),
}


@schemathesis.check
def refused_only_for_rules_the_document_cannot_state(ctx: Any, response: Any, case: Any) -> bool | None:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 400:
        return None
    body = response.json()
    parameter, message = body.get("parameter"), str(body.get("message", ""))
    if parameter in UNDECLARED and UNDECLARED[parameter][0].search(message):
        return None
    if any((name is None or name == parameter) and pattern.search(message) for name, pattern in CANNOT_STATE):
        return None
    raise AssertionError(f"{case.operation.label}: a request valid by the document got 400 for {parameter!r} "
                         f"({message}); declare that form in the document, or refuse it for a rule it cannot state")


@schema.parametrize()
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms_to_its_openapi_document(case: schemathesis.Case) -> None:  # type: ignore[type-arg]
    case.call_and_validate(additional_checks=[refused_only_for_rules_the_document_cannot_state])


def _parameters(document: dict[str, Any], name: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path, operations in document["paths"].items():
        for parameter in operations.get("get", {}).get("parameters", []):
            if parameter["name"] == name:
                found.append((path, parameter["schema"]))
    return found


def _accepts(schema_: dict[str, Any], value: str) -> bool:
    """Whether the declared schema admits `value` (alone, or as the one item of a repeated parameter)."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema_)
    return bool(validator.is_valid(value) or validator.is_valid([value]))


@pytest.mark.parametrize("name", sorted(UNDECLARED))
def test_the_undeclared_forms_are_still_undeclared(name: str) -> None:
    """Each UNDECLARED parameter still admits, somewhere in the document, a value the API refuses."""
    document = TestClient(APP).get("/openapi.json").json()
    refused = UNDECLARED[name][2]
    admitting = [path for path, declared in _parameters(document, name) if _accepts(declared, refused)]
    assert admitting, f"{name}: the document now refuses {refused!r} everywhere; remove it from UNDECLARED"


#: a value each declared form refuses, which the API refused before the document said so (issue 34's leftovers)
DECLARED = {"limit": "many", "state": "sleepy", "by": "colour", "format": "xml", "metric": "no_such_metric",
            "step": "0ms", "start": "2026-52-52T00:00:00Z", "end": "2026-13-01T25:00:00Z"}


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_the_document_refuses_what_the_api_refuses(name: str) -> None:
    """Every operation that takes the parameter declares a form that refuses the value, and the API answers
    400 naming the parameter where the declared form refuses it."""
    document = TestClient(APP).get("/openapi.json").json()
    declared = _parameters(document, name)
    assert declared, name
    admitting = [path for path, form in declared if _accepts(form, DECLARED[name])]
    assert not admitting, f"{name}: {admitting} still admit {DECLARED[name]!r}"
    client = TestClient(APP)
    for path, _form in declared:
        url = path.format(namespace="team-a", name="train", uid="uid-train", project="alpha", node="node-a",
                          uuid="GPU-0")
        answer = client.get(url, params={name: DECLARED[name]})
        assert answer.status_code == 400 and answer.json()["parameter"] == name, (url, answer.text)
        assert repr(DECLARED[name]) in answer.json()["message"] or DECLARED[name] in answer.json()["message"]
