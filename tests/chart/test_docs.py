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


def section(text: str, heading: str) -> str:
    """The text under `heading` (a whole line, e.g. "## Upgrade") up to the next heading of its level or above."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    assert heading in lines, f"docs/install.md has no section {heading!r}"
    start = lines.index(heading) + 1
    fenced = False  # a `# comment` inside a ``` block is no heading
    for end in range(start, len(lines)):
        fenced ^= lines[end].startswith("```")
        if not fenced and re.match(rf"#{{1,{level}}} ", lines[end]):
            return "\n".join(lines[start:end])
    return "\n".join(lines[start:])


def yaml_blocks(text: str) -> list[dict[str, Any]]:
    """Every document of every ```yaml block, in order (a block that does not parse raises, naming its start)."""
    documents: list[dict[str, Any]] = []
    for match in re.finditer(r"^```yaml\n(.*?)^```$", text, re.M | re.S):
        line = text.count("\n", 0, match.start()) + 1
        try:
            parsed = list(yaml.safe_load_all(match.group(1)))
        except yaml.YAMLError as error:
            raise AssertionError(f"docs/install.md line {line}: its yaml block does not parse: {error}") from None
        for document in parsed:
            assert isinstance(document, dict), f"docs/install.md line {line}: a yaml document is not a map: {document!r}"
            documents.append(document)
    return documents


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
    """Over CRDs Helm made, a server-side apply conflicts (tests/envtest/test_crd_upgrade.py shows it)."""
    assert "kubectl apply --server-side --force-conflicts -f charts/gpuwm/crds/" in section(DOCS, "## Upgrade")
    for heading in ("## Image: build, mirror, tags", "## Install", "## Check your install", "## Dashboard and API access",
                    "## Sizing", "## Upgrade", "## Uninstall", "## GitOps: Argo CD and Flux", "### Reader roles",
                    "## Troubleshooting"):
        assert heading in DOCS.splitlines(), f"docs/install.md has no section {heading!r}"


def test_docs_yaml_blocks_parse_as_kubernetes_objects() -> None:
    objects = [document for document in yaml_blocks(DOCS) if "kind" in document]
    assert len(objects) >= 8, [obj.get("kind") for obj in objects]
    for obj in objects:
        assert obj.get("apiVersion") and obj.get("metadata", {}).get("name"), f"incomplete object in the doc: {obj}"


def test_docs_pin_no_release_tag() -> None:
    """No release is tagged yet: the examples pin a commit, and name tags only as the scheme vX.Y.Z."""
    assert not re.findall(r"\bv\d+\.\d+\.\d+", DOCS), "docs/install.md names a release tag that does not exist"
    gitops = yaml_blocks(section(DOCS, "## GitOps: Argo CD and Flux"))
    pins = [obj["spec"]["source"]["targetRevision"] for obj in gitops if obj["kind"] == "Application"]
    pins += [obj["spec"]["ref"] for obj in gitops if obj["kind"] == "GitRepository"]
    assert pins == ["<commit>", {"commit": "<commit>"}], pins


def test_flux_example_creates_the_namespace_with_its_pod_security_label() -> None:
    gitops = yaml_blocks(section(DOCS, "## GitOps: Argo CD and Flux"))
    release = next(obj for obj in gitops if obj["kind"] == "HelmRelease")
    namespaces = {obj["metadata"]["name"]: obj for obj in gitops if obj["kind"] == "Namespace"}
    namespace = namespaces.get(release["metadata"]["namespace"])
    assert namespace, f"the Flux example creates no Namespace {release['metadata']['namespace']!r}"
    assert namespace["metadata"]["labels"] == {"pod-security.kubernetes.io/enforce": "privileged"}


def test_troubleshooting_names_reasons_the_controller_writes() -> None:
    status_source = "".join(path.read_text() for path in (ROOT / "operator" / "gpuwm" / "controller").rglob("*.py"))
    rows = [line for line in section(DOCS, "## Troubleshooting").splitlines() if line.startswith("| ")][2:]
    reasons = {reason for row in rows for reason in re.findall(r"`([A-Z][a-z]+(?:[A-Z][a-z]+)+)`", row.split("|")[1])}
    assert {"SamplesMissing", "NotYetSampled", "AgentNotReporting"} <= reasons, reasons
    missing = [reason for reason in reasons if f'"{reason}"' not in status_source]
    assert not missing, f"docs/install.md's troubleshooting names condition reasons the controller never writes: {missing}"


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
