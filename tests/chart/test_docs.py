"""docs/install.md documents every value, and the chart renders the same for the same values (GitOps)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import yaml

from tests.chart.conftest import CHART, ROOT, Installed

DOCS = (ROOT / "docs" / "install.md").read_text()
# Maps under these keys are the user's own content (Kubernetes fields), documented as one value.
OPAQUE = {"affinity", "resources", "updateStrategy", "nodeSelector", "podAnnotations", "podLabels", "annotations",
          "labels", "commonLabels"}


def value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in OPAQUE:
            paths.extend(value_paths(value, path + "."))
        else:
            paths.append(path)
    return paths


def test_every_value_is_in_the_docs_table() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [path for path in value_paths(values) if f"| `{path}` |" not in DOCS]
    assert not missing, f"docs/install.md has no table row for {missing}"


def test_docs_name_the_crd_upgrade_path() -> None:
    assert "kubectl apply --server-side -f charts/gpuwm/crds/" in DOCS
    for section in ("## Install", "## Upgrade", "## Uninstall", "## GitOps"):
        assert section in DOCS


def test_templates_are_deterministic() -> None:
    """No random names, lookups or timestamps: Argo CD and Flux see no drift on chart objects."""
    for template in (CHART / "templates").glob("*"):
        text = template.read_text()
        found = re.findall(r"\b(rand\w+|lookup|now|uuidv4|genCA|genSelfSignedCert|genPrivateKey)\b", text)
        assert not found, f"{template.name} uses {found}"


def test_two_installs_render_identical_objects(install: Callable[..., Installed]) -> None:
    def rendered() -> dict[tuple[str, str], Any]:
        installed = install(ROOT / ".ci" / "all-features-values.yaml")
        assert installed.ok, installed.error
        objects = {}
        for obj in installed.chart_objects():
            if obj["metadata"]["name"].endswith(("monitoring.coreos.com", "cert-manager.io")):
                continue  # the test's stand-ins for the Prometheus Operator and cert-manager, not the chart's
            metadata = {k: v for k, v in obj["metadata"].items() if k not in ("uid", "resourceVersion")}
            objects[(obj["kind"], obj["metadata"]["name"])] = {**obj, "metadata": metadata}
        store = installed.server.store.objects
        for key in [key for key, obj in store.items() if (obj["kind"], obj["metadata"]["name"]) in objects]:
            del store[key]
        return objects

    assert rendered() == rendered()
