"""The docs name what is there: every page under docs/ is linked from the README, every package and
controller room is in docs/architecture.md, and docs/design.md's layer line is import-linter's contract."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "gpuwm"


def test_every_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    unlinked = [page.name for page in sorted((ROOT / "docs").glob("*.md")) if f"(docs/{page.name})" not in readme]
    assert not unlinked, f"README.md links no {unlinked}"


def test_every_package_and_controller_room_is_in_the_architecture_page() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    packages = [p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists() and p.name != "__pycache__"]
    rooms = [p.name for p in (PACKAGE / "controller").iterdir() if (p / "__init__.py").exists()]
    missing = [f"{name}/" for name in packages if f"{name}/" not in page]
    missing += [f"controller/{name}/" for name in rooms if f"{name}/" not in page]
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_the_design_pages_layer_line_is_the_layers_contract() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers" and "containers" not in c)
    expected = " → ".join(layer.replace("gpuwm.", "") for layer in layers)
    design = " ".join((ROOT / "docs" / "design.md").read_text().split())
    found = re.search(r"(cli → [^.(]*?)(?: \(|\.)", design)
    assert found and found.group(1).strip() == expected, (found and found.group(1), expected)
