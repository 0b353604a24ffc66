"""Cheap checks of the e2e tier's files that run everywhere: the scripts parse, the values pass the schema."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft7Validator

from tests.e2e.clusters import ROOT, E2eCluster, KindCluster
from tests.e2e.scene import _merge

E2E = Path(__file__).parent


def _chart_values(cluster: E2eCluster) -> dict[str, Any]:
    defaults = yaml.safe_load((ROOT / "charts" / "gpuwm" / "values.yaml").read_text())
    merged: dict[str, Any] = _merge(defaults, cluster.chart_values())
    return merged


def test_the_gpu_less_values_pass_the_charts_schema(tmp_path: Path) -> None:
    schema = json.loads((ROOT / "charts" / "gpuwm" / "values.schema.json").read_text())
    for cluster in (E2eCluster(kubeconfig=tmp_path, kubectl_path="kubectl", node_name="n", scenario_dir=tmp_path,
                               pod_resources_host_path="/tmp/gpuwm-node/kubelet/pod-resources"),
                    KindCluster(kubeconfig=tmp_path, kubectl_path="kubectl", node_name="n", scenario_dir=tmp_path)):
        errors = [error.message for error in Draft7Validator(schema).iter_errors(_chart_values(cluster))]
        assert not errors, errors


def test_run_sh_parses_and_the_kind_worker_is_a_gpu_node() -> None:
    assert subprocess.run(["bash", "-n", str(E2E / "run.sh")]).returncode == 0
    kind_config = yaml.safe_load((E2E / "kind-config.yaml").read_text())
    worker = next(node for node in kind_config["nodes"] if node["role"] == "worker")
    assert worker["labels"]["nvidia.com/gpu.present"] == "true"
    assert worker["extraMounts"][0]["hostPath"] == "/tmp/gpuwm-e2e"
