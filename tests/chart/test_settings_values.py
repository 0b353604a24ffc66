"""Every option of gpuwm.config.Settings is a chart value of the same name and reaches both containers.

The fields are read at test time, so an option added to Settings later fails here until the
chart carries it (values.yaml, values.schema.json and the settingNames list in _helpers.tpl).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from gpuwm.config import Settings
from tests.chart.conftest import CHART, Installed, containers, env_of

VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
FIELDS = sorted(Settings.model_fields)

# Values whose empty default is filled in by the chart from where it runs.
DERIVED = {
    "node_name": "the pod's spec.nodeName (env NODE_NAME from the downward API)",
    "agents": "this release's agent pods: pods:<release namespace>/app.kubernetes.io/component=agent",
    "api_tls_cert_file": "the controller.tls Secret mounted at /etc/gpuwm/tls (tls.crt)",
    "api_tls_key_file": "the controller.tls Secret mounted at /etc/gpuwm/tls (tls.key)",
    "api_tls_secret": "<release>-controller-tls with controller.tls.source selfSigned",
    "api_tls_dns_names": "the API Service's DNS names with controller.tls.source selfSigned",
    "state_secret": "<release>-controller-state, in the controller's Role",
}
# Values the chart sets on purpose to something other than the program's default.
CHART_DEFAULTS: dict[str, tuple[Any, str]] = {}
# A value for each option whose chart default is empty, to see it reach the containers.
SAMPLES = {
    "node_name": "gpu-node-1",
    "kubelet_url": "https://127.0.0.1:10250",
    "namespace": "team-a",
    "agents": "static:gpu-node-1=http://10.0.0.1:9400",
    "cluster_id": "3f1c2a9e-0000-4000-8000-000000000001",
    "device_plugin_config": "gpu-operator/time-slicing-config/any",
    "api_tls_cert_file": "/etc/custom-tls/tls.crt",
    "api_tls_key_file": "/etc/custom-tls/tls.key",
    "api_tls_secret": "custom-api-tls",
    "api_tls_dns_names": "api.example.com,gpuwm.example.com",
    "runai_user_label": "example.com/user",
    "liveness": "http://0.0.0.0:8081/healthz",
    "peering_priority": 666,
    "state_secret": "kept-state",
}


def env_name(field: str) -> str:
    alias = Settings.model_fields[field].validation_alias
    return alias if isinstance(alias, str) else f"GPUWM_{field.upper()}"


@pytest.mark.parametrize("field", FIELDS)
def test_setting_is_a_value_with_a_schema(field: str) -> None:
    name = Settings.helm_value_name(field)
    assert name in VALUES, f"Settings.{field} has no value `{name}` in charts/gpuwm/values.yaml"
    assert name in SCHEMA["properties"], f"Settings.{field} has no `{name}` in charts/gpuwm/values.schema.json"


@pytest.mark.parametrize("field", FIELDS)
def test_value_default_is_the_settings_default(field: str) -> None:
    value = VALUES.get(Settings.helm_value_name(field))
    if field in DERIVED:
        assert value == "", f"{field}: the chart derives it ({DERIVED[field]}); values.yaml leaves it empty"
        return
    if field in CHART_DEFAULTS:
        assert value == CHART_DEFAULTS[field][0], f"{field}: {CHART_DEFAULTS[field][1]}"
        return
    default = Settings.model_fields[field].get_default(call_default_factory=True)
    if isinstance(default, BaseModel):  # a nested option (pricing, idlePolicies): compared as its fields
        default = default.model_dump()
    if value == "" and default is None:
        return
    assert Settings(**{field: value}).model_dump()[field] == default, (
        f"values.yaml `{Settings.helm_value_name(field)}: {value!r}` is not Settings.{field}'s default {default!r}"
    )


def test_values_yaml_passes_its_own_schema() -> None:
    from jsonschema import Draft7Validator

    errors = [f"{list(e.path)}: {e.message}" for e in Draft7Validator(SCHEMA).iter_errors(VALUES)]
    assert not errors, errors


def test_schema_is_strict_at_every_level() -> None:
    """additionalProperties: false on every object whose keys the chart defines."""
    loose = []

    def walk(schema: dict[str, Any], where: str) -> None:
        if "properties" in schema and schema.get("additionalProperties") is not False:
            loose.append(where or "/")
        for key, sub in schema.get("properties", {}).items():
            walk(sub, f"{where}/{key}")
        if isinstance(schema.get("items"), dict):
            walk(schema["items"], f"{where}[]")

    walk(SCHEMA, "")
    assert not loose, f"values.schema.json accepts unknown keys under {loose}"
    chart_keys = set(VALUES) | {"global"}
    assert set(SCHEMA["properties"]) == chart_keys, set(SCHEMA["properties"]) ^ chart_keys


@pytest.fixture
def installed_with_every_setting(install: Callable[..., Installed]) -> Installed:
    values = {Settings.helm_value_name(field): sample for field, sample in SAMPLES.items()}
    installed = install(values=values)
    assert installed.ok, installed.error
    return installed


@pytest.mark.parametrize("component", ["controller", "agent"])
def test_every_setting_reaches_the_container_as_its_env_var(
    installed_with_every_setting: Installed, component: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kind = "Deployment" if component == "controller" else "DaemonSet"
    env = env_of(containers(installed_with_every_setting.one(kind))[component])
    missing = [f"{field} ({env_name(field)})" for field in FIELDS if env_name(field) not in env]
    assert not missing, f"the {component} container lacks env for {missing}"
    # The program reads those variables back into the values the chart was given.
    for name in list(os.environ):
        if name.startswith("GPUWM_") or name == "NODE_NAME":
            monkeypatch.delenv(name)
    for entry in env.values():
        if "value" in entry:
            monkeypatch.setenv(entry["name"], entry["value"])
    settings = Settings()
    for field in FIELDS:
        given = {**VALUES, **{Settings.helm_value_name(f): s for f, s in SAMPLES.items()}}[Settings.helm_value_name(field)]
        if component == "agent" and field == "proc_root":
            continue
        expected = Settings(**{field: given}).model_dump()[field]
        assert settings.model_dump()[field] == expected, f"{env_name(field)}={env[env_name(field)]} in the {component}"


def test_node_name_defaults_to_the_pods_node(install: Callable[..., Installed]) -> None:
    installed = install()
    assert installed.ok, installed.error
    node_name = env_of(containers(installed.one("DaemonSet"))["agent"])["NODE_NAME"]
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    agents = env_of(containers(installed.one("Deployment"))["controller"])["GPUWM_AGENTS"]
    assert agents["value"] == "pods:gpuwm/app.kubernetes.io/component=agent"
