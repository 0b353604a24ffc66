"""The CRDs in crds/ agree with the pydantic models, field by field, and carry what DESIGN §4 asks."""

from __future__ import annotations

import importlib.util
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

from gpuwm.model.crd import (
    ProjectMetricsSpec,
    ProjectMetricsStatus,
    WorkloadMetricsSpec,
    WorkloadMetricsStatus,
)
from gpuwm.model.policy import IdlePolicySpec, IdlePolicyStatus

ROOT = Path(__file__).resolve().parents[3]
CRDS = ROOT / "crds"
_spec = importlib.util.spec_from_file_location("generate_crds", ROOT / "scripts" / "generate-crds.py")
assert _spec is not None and _spec.loader is not None
_generate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_generate)
CRD_FILES: dict[str, Any] = _generate.CRD_FILES
render = _generate.render


def _load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CRDS / name).read_text())
    return loaded


@pytest.mark.parametrize("name", sorted(CRD_FILES))
def test_committed_crds_are_what_the_models_generate(name: str) -> None:
    assert (CRDS / name).read_text() == render(name), f"crds/{name} is stale: run python scripts/generate-crds.py crds/"


def _schema_type(annotation: Any) -> tuple[str, bool]:
    """(structural schema type, nullable) for a model field annotation."""
    origin = get_origin(annotation)
    nullable = False
    if origin in (typing.Union, types.UnionType):
        options = [option for option in get_args(annotation) if option is not type(None)]
        nullable = len(options) < len(get_args(annotation))
        assert len(options) == 1
        annotation = options[0]
        origin = get_origin(annotation)
    if origin is Literal or annotation is str:
        return "string", nullable
    if origin is list:
        return "array", nullable
    if origin is dict or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return "object", nullable
    return {bool: "boolean", int: "integer", float: "number"}[annotation], nullable


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
        nested = [arg for arg in get_args(candidate) if isinstance(arg, type) and issubclass(arg, BaseModel)]
        if nested:
            return nested[0]
    return None


def _compare(model: type[BaseModel], schema: dict[str, Any], path: str) -> None:
    model_fields = {field.alias or name: field for name, field in model.model_fields.items()}
    schema_fields = schema.get("properties", {})
    assert set(model_fields) == set(schema_fields), (
        f"{path}: only in model {sorted(set(model_fields) - set(schema_fields))}, "
        f"only in CRD {sorted(set(schema_fields) - set(model_fields))}"
    )
    for name, field in model_fields.items():
        node = schema_fields[name]
        kind, nullable = _schema_type(field.annotation)
        assert node["type"] == kind, f"{path}.{name}: CRD type {node['type']}, model {kind}"
        assert bool(node.get("nullable")) == nullable, f"{path}.{name}: nullable differs"
        assert node.get("description"), f"{path}.{name} has no description"
        inner = _inner_model(field.annotation)
        if inner is not None:
            _compare(inner, node["items"] if kind == "array" else node, f"{path}.{name}")


@pytest.mark.parametrize(
    ("name", "spec", "status"),
    [
        ("gpuwm.io_gpuworkloadmetrics.yaml", WorkloadMetricsSpec, WorkloadMetricsStatus),
        ("gpuwm.io_gpuprojectmetrics.yaml", ProjectMetricsSpec, ProjectMetricsStatus),
        ("gpuwm.io_gpuidlepolicies.yaml", IdlePolicySpec, IdlePolicyStatus),
        ("gpuwm.io_clustergpuidlepolicies.yaml", IdlePolicySpec, IdlePolicyStatus),
    ],
)
def test_models_and_crd_schemas_agree_field_by_field(name: str, spec: type[BaseModel], status: type[BaseModel]) -> None:
    crd = _load(name)
    (version,) = crd["spec"]["versions"]
    root = version["schema"]["openAPIV3Schema"]
    _compare(spec, root["properties"]["spec"], "spec")
    _compare(status, root["properties"]["status"], "status")


