"""Idle Events: one per idle spell, posted through the token bucket, core/v1 with eventTime."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuwm.controller.kube.ratelimit import TokenBucket
from gpuwm.controller.status.events import IdleEvents, idle_event_body
from gpuwm.model.figures import WorkloadFigures


def workload(uid: str, idle_seconds: float, phase: str = "Running") -> WorkloadFigures:
    return WorkloadFigures(uid=uid, namespace="ns", name=f"job-{uid}", kind="Job", api_version="batch/v1",
                           project="p", phase=phase, allocated_gpus=1.0, idle_seconds=idle_seconds)


class Client:
    def __init__(self) -> None:
        self.posted: list[tuple[str, dict[str, Any]]] = []

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.posted.append((path, body))
        return body


async def test_one_event_per_idle_spell() -> None:
    client = Client()
    events = IdleEvents(client, TokenBucket(1000), idle_after_seconds=600, clock=lambda: 1_767_225_600.0)  # type: ignore[arg-type]
    task = asyncio.create_task(events.run())
    events.announce([workload("a", 900), workload("b", 10), workload("c", 900, phase="Succeeded")],
                    {"a": "True", "b": "False", "c": "False"})
    events.announce([workload("a", 960)], {"a": "True"})  # still the same spell
    events.announce([workload("a", 975)], {"a": "Unknown"})  # its agent not reporting: the same spell still
    events.announce([workload("a", 990)], {"a": "True"})
    events.announce([workload("a", 0)], {"a": "False"})  # active again
    events.announce([workload("a", 700)], {"a": "True"})  # a new spell
    events.announce([workload("d", 900)], {"d": "Unknown"})  # idle by the clock, never observed: no Event
    await asyncio.sleep(0.05)
    task.cancel()
    assert [body["involvedObject"]["name"] for _, body in client.posted] == ["job-a", "job-a"]
    assert client.posted[0][0] == "/api/v1/namespaces/ns/events"


def test_event_body_is_a_core_event_with_event_time_on_the_workload() -> None:
    body = idle_event_body(workload("a", 900), "1 GPU(s) idle", 1_767_225_600.0)
    assert body["involvedObject"] == {"apiVersion": "batch/v1", "kind": "Job", "name": "job-a", "namespace": "ns",
                                      "uid": "a"}
    assert body["metadata"] == {"generateName": "job-a.", "namespace": "ns"}
    assert body["type"] == "Warning" and body["reason"] == "GpuIdle" and body["action"] == "Observe"
    assert body["eventTime"] == "2026-01-01T00:00:00.000000Z"  # MicroTime: six digits even when zero
    assert body["firstTimestamp"] == "2026-01-01T00:00:00Z"
    assert body["reportingComponent"] == "gpuwm-controller" and 0 < len(str(body["reportingInstance"])) <= 128
    long = idle_event_body(workload("b", 900), "x" * 5000, 1_767_225_600.5)
    assert len(str(long["message"])) == 1024 and str(long["eventTime"]).endswith(".500000Z")
