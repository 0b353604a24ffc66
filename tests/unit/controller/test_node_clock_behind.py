"""A pod whose container start (the node's clock) reads earlier than its creation (the API server's clock).

The controller tells the engine a pod's phase at the time it began: Pending at creation, Running at the
container's start. A node whose clock is a second behind the API server stamps the start before the
creation; placed by those times, Running would come before Pending in the engine's timeline and the
running pod would count as Pending for good (seen on a real API server: tests/envtest/test_workload_objects.py
made its pods within a second boundary and one of three read 0 GPUs).
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest

from .test_pods_agents import pod_body
from .test_runai_user_label import _runtime

CREATED = 1767225600.0  # pod_body's creationTimestamp, 2026-01-01T00:00:00Z


def test_running_before_creation_still_runs(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    pending = pod_body({"nvidia.com/gpu": "1"}, phase="Pending")
    pending["status"] = {"phase": "Pending"}
    running = copy.deepcopy(pod_body({"nvidia.com/gpu": "1"}))
    # the node's clock a second behind: the container started "before" the pod was created
    running["status"]["containerStatuses"][0]["state"]["running"]["startedAt"] = "2025-12-31T23:59:59Z"
    asyncio.run(runtime.on_pod(pending, "ADDED"))
    asyncio.run(runtime.on_pod(running, "MODIFIED"))
    (workload,) = runtime.engine.workloads(CREATED + 60)
    assert workload.phase == "Running"
    assert workload.allocated_gpus == pytest.approx(1.0)
    # held from its creation (the earliest a phase can start) to now
    assert workload.allocated_gpu_seconds == pytest.approx(60.0)
