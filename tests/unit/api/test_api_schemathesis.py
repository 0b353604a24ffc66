"""Property tests from the OpenAPI document with every schemathesis check: no 5xx, every
response as documented, valid requests accepted and invalid ones refused; bounded to a few minutes.

positive_data_acceptance runs too. The document states every form the API reads (times with real days,
steps, `continue` tokens' alphabet), so a request it calls valid gets a 400 only for a rule no OpenAPI
schema can state (CANNOT_STATE): a rule across parameters (end before start), the answer's size (points per
response), what the server holds (a `continue` token it never gave), or how it is
configured (FOCUS charges without `pricing`). schemathesis is told 400 is an
accepted answer to valid data, and `refused_only_for_rules_the_document_cannot_state` holds every such 400
to that list, so a 400 for a value the document admits but the API does not (a pattern too loose, a missing
enum) still fails here; `test_the_document_admits_exactly_what_the_api_takes` holds the edges of each form."""

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
    ("end", re.compile(r"is before start")),  # across parameters
    ("aggregation", re.compile(r"min applies to gauges only")),  # across parameters: min of the metrics asked for
    # across parameters: min or max of a gauge whose roll-ups keep its mean only
    ("aggregation", re.compile(r"is kept for [a-z_, ]+ only")),
    ("continue", re.compile(r"is not a token this API gave")),  # what the server issued
    (None, re.compile(r"points")),  # the answer's size: series x points, apiMaxPointsPerResponse
    ("format", re.compile(r"set `pricing`")),  # how the server is configured: FOCUS charges need prices
]


@schemathesis.check
def refused_only_for_rules_the_document_cannot_state(ctx: Any, response: Any, case: Any) -> bool | None:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 400:
        return None
    body = response.json()
    parameter, message = body.get("parameter"), str(body.get("message", ""))
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


#: (parameter, value, whether the API takes it) at the edges of each declared form: the document must agree
EDGES = [
    ("start", "2024-02-29T00:00:00Z", True), ("start", "2023-02-29T00:00:00Z", False),
    ("start", "2100-02-29T00:00:00Z", False), ("start", "2000-02-29T00:00:00Z", True),
    ("start", "2026-04-31T00:00:00Z", False), ("start", "2026-12-31T23:59:59.5+14:00", True),
    ("start", "1970-01-01T00:30:00+01:00", True), ("start", "9999-12-31T23:30:00-01:00", True),
    ("start", "1969-12-31T23:59:59Z", False), ("start", "99999999999999999999", True), ("start", "1e9", False),
    ("step", "0.0001", True), ("step", "9999999999999999999s", True), ("step", "1m30s", True),
    ("step", "0s", False), ("step", "1e3", False), ("step", "-5s", False),
    ("continue", "WyJhIl0", True), ("continue", "é", False), ("continue", "", False),
]


@pytest.mark.parametrize(("name", "value", "taken"), EDGES)
def test_the_document_admits_exactly_what_the_api_takes(name: str, value: str, taken: bool) -> None:
    """Every operation that takes the parameter declares a form that admits the value exactly when the API
    reads it (for `continue`, reads its form: a token of that form it never gave is a rule of the server's)."""
    document = TestClient(APP).get("/openapi.json").json()
    declared = _parameters(document, name)
    assert declared, name
    assert all(_accepts(form, value) == taken for _path, form in declared), (name, value, declared[0][1])
    client = TestClient(APP)
    path = declared[0][0].format(namespace="team-a", name="train", uid="uid-train", project="alpha", node="node-a",
                                 uuid="GPU-0")
    answer = client.get(path, params={name: value})
    message = answer.json().get("message", "") if answer.status_code == 400 else ""
    refused_for_its_form = answer.status_code == 400 and not any(rule.search(message) for _, rule in CANNOT_STATE)
    assert refused_for_its_form != taken, (path, name, value, answer.text[:200])


#: a value each declared form refuses, which the API refuses too
DECLARED = {"limit": "many", "state": "sleepy", "by": "colour", "format": "xml", "metric": "no_such_metric",
            "step": "0ms", "start": "2026-52-52T00:00:00Z", "end": "2026-13-01T25:00:00Z", "continue": "no token"}


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
