"""The Run:ai names' `user` rests on the controller keeping the `runaiUserLabel` pod label: through
its pod handler a GPU pod's label reaches the workload's pod figures beside the project label (other labels
are dropped), and `runai_user` reads it there; unset, nothing beyond the project label is kept."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuwm.api.runai_metrics import runai_user
from gpuwm.config import Settings
from gpuwm.controller.kube.client import KubeClient
from gpuwm.controller.runtime import ControllerRuntime
from gpuwm.controller.watch.owners import OwnerResolver
from gpuwm.controller.watch.units import NodeSharing

from .test_pods_agents import pod_body

STARTED = 1767225630.0  # pod_body's container startedAt


def _runtime(tmp_path: Path, **settings: Any) -> ControllerRuntime:
    runtime = ControllerRuntime(
        Settings(store=str(tmp_path / "gpuwm.db"), agents="static:n1=http://127.0.0.1:9", **settings),
        KubeClient("http://127.0.0.1:9"), clock=lambda: STARTED + 60,
    )

    async def fetch(api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None  # no owner: the pod is its own workload

    async def no_sharing(node: str) -> NodeSharing:
        return NodeSharing(default_shared_replicas=1)

    runtime.resolver = OwnerResolver(fetch)
    runtime.sharing.of_node = no_sharing  # type: ignore[method-assign]
    return runtime


def _pod() -> dict[str, Any]:
    body = pod_body({"nvidia.com/gpu": "1"})
    body["metadata"]["labels"] = {"gpuwm.io/project": "vision", "runai/user": "alice", "app": "noise"}
    body["metadata"]["annotations"] = {"runai/user": "not-read"}
    return body


@pytest.mark.parametrize(
    ("settings", "kept", "user"),
    [
        ({"runai_user_label": "runai/user"}, {"gpuwm.io/project": "vision", "runai/user": "alice"}, "alice"),
        ({}, {"gpuwm.io/project": "vision"}, ""),
    ],
)
def test_the_pod_handler_keeps_the_user_label(
    tmp_path: Path, settings: dict[str, Any], kept: dict[str, str], user: str
) -> None:
    runtime = _runtime(tmp_path, **settings)
    asyncio.run(runtime.on_pod(_pod(), "ADDED"))
    (workload,) = runtime.engine.workloads(STARTED + 60)
    (pod,) = workload.pods
    assert pod.labels == kept
    assert runai_user(workload, runtime.settings.runai_user_label) == user
