"""A pod whose owner changes moves to its new workload when the controller learns it, not from its start.

`kubectl delete job --cascade=orphan` has the garbage collector strip the pod's ownerReferences; the
pod's next event resolves it to itself. Its Running start is hours back: sent from there, the move
took all of the Job's time with it (seen on a real API server, tests/envtest/test_real_cluster_rules.py).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuwm.config import Settings
from gpuwm.controller.kube.client import KubeClient
from gpuwm.controller.runtime import ControllerRuntime
from gpuwm.controller.watch.owners import OwnerResolver
from gpuwm.controller.watch.units import NodeSharing
from gpuwm.feed.decode import DeviceHolder

from .test_pods_agents import pod_body

STARTED = 1767225630.0  # the pod's container startedAt
JOB = {"apiVersion": "batch/v1", "kind": "Job",
       "metadata": {"name": "train", "namespace": "ns", "uid": "j1", "creationTimestamp": "2026-01-01T00:00:00Z"}}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _runtime(tmp_path: Path, clock: Clock) -> ControllerRuntime:
    settings = Settings(store=str(tmp_path / "gpuwm.db"), agents="static:n1=http://127.0.0.1:9")
    runtime = ControllerRuntime(settings, KubeClient("http://127.0.0.1:9"), clock=clock)

    async def fetch(api_version: str, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return JOB if (kind, name) == ("Job", "train") else None

    async def no_sharing(node: str) -> NodeSharing:
        return NodeSharing(default_shared_replicas=1)

    runtime.resolver = OwnerResolver(fetch)
    runtime.sharing.of_node = no_sharing  # type: ignore[method-assign]
    return runtime


def _seconds(runtime: ControllerRuntime, now: float) -> dict[str, float]:
    """kind -> allocated GPU-seconds."""
    return {figures.kind: figures.allocated_gpu_seconds for figures in runtime.engine.workloads(now)}


def _ends(runtime: ControllerRuntime, now: float) -> dict[str, float | None]:
    return {figures.kind: figures.end_time for figures in runtime.engine.workloads(now)}


def test_an_orphaned_pod_moves_at_the_event_and_later_events_stay_after_it(tmp_path: Path) -> None:
    clock = Clock(STARTED + 100)
    runtime = _runtime(tmp_path, clock)
    owned = pod_body({"nvidia.com/gpu": "1"})
    owned["spec"]["containers"][0]["name"] = "c0"
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j1",
                                             "controller": True}]
    asyncio.run(runtime.on_pod(owned, "ADDED"))
    assert _seconds(runtime, clock.now) == pytest.approx({"Job": 100.0})

    clock.now = STARTED + 160  # the garbage collector strips its ownerReferences
    orphaned = copy.deepcopy(owned)
    del orphaned["metadata"]["ownerReferences"]
    asyncio.run(runtime.on_pod(orphaned, "MODIFIED"))
    clock.now = STARTED + 170
    assert _seconds(runtime, clock.now) == pytest.approx({"Job": 160.0, "Pod": 10.0})
    assert _ends(runtime, clock.now) == {"Job": STARTED + 160, "Pod": None}

    # an agent names its device: the pod's event is sent again, from its start, but not before the move
    runtime.state.holders_by_pod = {"p1": [DeviceHolder(uuid="GPU-a", namespace="ns", pod="train-0", pod_uid="p1",
                                                        container="c0", units=None)]}
    runtime._send(runtime.state.pods["p1"])
    clock.now = STARTED + 180
    seconds = _seconds(runtime, clock.now)
    assert seconds == pytest.approx({"Job": 160.0, "Pod": 20.0})
    assert sum(seconds.values()) == pytest.approx(180.0)  # one GPU since its start, every second once
    assert _ends(runtime, clock.now) == {"Job": STARTED + 160, "Pod": None}
