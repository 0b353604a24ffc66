"""Labels that come after a GPUWorkloadMetrics was created (its Kueue ClusterQueue, once admitted) are patched on."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuwm.controller.kube.ratelimit import TokenBucket
from gpuwm.controller.status.writer import Desired, StatusWriter


class Client:
    def __init__(self) -> None:
        self.creates: list[dict[str, Any]] = []
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        self.creates.append(body)
        return {"metadata": {"name": body["metadata"]["name"], "generation": 1}}

    async def merge_patch(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.patches.append((path, body))
        return {"metadata": {"generation": 1}}


def desired(**labels: str) -> Desired:
    return Desired(plural="gpuworkloadmetrics", namespace="ml", name="train", spec={},
                   labels={"gpuwm.io/project": "ml", **labels}, render=lambda: {"phase": "Queued"},
                   signature=("Queued",), counters=(0.0,))


def label_patches(client: Client) -> list[dict[str, str]]:
    return [body["metadata"]["labels"] for path, body in client.patches if not path.endswith("/status")]


async def test_a_cluster_queue_known_after_creation_is_patched_on_once() -> None:
    client = Client()
    writer = StatusWriter(client, TokenBucket(1000), interval_seconds=15)  # type: ignore[arg-type]
    await writer.write(desired(**{"gpuwm.io/local-queue": "team-a"}))
    assert client.creates[0]["metadata"]["labels"]["gpuwm.io/local-queue"] == "team-a"
    assert label_patches(client) == []  # created with them
    admitted = desired(**{"gpuwm.io/local-queue": "team-a", "gpuwm.io/cluster-queue": "gpus"})
    await writer.write(admitted)
    assert [labels.get("gpuwm.io/cluster-queue") for labels in label_patches(client)] == ["gpus"]
    await writer.write(admitted)
    assert len(label_patches(client)) == 1  # unchanged since: no second patch


async def test_an_adopted_cr_gets_its_queue_labels_and_no_patch_without_them() -> None:
    client = Client()
    writer = StatusWriter(client, TokenBucket(1000), interval_seconds=15)  # type: ignore[arg-type]
    writer.existing.update({("gpuworkloadmetrics", "ml", "train"), ("gpuworkloadmetrics", "ml", "other")})
    await writer.write(replace(desired(), name="other"))
    assert label_patches(client) == []  # a restart: no patch per CR for labels it was created with
    await writer.write(desired(**{"gpuwm.io/cluster-queue": "gpus"}))
    assert [labels.get("gpuwm.io/cluster-queue") for labels in label_patches(client)] == ["gpus"]
