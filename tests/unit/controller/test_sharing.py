"""Time-slicing replicas from the cluster: node label, then the device plugin's ConfigMap, then the default."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwm.config import DEFAULT_RESOURCE_NAMES, Settings
from gpuwm.controller.kube.client import KubeApiError
from gpuwm.controller.watch.pods import track_pod
from gpuwm.controller.watch.sharing import SharingSource, parse_device_plugin_config
from gpuwm.controller.watch.units import NodeSharing, device_plugin_config_key, device_plugin_replicas
from gpuwm.model.trace import TraceWorkload

CONFIG_PATH = "/api/v1/namespaces/gpu-operator/configmaps/time-slicing-config"
FOUR_WAY = """
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""
TWO_WAY_RENAMED = """
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 2
"""
JOB = TraceWorkload(api_version="batch/v1", kind="Job", name="train", uid="job-1")


class FakeApi:
    """GET answers by path; counts calls; a status code raises like KubeClient does."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.objects = objects
        self.gets: list[str] = []

    async def get(self, path: str, params: Any = None) -> dict[str, Any] | None:
        self.gets.append(path)
        found = self.objects.get(path)
        if isinstance(found, int):
            raise KubeApiError(found, "GET", path, "forbidden", "Forbidden")
        return found


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}}}


def pod(resource: str = "nvidia.com/gpu", count: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "resources": {"limits": {resource: count}}}]}}


def source(api: FakeApi, config: str | None = None, default: int = 4) -> SharingSource:
    return SharingSource(api, default_shared_replicas=default, device_plugin_config=config,  # type: ignore[arg-type]
                         clock=lambda: 1000.0)


async def test_a_pod_on_a_node_labelled_four_replicas_holds_a_quarter() -> None:
    api = FakeApi({"/api/v1/nodes/n1": node("n1", **{"nvidia.com/gpu.replicas": "4"})})
    sharing = await source(api).of_node("n1")
    assert sharing.node_replicas == 4 and "node label" in sharing.source
    tracked = track_pod(pod(), JOB, DEFAULT_RESOURCE_NAMES, deleted=False, replicas=sharing)
    assert tracked.units_by_container == {"main": 0.25}
    two = track_pod(pod(count="2"), JOB, DEFAULT_RESOURCE_NAMES, deleted=False, replicas=sharing)
    assert two.units_by_container == {"main": 0.5}


async def test_the_configmap_speaks_for_nodes_without_the_label() -> None:
    api = FakeApi({"/api/v1/nodes/n1": node("n1"), CONFIG_PATH: {"data": {"any": FOUR_WAY}}})
    sharing = await source(api, "gpu-operator/time-slicing-config").of_node("n1")
    assert sharing.node_replicas is None and sharing.source.endswith("key any")
    tracked = track_pod(pod(), JOB, DEFAULT_RESOURCE_NAMES, deleted=False, replicas=sharing)
    assert tracked.units_by_container == {"main": 0.25}


async def test_the_node_label_wins_over_the_configmap() -> None:
    api = FakeApi({"/api/v1/nodes/n1": node("n1", **{"nvidia.com/gpu.replicas": "1"}),
                   CONFIG_PATH: {"data": {"any": FOUR_WAY}}})
    sharing = await source(api, "gpu-operator/time-slicing-config").of_node("n1")
    assert sharing.replicas_for("nvidia.com/gpu") == 1  # GFD says these GPUs are not shared
    assert CONFIG_PATH not in api.gets


async def test_per_node_config_key_and_default_key() -> None:
    api = FakeApi({
        "/api/v1/nodes/a100": node("a100", **{"nvidia.com/device-plugin.config": "a100"}),
        "/api/v1/nodes/plain": node("plain"),
        CONFIG_PATH: {"data": {"a100": TWO_WAY_RENAMED, "t4": FOUR_WAY}},
    })
    with_default = source(api, "gpu-operator/time-slicing-config/t4")
    a100 = await with_default.of_node("a100")
    assert a100.replicas_for("nvidia.com/gpu.shared") == 2 and a100.replicas_for("nvidia.com/gpu") == 1
    assert (await with_default.of_node("plain")).replicas_for("nvidia.com/gpu") == 4  # the default key
    without_default = source(api, "gpu-operator/time-slicing-config")
    assert (await without_default.of_node("plain")).source == "default"  # two keys, none chosen
    assert len([path for path in api.gets if path == CONFIG_PATH]) == 2  # cached per source


async def test_the_default_when_nothing_says() -> None:
    api = FakeApi({"/api/v1/nodes/n1": node("n1")})
    sharing = await source(api, default=4).of_node("n1")
    assert sharing.source == "default"
    assert track_pod(pod(), JOB, DEFAULT_RESOURCE_NAMES, deleted=False, replicas=sharing).units_by_container == {
        "main": 1.0}
    shared = track_pod(pod("nvidia.com/gpu.shared"), JOB, DEFAULT_RESOURCE_NAMES, deleted=False, replicas=sharing)
    assert shared.units_by_container == {"main": 0.25}


async def test_watched_node_labels_replace_a_get(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeApi({"/api/v1/nodes/n1": 403})
    sharing = source(api)
    sharing.on_node(node("n1", **{"nvidia.com/gpu.replicas": "8"}))
    assert (await sharing.of_node("n1")).node_replicas == 8 and api.gets == []
    sharing.on_node(node("n1", **{"nvidia.com/gpu.replicas": "2"}))
    assert (await sharing.of_node("n1")).node_replicas == 2
    assert not sharing.changes(node("n1", **{"nvidia.com/gpu.replicas": "2"}))  # a status update: no news
    assert sharing.changes(node("n1", **{"nvidia.com/gpu.replicas": "4"})) and sharing.changes(node("n9"))
    sharing.on_node(node("n1"), deleted=True)
    assert (await sharing.of_node("n1")).node_replicas is None  # forgotten: read again (403 here: default)
    assert (await sharing.of_node("n2")).source == "default"
    assert caplog.text.count("cannot read node") == 1  # warned once


async def test_an_unreadable_or_broken_configmap_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeApi({"/api/v1/nodes/n1": node("n1"), CONFIG_PATH: 403})
    assert (await source(api, "gpu-operator/time-slicing-config").of_node("n1")).source == "default"
    assert "cannot read the device plugin ConfigMap gpu-operator/time-slicing-config" in caplog.text
    api.objects[CONFIG_PATH] = {"data": {"any": "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu}]}}"}}
    assert (await source(api, "gpu-operator/time-slicing-config").of_node("n1")).source == "default"
    assert "key 'any'" in caplog.text and "replicas must be a positive integer" in caplog.text
    api.objects.pop(CONFIG_PATH)
    assert (await source(api, "gpu-operator/time-slicing-config").of_node("n1")).source == "default"
    assert "not found" in caplog.text


def test_device_plugin_replicas_reads_time_slicing_and_mps() -> None:
    assert device_plugin_replicas(FOUR_WAY) == {"nvidia.com/gpu": 4}
    assert device_plugin_replicas(TWO_WAY_RENAMED) == {"nvidia.com/gpu.shared": 2}
    mps = "sharing: {mps: {resources: [{name: nvidia.com/gpu, rename: nvidia.com/gpu.mps, replicas: 3}]}}"
    assert device_plugin_replicas(mps) == {"nvidia.com/gpu.mps": 3}
    assert device_plugin_replicas("version: v1\nflags: {migStrategy: none}") == {}
    with pytest.raises(ValueError, match=r"resources\[0\].replicas"):
        device_plugin_replicas("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 0}]}}")
    with pytest.raises(ValueError, match="not YAML"):
        device_plugin_replicas("sharing: [")


def test_config_key_choice() -> None:
    label = {"nvidia.com/device-plugin.config": "a100"}
    assert device_plugin_config_key(label, ["a100", "t4"], "t4") == "a100"
    assert device_plugin_config_key({}, ["a100", "t4"], "t4") == "t4"
    assert device_plugin_config_key({}, ["a100", "t4"], None) is None
    assert device_plugin_config_key({}, ["only"], None) == "only"
    assert device_plugin_config_key({"nvidia.com/device-plugin.config": "gone"}, ["t4"], "missing") is None


def test_node_sharing_precedence_is_explicit() -> None:
    assert NodeSharing(node_replicas=3, resource_replicas={"nvidia.com/gpu": 8}).replicas_for("nvidia.com/gpu") == 3
    assert NodeSharing(resource_replicas={"nvidia.com/gpu": 8}).replicas_for("nvidia.com/gpu") == 8
    assert NodeSharing(default_shared_replicas=5).replicas_for("nvidia.com/gpu.shared") == 5


def test_the_setting_is_validated() -> None:
    assert parse_device_plugin_config("gpu-operator/cfg/any") == ("gpu-operator", "cfg", "any")
    assert parse_device_plugin_config("kube-system/nvidia-plugin") == ("kube-system", "nvidia-plugin", None)
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        parse_device_plugin_config("just-a-name")
    with pytest.raises(ValueError, match="device_plugin_config"):
        Settings(device_plugin_config="Bad/Name")
