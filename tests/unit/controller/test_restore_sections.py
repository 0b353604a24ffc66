"""A controller restored from its sectioned state file (`runtime.save`): everything back, or, when a section
read half way through the restore is damaged, nothing (the runtime as it was, the CRs' status the fallback)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from gpuwm.config import Settings
from gpuwm.controller.kube.client import KubeClient
from gpuwm.controller.runtime import ControllerRuntime
from gpuwm.controller.state import recovery
from gpuwm.controller.state.persistence import SavedLines, load_state
from gpuwm.controller.watch.pods import TrackedPod
from gpuwm.feed.decode import DeviceHolder
from gpuwm.model.trace import TraceWorkload
from tests.unit.accounting.helpers import pod, sample

NOW = 1_800_000_000.0


def _runtime(tmp_path: Path) -> ControllerRuntime:
    settings = Settings(store=str(tmp_path / "gpuwm.db"), agents="static:n1=http://127.0.0.1:9")
    return ControllerRuntime(settings, KubeClient("http://127.0.0.1:9"))


def _busy_runtime(tmp_path: Path, pods: int = 80) -> ControllerRuntime:
    """`pods` one-GPU pods on 20 nodes, each with its holder and an engine that sampled them (more entries
    than a section batch)."""
    runtime = _runtime(tmp_path)
    for index in range(pods):
        node, uuid, uid = f"node-{index % 20}", f"GPU-{index}", f"pod-{index}"
        runtime.engine.observe(pod(NOW - 100, f"train-{index}", uid=uid, node=node, devices=[(uuid, 1.0)]))
        for t in range(90, 0, -10):
            runtime.engine.observe(sample(NOW - t, uuid, sm=float(index % 90), node=node))
        runtime.state.holders_by_node.setdefault(node, []).append(
            DeviceHolder(uuid=uuid, node=node, pod_uid=uid, namespace="ml", pod=f"train-{index}", container="main",
                         resource_name="nvidia.com/gpu", units=1.0))
        runtime.state.pods[uid] = TrackedPod(
            namespace="ml", name=f"train-{index}", uid=uid, phase="Running", node=node, labels={"team": "a"},
            units_by_container={"main": 1.0}, phase_since=NOW - 100, created=NOW - 100,
            workload=TraceWorkload(api_version="batch/v1", kind="Job", name=f"train-{index}", uid=f"job-{index}"))
    runtime.puller.restore_positions({"node-0": {"since": 17, "agent_id": "a"}})
    return runtime


def _same(restored: ControllerRuntime, saved: ControllerRuntime) -> None:
    assert orjson.dumps(restored.engine.save(), option=orjson.OPT_NON_STR_KEYS) == orjson.dumps(
        saved.engine.save(), option=orjson.OPT_NON_STR_KEYS)
    assert restored.state.holders_by_node == saved.state.holders_by_node
    assert restored.state.pods.keys() == saved.state.pods.keys()
    assert all(restored.state.pods[uid].workload == pod.workload and restored.state.pods[uid].labels == pod.labels
               for uid, pod in saved.state.pods.items())
    assert restored.puller.positions() == saved.puller.positions()


def test_a_saved_controller_comes_back_from_its_sections(tmp_path: Path) -> None:
    saved = _busy_runtime(tmp_path)
    saved.save(NOW)
    state = load_state(saved.state_path)
    assert state is not None
    assert isinstance(state["holders"], SavedLines) and len(state["holders"]) == 20
    assert isinstance(state["pods"], SavedLines) and isinstance(state["engine"]["gpus"], SavedLines)
    restored = _runtime(tmp_path)
    restored.restore_saved(state)
    _same(restored, saved)
    node = restored.state.holders_by_node["node-3"]
    assert node[0].node is node[1].node  # one string for the node, not one per holder
    assert node[0].model_fields_set is node[1].model_fields_set  # and one fields-set
    first, second = restored.state.pods["pod-0"].workload, restored.state.pods["pod-1"].workload
    assert first.model_fields_set is second.model_fields_set


@pytest.mark.parametrize("damaged", ["holders", "pods"])
def test_a_section_damaged_after_the_engine_leaves_the_runtime_as_it_was(tmp_path: Path, damaged: str) -> None:
    """The controller's holders and pods are read after the engine: a damaged one fails the restore, and the
    restored engine, holders and positions are not kept beside a fallback from the CRs (figures twice)."""
    saved = _busy_runtime(tmp_path)
    saved.save(NOW)
    data = saved.state_path.read_bytes()
    marker = b'{"node":"node-0","holders":[' if damaged == "holders" else b'{"namespace":"ml","name":"train-0",'
    start = data.index(marker)
    saved.state_path.write_bytes(data[:start] + b"[" + data[start + 1:])  # that line is no longer JSON
    state = load_state(saved.state_path)
    assert state is not None  # the frame is whole: the damage shows when the section is read
    restored = _runtime(tmp_path)
    with pytest.raises(ValueError):
        restored.restore_saved(state)
    assert restored.engine.workload_records == {} and restored.state.holders_by_node == {} and restored.state.pods == {}
    assert restored.puller.positions() == {}


def test_restore_falls_back_to_the_crs_on_a_damaged_section(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through `ControllerRuntime.restore`, as the controller starts: a warning, the CRs' source, no engine figures kept."""
    saved = _busy_runtime(tmp_path, pods=20)
    saved.client.cluster_identity = "http://127.0.0.1:9 kube-system-uid"
    saved.save(NOW)
    data = saved.state_path.read_bytes()
    start = data.index(b'{"node":"node-0","holders":[')
    saved.state_path.write_bytes(data[:start] + b"[" + data[start + 1:])
    restored = _runtime(tmp_path)

    async def no_crs(*_: object, **__: object) -> list[object]:
        return []

    async def same_cluster(_: object) -> str:
        return "http://127.0.0.1:9 kube-system-uid"

    monkeypatch.setattr(restored.client, "list_items", no_crs)
    monkeypatch.setattr(recovery, "cluster_identity", same_cluster)
    source = asyncio.run(restored.restore())
    assert source == "empty"
    assert "unusable" in caplog.text and "rebuilding from CR status" in caplog.text
    assert restored.engine.workload_records == {} and restored.state.holders_by_node == {}


def test_holders_saved_as_a_list_restore_alike(tmp_path: Path) -> None:
    """An eager snapshot holds each node's holders as a {"node", "holders"} entry, as the sections do."""
    import json

    saved = _busy_runtime(tmp_path, pods=20)
    state = json.loads(orjson.dumps(saved.snapshot(NOW), option=orjson.OPT_NON_STR_KEYS))
    assert isinstance(state["holders"], list) and {entry["node"] for entry in state["holders"]} == set(
        saved.state.holders_by_node)
    restored = _runtime(tmp_path)
    restored.restore_saved(state)
    _same(restored, saved)
