#!/usr/bin/env python3
"""Write the CRD YAML in crds/ from the pydantic models, so schema and models cannot drift.

    python scripts/generate-crds.py crds/     # then: python scripts/sync-crds.py

A unit test (tests/unit/model/test_crds.py) fails when the committed files differ from what
this writes, and another checks them field by field. A build step, not part of the package.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from gpuwm.model.crd import (
    GROUP,
    VERSION,
    ProjectMetricsSpec,
    ProjectMetricsStatus,
    WorkloadMetricsSpec,
    WorkloadMetricsStatus,
)
from gpuwm.model.policy import IdlePolicySpec, IdlePolicyStatus


def structural_schema(model: type[BaseModel], defaults: bool = False) -> dict[str, Any]:
    """A Kubernetes structural schema (no $ref, no anyOf-null) from a pydantic model.

    `defaults`: the fields' plain defaults go into the schema, so the API server fills them in (a spec's
    `dryRun: true` is then in the stored object, for every reader to see).
    """
    raw = model.model_json_schema(by_alias=True, mode="serialization")
    definitions = raw.get("$defs", {})

    def convert(node: dict[str, Any]) -> dict[str, Any]:
        if "$ref" in node:
            target = definitions[node["$ref"].split("/")[-1]]
            merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            return convert(merged)
        if "anyOf" in node:
            options = [option for option in node["anyOf"] if option.get("type") != "null"]
            nullable = len(options) < len(node["anyOf"])
            if len(options) != 1:
                raise ValueError(f"cannot express a union of {options} in a structural schema")
            converted = convert({**options[0], **({"format": node["format"]} if "format" in node else {})})
            if "description" in node:
                converted["description"] = node["description"]
            if defaults and node.get("default") is not None:
                converted["default"] = node["default"]
            if nullable:
                converted["nullable"] = True
            return converted
        result: dict[str, Any] = {}
        if "description" in node:
            result["description"] = " ".join(str(node["description"]).split())
        kind = node.get("type")
        if "const" in node:
            result["type"] = "string"
            result["enum"] = [node["const"]]
        elif "enum" in node:
            result["type"] = "string"
            result["enum"] = list(node["enum"])
        elif kind == "object":
            result["type"] = "object"
            if "properties" in node:
                result["properties"] = {name: convert(child) for name, child in node["properties"].items()}
                if node.get("required"):
                    result["required"] = list(node["required"])
            elif isinstance(node.get("additionalProperties"), dict):
                result["additionalProperties"] = convert(node["additionalProperties"])
        elif kind == "array":
            result["type"] = "array"
            result["items"] = convert(node.get("items", {}))
            if "maxItems" in node:  # the API server enforces it: a status that would outgrow etcd is refused early
                result["maxItems"] = node["maxItems"]
            if "minItems" in node:
                result["minItems"] = node["minItems"]
        elif kind in ("string", "integer", "number", "boolean"):
            result["type"] = kind
            if kind == "string" and node.get("format") == "date-time":
                result["format"] = "date-time"
            if kind == "string" and "pattern" in node:  # a duration: refused by the API server when malformed
                result["pattern"] = node["pattern"]
        else:
            raise ValueError(f"unsupported schema node {node}")
        if defaults and node.get("default") is not None and not isinstance(node["default"], list | dict):
            result["default"] = node["default"]
        return result

    return convert(raw)


def _printer_columns(rows: list[tuple[str, str, str, str]]) -> list[dict[str, Any]]:
    columns = [{"name": name, "type": kind, "jsonPath": path, "description": text} for name, kind, path, text in rows]
    columns.append({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"})
    return columns


def _crd(
    kind: str,
    plural: str,
    short_name: str,
    scope: str,
    spec: type[BaseModel],
    status: type[BaseModel],
    description: str,
    columns: list[tuple[str, str, str, str]],
    spec_defaults: bool = False,
    singular: str | None = None,
) -> dict[str, Any]:
    schema = {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": structural_schema(spec, defaults=spec_defaults),
            "status": structural_schema(status),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "gpuwm", "app.kubernetes.io/part-of": "gpuwm"},
        },
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular or plural,
                "shortNames": [short_name],
                "categories": ["gpuwm"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(columns),
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def workload_metrics_crd() -> dict[str, Any]:
    return _crd(
        "GPUWorkloadMetrics",
        "gpuworkloadmetrics",
        "gwm",
        "Namespaced",
        WorkloadMetricsSpec,
        WorkloadMetricsStatus,
        "GPU allocation, utilisation, idle time and energy of one workload, kept by the gpuwm controller.",
        [
            ("Project", "string", ".spec.project", "Project of the workload."),
            ("Phase", "string", ".status.phase", "Queued, Pending, Running, Succeeded, Failed or Ended."),
            ("Requested", "number", ".status.requestedGpus", "GPU units its pod templates ask for."),
            ("GPUs", "number", ".status.allocatedGpus", "GPU units held now."),
            ("Util", "number", ".status.utilization.avg5m", "SM utilisation percent, 5-minute mean."),
            ("Mem", "number", ".status.memoryUtilization.avg5m", "Memory used percent, 5-minute mean."),
            # a date: kubectl shows its age, current at every `get`, however long ago the status was written
            ("Idle", "date", ".status.idleSince", "How long the GPUs have been idle (blank while active)."),
            ("Wasted GPU-h", "number", ".status.wastedGpuHours", "Idle GPU-hours over the workload's life."),
        ],
    )


def project_metrics_crd() -> dict[str, Any]:
    return _crd(
        "GPUProjectMetrics",
        "gpuprojectmetrics",
        "gpm",
        "Cluster",
        ProjectMetricsSpec,
        ProjectMetricsStatus,
        "GPU allocation, utilisation, idle GPUs and energy of one project, kept by the gpuwm controller.",
        [
            ("Project", "string", ".spec.project", "Project name."),
            ("Workloads", "integer", ".status.workloads", "Workloads with figures."),
            ("GPUs", "number", ".status.allocatedGpus", "GPU units held now."),
            ("Requested", "number", ".status.requestedGpus", "GPU units its queued and pending workloads ask for."),
            ("Queued", "integer", ".status.queuedWorkloads", "Workloads held back."),
            ("Quota", "number", ".status.quota", "GPU quota."),
            ("Idle GPUs", "number", ".status.idleGpus", "Units held whose latest sample was inactive."),
            ("Util", "number", ".status.utilization.avg5m", "SM utilisation percent, 5-minute mean."),
            ("Mem", "number", ".status.memoryUtilization.avg5m", "Memory used percent, 5-minute mean."),
            ("Wasted GPU-h", "number", ".status.wastedGpuHours", "Idle GPU-hours."),
        ],
    )


_POLICY_COLUMNS = [
    ("Dry Run", "boolean", ".spec.dryRun", "Lists what it would do and changes nothing."),
    ("Idle For", "string", ".spec.idleFor", "Observed idle time that triggers it."),
    ("Matched", "integer", ".status.matchedWorkloads", "Workloads it covers now."),
    ("Idle", "integer", ".status.idleWorkloads", "Of those, how many trigger it now."),
    ("Taken", "integer", ".status.actionsTaken", "Actions that succeeded."),
    ("Failed", "integer", ".status.actionsFailed", "Actions that failed."),
]


def idle_policy_crd() -> dict[str, Any]:
    return _crd(
        "GPUIdlePolicy",
        "gpuidlepolicies",
        "gip",
        "Namespaced",
        IdlePolicySpec,
        IdlePolicyStatus,
        "What to do about idle GPU workloads in this namespace: warn, scale to zero, suspend (a dry run by default).",
        _POLICY_COLUMNS,
        spec_defaults=True,
        singular="gpuidlepolicy",
    )


def cluster_idle_policy_crd() -> dict[str, Any]:
    return _crd(
        "ClusterGPUIdlePolicy",
        "clustergpuidlepolicies",
        "cgip",
        "Cluster",
        IdlePolicySpec,
        IdlePolicyStatus,
        "A platform's defaults for idle GPU workloads in every namespace it selects: warn, scale to zero, suspend "
        "(a dry run by default).",
        _POLICY_COLUMNS,
        spec_defaults=True,
        singular="clustergpuidlepolicy",
    )


CRD_FILES = {
    "gpuwm.io_gpuworkloadmetrics.yaml": workload_metrics_crd,
    "gpuwm.io_gpuprojectmetrics.yaml": project_metrics_crd,
    "gpuwm.io_gpuidlepolicies.yaml": idle_policy_crd,
    "gpuwm.io_clustergpuidlepolicies.yaml": cluster_idle_policy_crd,
}


def render(builder_name: str) -> str:
    header = "# Generated from operator/gpuwm/model/crd.py by `python scripts/generate-crds.py crds/`; do not edit.\n"
    return header + yaml.safe_dump(CRD_FILES[builder_name](), sort_keys=False, width=120)


def main(argv: list[str]) -> int:
    target = Path(argv[0] if argv else "crds")
    target.mkdir(parents=True, exist_ok=True)
    for name in CRD_FILES:
        (target / name).write_text(render(name), encoding="utf-8")
        print(f"wrote {target / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
