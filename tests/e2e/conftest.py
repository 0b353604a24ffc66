"""The e2e tier's cluster: the real node on this machine, else kind, else a skip that says why.

`GPUWM_E2E_CLUSTER` picks one (`node`, `kind`; default: the node when `node.sh` reports it running,
else kind when Docker and kind are there). The node is started by `.ci/run` (`node.sh setup`, `start`)
or by hand; the tier never starts or stops it. Under CI (CI=true) a tier that finds no cluster fails
instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chart.conftest import find_helm_python
from tests.e2e.clusters import ROOT, E2eCluster, KindCluster, NodeCluster


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def node_script() -> Path:
    return Path(os.environ.get("NODE_SH") or ROOT.parent / "shared" / "envtest" / "node.sh")


def _kind_missing() -> str | None:
    for tool in ("docker", "kind", "kubectl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "the Docker daemon is not reachable (docker info failed)"
    return None


def _unavailable(reason: str) -> None:
    if in_ci():
        pytest.fail(f"the e2e tier must run under CI, but {reason}; .ci/run sets up and starts "
                    f"{node_script()}", pytrace=False)
    pytest.skip(reason)


def _connect(kind_wanted: str) -> E2eCluster:
    node_sh = node_script()
    node_reason = f"no {node_sh} (NODE_SH names another)" if not node_sh.exists() else ""
    if kind_wanted in {"auto", "node"} and not node_reason:
        try:
            return NodeCluster.connect(node_sh, Path(tempfile.mkdtemp(prefix="gpuwm-e2e-")))
        except RuntimeError as error:
            node_reason = str(error)
    if kind_wanted == "node":
        _unavailable(f"the real node cannot run: {node_reason}")
    kind_reason = _kind_missing()
    if kind_reason is None:
        scenario = Path("/tmp/gpuwm-e2e")  # kind-config.yaml mounts it into the worker
        scenario.mkdir(exist_ok=True)
        return KindCluster.create(scenario)
    _unavailable(f"no cluster for the e2e tier: the real node: {node_reason}; kind: {kind_reason}")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def cluster() -> Iterator[E2eCluster]:
    wanted = os.environ.get("GPUWM_E2E_CLUSTER", "auto")
    if wanted not in {"auto", "node", "kind"}:
        pytest.fail(f"GPUWM_E2E_CLUSTER={wanted!r}: expected node, kind or auto", pytrace=False)
    found = _connect(wanted)
    try:
        yield found
    finally:
        found.stop()


@pytest.fixture(scope="session")
def e2e_helm_python() -> str:
    found = find_helm_python()
    if found is None:
        _unavailable("helm-sdkpy needs Python >= 3.12 and no python3.12/python3.13 is on PATH")
    assert found is not None
    return found


#: the incremental steps' first failure, by module: the later steps build on it, so they are skipped
_FAILED: dict[str, str] = {}


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    if item.get_closest_marker("incremental") is not None and call.excinfo is not None and call.when == "call":
        _FAILED.setdefault(str(item.path), item.name)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("incremental") is not None:
        failed = _FAILED.get(str(item.path))
        if failed is not None:
            pytest.skip(f"an earlier step failed: {failed}")
