"""Agents served from a scripted trace: `/v1/snapshot?since=SEQ` in the agent's own format.

Samples are generated on demand, one per GPU per `interval` of wall-clock time, with the
utilisation of the node's current mode (busy/idle); `down` makes the agent stop answering
(the controller's pull times out), and `restart()` starts its sequence over with a new
agent_id, as a restarted agent does.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from gpuwm.feed import (
    DEVICES_TAG_PARAM,
    MergeRequest,
    columns_answer_json,
    merge_polls,
    merge_request,
    sample_columns,
)
from tests.integration.kubeemu import EmulatorThread


def merge_of(request: web.Request) -> MergeRequest | None:
    """The merge a pull asks for (`?merge_seconds=...`), as the agent reads it."""
    return merge_request({name: request.query.getall(name) for name in request.query})


@dataclass
class FakeNode:
    name: str
    gpus: list[str]
    interval: float = 1.0
    sm_percent: float = 0.0
    down: bool = False
    holders: list[dict[str, Any]] = field(default_factory=list)
    agent_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    seq: int = 0
    last_t: float | None = None
    energy_joules: float = 0.0
    samples: list[dict[str, Any]] = field(default_factory=list)
    served: int = 0
    merged_served: int = 0  # merged samples sent (a run of polls as one, when the controller asked)
    #: each sample's SM % drawn from sm_percent +- this (whole percents, as NVML reports them; seeded per node)
    sm_jitter_percent: float = 0.0

    def hold(self, gpu: str, namespace: str, pod: str, container: str = "main", units: float | None = 1.0,
             pod_uid: str | None = None) -> None:
        """Attribute `gpu` to a pod, as pod-resources would (namespace/name; the UID only when known)."""
        self.holders.append({"uuid": gpu, "device_id": gpu, "units": units, "resource_name": "nvidia.com/gpu",
                             "namespace": namespace, "pod": pod, "pod_uid": pod_uid, "container": container,
                             "state": "active", "attributed_by": "pod-resources"})

    def restart(self) -> None:
        self.agent_id, self.seq, self.samples = uuid.uuid4().hex, 0, []

    def _advance(self, now: float) -> None:
        if self.last_t is None:
            self.last_t = now - self.interval
        while self.last_t + self.interval <= now:
            self.last_t += self.interval
            power = 50.0 + 2.5 * self.sm_percent
            self.energy_joules += power * self.interval
            for index, gpu in enumerate(self.gpus):
                self.seq += 1
                sm_percent = self.sm_percent
                if self.sm_jitter_percent:
                    jitter = random.Random(f"{self.name}/{self.seq}").uniform(-self.sm_jitter_percent,
                                                                              self.sm_jitter_percent)
                    sm_percent = float(min(100, max(0, round(sm_percent + jitter))))
                self.samples.append({
                    "t": self.last_t, "node": self.name, "uuid": gpu, "seq": self.seq, "index": index,
                    "model": "NVIDIA H100 80GB HBM3", "sm_percent": sm_percent,
                    "memory_used_bytes": 40e9 if self.sm_percent else 1e9, "memory_total_bytes": 80e9,
                    "power_watts": power, "energy_joules": self.energy_joules, "healthy": True,
                })

    def snapshot(self, since: int, form: str | None = None, merge: MergeRequest | None = None) -> dict[str, Any]:
        """The agent's answer to `?since=SEQ&format=FORM`: rows by default, columns as the real agent encodes them.

        `merge`: runs of polls merged as the real agent merges them (`?merge_seconds=...`).
        """
        self._advance(time.time())
        self.served += 1
        samples: list[Any] = [s for s in self.samples if s["seq"] > since]
        if merge is not None:
            samples = merge_polls(samples, merge)
            self.merged_served += sum(1 for sample in samples if sample.get("merged_seconds"))
        head = {"node": self.name, "seq": self.seq, "agent_id": self.agent_id, "truncated": False}
        body = {**head, "format": "columns", **sample_columns(samples)} if form == "columns" else {**head, "samples": samples}
        return {**body, "pod_stats": [], "devices": self.holders}

    def snapshot_json(self, since: int, form: str | None = None, merge: MergeRequest | None = None,
                      devices_tag: str | None = None) -> bytes:
        """`snapshot` as the agent sends it: columns with their `gpus` and `devices` left out under the tag the
        puller holds (`?devices_tag=`, see `gpuwm.feed.encode.devices_members`)."""
        answer = self.snapshot(since, form, merge)
        return columns_answer_json(answer, devices_tag) if form == "columns" else orjson.dumps(answer)


class FakeAgents:
    """One HTTP server per node on 127.0.0.1, run on the emulator thread's loop."""

    def __init__(self, emulator_thread: EmulatorThread, nodes: list[FakeNode]) -> None:
        self.thread = emulator_thread
        self.nodes = {node.name: node for node in nodes}
        self.urls: dict[str, str] = {}
        self._runners: list[web.AppRunner] = []

    def start(self) -> FakeAgents:
        for node in self.nodes.values():
            self.urls[node.name] = self.thread.run(self._serve(node))
        return self

    async def _serve(self, node: FakeNode) -> str:
        async def snapshot(request: web.Request) -> web.Response:
            if node.down:
                await asyncio.sleep(30)  # longer than the controller's pull timeout
            return web.Response(body=node.snapshot_json(int(request.query.get("since", "0")), request.query.get("format"),
                                                        merge_of(request), request.query.get(DEVICES_TAG_PARAM)),
                                content_type="application/json")

        app = web.Application()
        app.router.add_get("/v1/snapshot", snapshot)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    def set(self, **changes: Any) -> None:
        def apply() -> None:
            for node in self.nodes.values():
                for key, value in changes.items():
                    setattr(node, key, value)
        self.thread.call(apply)

    def spec(self) -> str:
        return "static:" + ",".join(f"{name}={url}" for name, url in self.urls.items())

    def stop(self) -> None:
        for runner in self._runners:
            self.thread.run(runner.cleanup())
        self._runners.clear()