def test_design_section_4_names_and_columns() -> None:
    workload = _load("gpuwm.io_gpuworkloadmetrics.yaml")
    project = _load("gpuwm.io_gpuprojectmetrics.yaml")
    assert workload["spec"]["group"] == project["spec"]["group"] == "gpuwm.io"
    assert workload["spec"]["scope"] == "Namespaced" and project["spec"]["scope"] == "Cluster"
    assert workload["spec"]["names"]["shortNames"] == ["gwm"] and project["spec"]["names"]["shortNames"] == ["gpm"]
    assert workload["spec"]["names"]["categories"] == ["gpuwm"]
    for crd in (workload, project):
        (version,) = crd["spec"]["versions"]
        assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [c["name"] for c in workload["spec"]["versions"][0]["additionalPrinterColumns"]]
    # DESIGN §4's columns, with the phase and the GPUs requested beside those held
    assert columns == ["Project", "Phase", "Requested", "GPUs", "Util", "Mem", "Idle", "Wasted GPU-h", "Age"]
    project_columns = [c["name"] for c in project["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert {"Requested", "Queued"} <= set(project_columns)
    status = workload["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert "Queued" in status["phase"]["enum"] and {"requestedGpus", "queuedSeconds"} <= set(status)
    project_status = project["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"requestedGpus", "queuedWorkloads", "longestQueuedSeconds"} <= set(project_status)
    for field in ["phase", "allocatedGpus", "gpuModel", "nodes", "pods", "gpus", "utilization", "memoryUtilization", "idleSeconds", "lastActiveTime", "allocatedGpuSeconds", "activeGpuSeconds", "idleGpuSeconds", "energyJoules", "waitSeconds", "runSeconds", "startTime", "endTime", "conditions", "observedGeneration", "lastUpdateTime"]:
        assert field in status, field
    gpu_fields = status["gpus"]["items"]["properties"]
    for field in ["node", "uuid", "index", "migProfile", "pod", "container", "utilizationPercent", "memoryUsedBytes", "memoryTotalBytes", "powerWatts", "healthy"]:
        assert field in gpu_fields, field
    assert set(status["utilization"]["properties"]) == {"current", "avg1m", "avg5m", "avg1h", "lifetime"}


def _nullable_to_jsonschema(node: Any) -> Any:
    if isinstance(node, dict):
        converted = {key: _nullable_to_jsonschema(value) for key, value in node.items() if key != "nullable"}
        if node.get("nullable") and "type" in node:
            converted["type"] = [node["type"], "null"]
        return converted
    if isinstance(node, list):
        return [_nullable_to_jsonschema(item) for item in node]
    return node


def test_a_status_built_from_the_model_validates_against_the_crd() -> None:
    crd = _load("gpuwm.io_gpuworkloadmetrics.yaml")
    schema = _nullable_to_jsonschema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    status = WorkloadMetricsStatus.model_validate(
        {
            "phase": "Running",
            "allocatedGpus": 1.5,
            "gpus": [{"node": "n1", "uuid": "GPU-a", "pod": "p", "units": 1.0, "utilizationPercent": None}],
            "utilization": {"current": 12.5, "avg1m": None},
            "conditions": [{"type": "Idle", "status": "False", "reason": "Active"}],
        }
    )
    spec = WorkloadMetricsSpec.model_validate(
        {"workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u"}, "project": "vision"}
    )
    document: dict[str, Any] = {
        "apiVersion": "gpuwm.io/v1alpha1",
        "kind": "GPUWorkloadMetrics",
        "metadata": {"name": "j", "namespace": "ml"},
        "spec": spec.model_dump(by_alias=True),
        "status": status.model_dump(by_alias=True),
    }
    jsonschema.validate(document, schema)
    document["status"]["allocatedGpus"] = "lots"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, schema)


@pytest.mark.parametrize(("name", "scope", "short"), [("gpuwm.io_gpuidlepolicies.yaml", "Namespaced", "gip"),
                                                      ("gpuwm.io_clustergpuidlepolicies.yaml", "Cluster", "cgip")])
def test_idle_policy_crds_default_to_a_dry_run_and_check_durations(name: str, scope: str, short: str) -> None:
    crd = _load(name)
    assert crd["spec"]["scope"] == scope and crd["spec"]["names"]["shortNames"] == [short]
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["dryRun"]["default"] is True  # the API server stores it: a policy acts only when told
    assert spec["required"] == ["idleFor", "actions"] and spec["properties"]["actions"]["minItems"] == 1
    pattern = spec["properties"]["idleFor"]["pattern"]
    checker = jsonschema.Draft7Validator({"type": "string", "pattern": pattern})
    assert checker.is_valid("30m") and checker.is_valid("1h30m") and checker.is_valid("45s")
    assert not checker.is_valid("30 minutes") and not checker.is_valid("")
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:2] == ["Dry Run", "Idle For"] and columns[-1] == "Age"
