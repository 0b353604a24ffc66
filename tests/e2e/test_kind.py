"""The kind e2e (tests/e2e/run.sh) under pytest; skipped where Docker or kind is missing.

It builds the image, creates a kind cluster, installs the chart and checks a fake-GPU pod's
GPUWorkloadMetrics and the metrics API. It takes minutes, so it runs only where the tools exist.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

RUN = Path(__file__).with_name("run.sh")


def _missing_tools() -> str | None:
    for tool in ("docker", "kind", "kubectl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True)
    if probe.returncode != 0:
        return "the Docker daemon is not reachable (docker info failed)"
    return None


def _merge(base: Any, overlay: Any) -> Any:
    """Helm's values merge: maps key by key, anything else replaced."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        return {**base, **{key: _merge(base.get(key), value) for key, value in overlay.items()}}
    return overlay


@pytest.mark.e2e
def test_kind_end_to_end() -> None:
    missing = _missing_tools()
    if missing:
        pytest.skip(f"kind e2e needs Docker and kind: {missing}; run `bash tests/e2e/run.sh` where they exist")
    done = subprocess.run(["bash", str(RUN)], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"tests/e2e/run.sh failed:\n{done.stderr[-6000:]}"
    assert "PASS" in done.stderr


def test_e2e_files_are_consistent() -> None:
    """Cheap checks that run everywhere: the script parses and its values pass the chart's schema."""
    import json

    import yaml
    from jsonschema import Draft7Validator

    assert subprocess.run(["bash", "-n", str(RUN)]).returncode == 0
    root = RUN.parents[2]
    schema = json.loads((root / "charts" / "gpuwm" / "values.schema.json").read_text())
    defaults = yaml.safe_load((root / "charts" / "gpuwm" / "values.yaml").read_text())
    values = _merge(defaults, yaml.safe_load(RUN.with_name("e2e-values.yaml").read_text()))
    errors = [e.message for e in Draft7Validator(schema).iter_errors(values)]
    assert not errors, errors
    kind_config = yaml.safe_load(RUN.with_name("kind-config.yaml").read_text())
    worker = next(node for node in kind_config["nodes"] if node["role"] == "worker")
    assert worker["labels"]["nvidia.com/gpu.present"] == "true"
