"""Which nodes' agents may merge polls as whole devices (`MergeRequest.exact_replicas` 1), and that the puller asks
them so: a node qualifies only when the controller knows every device there is held whole."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs, urlsplit

from aiohttp import web

from gpuwm.controller.pull import AgentPuller
from gpuwm.controller.watch import SharingSource, TrackedPod, whole_device_nodes
from gpuwm.feed import MergeRequest, merge_request
from gpuwm.feed.decode import DeviceHolder
from gpuwm.model.trace import TraceWorkload


class NoApi:
    async def get(self, path: str, params: Any = None) -> dict[str, Any] | None:
        raise AssertionError(f"the rule reads what is cached, it asks the API nothing ({path})")


def _sharing(labels: dict[str, dict[str, str]]) -> SharingSource:
    sharing = SharingSource(NoApi(), default_shared_replicas=4)  # type: ignore[arg-type]
    for name, node_labels in labels.items():
        sharing.on_node({"metadata": {"name": name, "labels": node_labels}})
    return sharing


def _pod(uid: str, node: str, units: float, phase: str = "Running") -> TrackedPod:
    return TrackedPod(
        namespace="ml", name=uid, uid=uid, phase=phase,  # type: ignore[arg-type]
        node=node, labels={}, units_by_container={"main": units},
        workload=TraceWorkload(api_version="batch/v1", kind="Job", name=uid, uid=f"job-{uid}", created=0.0),
    )


def _holder(uuid: str, uid: str | None, resource: str | None = "nvidia.com/gpu", device_id: str | None = None,
            units: float = 1.0) -> DeviceHolder:
    return DeviceHolder(uuid=uuid, device_id=device_id or uuid, pod_uid=uid, namespace="ml", pod=uid,
                        container="main", resource_name=resource, units=units)


def test_only_nodes_known_to_hold_every_device_whole_qualify() -> None:
    nodes = ["whole", "idle", "sliced", "unseen", "quarter-pod", "replica-id", "two-holders", "mig", "cgroup",
             "stranger", "ended-fraction", "agent-quarter"]
    sharing = _sharing({name: {} for name in nodes if name != "unseen"} | {"sliced": {"nvidia.com/gpu.replicas": "4"}})
    pods = [_pod("p-whole", "whole", 2.0), _pod("p-sliced", "sliced", 1.0), _pod("p-quarter", "quarter-pod", 0.25),
            _pod("p-replica", "replica-id", 1.0), _pod("p-two-a", "two-holders", 1.0),
            _pod("p-two-b", "two-holders", 1.0), _pod("p-mig", "mig", 1.0), _pod("p-cgroup", "cgroup", 1.0),
            _pod("p-ended", "ended-fraction", 0.5, phase="Succeeded"), _pod("p-ended-whole", "ended-fraction", 1.0),
            _pod("p-agent-quarter", "agent-quarter", 1.0)]
    holders = {
        "whole": [_holder("GPU-1", "p-whole"), _holder("GPU-2", "p-whole")],
        "sliced": [_holder("GPU-3", "p-sliced")],
        "quarter-pod": [],
        "replica-id": [_holder("GPU-4", "p-replica", device_id="GPU-4::2")],
        "two-holders": [_holder("GPU-5", "p-two-a"), _holder("GPU-5", "p-two-b")],
        "mig": [_holder("MIG-6", "p-mig", resource="nvidia.com/mig-1g.10gb")],
        "cgroup": [_holder("GPU-7", "p-cgroup", resource=None)],
        "stranger": [_holder("GPU-8", "p-nobody-tracks")],
        "ended-fraction": [_holder("GPU-9", "p-ended-whole")],
        "agent-quarter": [_holder("GPU-10", "p-agent-quarter", units=0.25)],  # the agent counts a replica
    }
    assert whole_device_nodes(nodes, sharing, pods, holders) == {"whole", "idle", "ended-fraction"}


def test_an_unread_device_plugin_config_keeps_every_node_out() -> None:
    sharing = SharingSource(NoApi(), default_shared_replicas=4,  # type: ignore[arg-type]
                            device_plugin_config="gpu-operator/device-plugin-config")
    sharing.on_node({"metadata": {"name": "n1", "labels": {}}})
    assert whole_device_nodes(["n1"], sharing, [], {}) == set()
    sharing.on_node({"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.replicas": "1"}}})  # the node says 1
    assert whole_device_nodes(["n1"], sharing, [], {}) == {"n1"}


def test_the_puller_asks_whole_device_nodes_for_whole_device_merging_and_the_others_as_before() -> None:
    asked: dict[str, MergeRequest | None] = {}

    async def snapshot(request: web.Request) -> web.Response:
        query = parse_qs(urlsplit(str(request.url)).query)
        asked[request.match_info["node"]] = merge_request(query)
        return web.Response(status=503)  # the answer does not matter here: what was asked does

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/{node}/v1/snapshot", snapshot)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        puller = AgentPuller(timeout_seconds=5.0, merge=MergeRequest(15.0, 1.0, 3.0))
        try:
            agents = {node: f"http://127.0.0.1:{port}/{node}" for node in ("n1", "n2")}
            await puller.pull_all(agents, whole_devices={"n2"})
        finally:
            await puller.close()
            await runner.cleanup()

    asyncio.run(scenario())
    assert asked == {"n1": MergeRequest(15.0, 1.0, 3.0), "n2": MergeRequest(15.0, 1.0, 3.0, exact_replicas=1)}
