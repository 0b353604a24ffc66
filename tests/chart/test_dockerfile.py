"""The Dockerfile's promises, checked without Docker: multi-stage, slim, non-root, `gpuwm` entrypoint."""

from __future__ import annotations

import json
import re

from tests.chart.conftest import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()
INSTRUCTIONS = [
    line.strip() for line in re.sub(r"\\\n", " ", DOCKERFILE).splitlines() if line.strip() and not line.startswith("#")
]


def _final_stage() -> list[str]:
    starts = [i for i, line in enumerate(INSTRUCTIONS) if line.upper().startswith("FROM ")]
    assert len(starts) >= 2, "the Dockerfile should be multi-stage (build, runtime)"
    return INSTRUCTIONS[starts[-1]:]


def test_runtime_stage_is_slim_python_311() -> None:
    base = _final_stage()[0].split()[1]
    assert re.fullmatch(r"python:\$\{PYTHON_VERSION\}-slim(-\w+)?", base), base
    assert "ARG PYTHON_VERSION=3.11" in INSTRUCTIONS


def test_runtime_stage_runs_as_a_numeric_non_root_user() -> None:
    users = [line.split()[1] for line in _final_stage() if line.upper().startswith("USER ")]
    assert users, "the runtime stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER should be numeric (runAsNonRoot checks it) and not 0"


def test_entrypoint_is_gpuwm_for_every_verb() -> None:
    entrypoints = [line for line in _final_stage() if line.upper().startswith("ENTRYPOINT ")]
    assert entrypoints and json.loads(entrypoints[-1].split(None, 1)[1]) == ["gpuwm"]


def test_runtime_stage_has_no_compiler_or_pip_cache() -> None:
    runtime = " ".join(_final_stage())
    assert "apt-get install" not in runtime and "pip install" not in runtime
    assert any(line.startswith("COPY --from=build") for line in _final_stage())


def test_dockerignore_keeps_venvs_and_git_out() -> None:
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    for pattern in (".git", ".venv*", "tests", "charts"):
        assert pattern in ignored, pattern


def test_the_dependency_step_leaves_no_build_of_its_placeholder_package() -> None:
    """The dependency layer installs a placeholder gpuwm; setuptools' build/ copy of its empty __init__.py is
    newer than the real one copied after it and would be packed instead (`gpuwm version` then fails)."""
    build = INSTRUCTIONS[:_final_stage_start()]
    placeholder = next(i for i, line in enumerate(build) if "touch operator/gpuwm/__init__.py" in line)
    assert "rm -rf operator build" in build[placeholder], build[placeholder]
    source = next(i for i, line in enumerate(build) if line.startswith("COPY operator"))
    assert placeholder < source
    assert "gpuwm version" in " ".join(build[source:]), "the build stage should run the installed `gpuwm version`"


def test_the_image_leaves_out_what_does_not_run_in_a_pod() -> None:
    """The official Kubernetes client (only for kubeconfigs outside a pod) is an extra; pip leaves the venv."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.split(">")[0].split("=")[0].strip() == "kubernetes"]
    assert any(d.startswith("kubernetes") for d in project["optional-dependencies"]["kubeconfig"])
    assert re.search(r"pip uninstall -y pip setuptools", " ".join(" ".join(INSTRUCTIONS).split()))


def _final_stage_start() -> int:
    return [i for i, line in enumerate(INSTRUCTIONS) if line.upper().startswith("FROM ")][-1]
