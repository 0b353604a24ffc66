"""The fleet views beyond the store's series limit: 2,080 GPUs (260 nodes of 8), more devices than one store
query may answer (MAX_SERIES_PER_QUERY), list, page and answer Run:ai's free-GPU series as a small fleet
does, each store read holding at most one node's devices."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.api.fleet import UNNAMED_DEVICE_PREFIX
from gpuwm.config import Settings
from gpuwm.model.figures import ClusterFigures, GpuFigures, PodFigures, WorkloadFigures
from gpuwm.store.base import MAX_SERIES_PER_QUERY, QueryError, RangeQuery, Series
from gpuwm.store.embedded import EmbeddedStore
from tests.unit.store.store_data import sample

NODES = 260
GPUS_PER_NODE = 8
HOLDING_NODES = 10  # nodes 0..9: a workload holds GPUs 0 and 1 of each
TIMES = [1005.0, 1020.0, 1035.0]  # multiples of the 15 s step: a point in each of the grid's cells
LAST_NODE = f"node-{NODES - 1:03d}"


def _node(n: int) -> str:
    return f"node-{n:03d}"


def _uuid(n: int, g: int) -> str:
    return f"GPU-{n:03d}-{g}"


class ReadCountingStore(EmbeddedStore):
    """The embedded store, noting each range read's scope and how many series it answered."""

    reads: list[tuple[str, int]]

    def query_range(self, query: RangeQuery) -> list[Series]:
        answer = super().query_range(query)
        self.reads.append((query.scope, len(answer)))
        return answer


def _workloads() -> list[WorkloadFigures]:
    held = []
    for n in range(HOLDING_NODES):
        name = f"train-{n}"
        held.append(WorkloadFigures(
            uid=f"uid-{name}", namespace="team-a", name=name, kind="Job", api_version="batch/v1", project="alpha",
            phase="Running", allocated_gpus=2.0, nodes=[_node(n)],
            pods=[PodFigures(name=f"{name}-0", uid=f"pod-{name}", node=_node(n), phase="Running", allocated_gpus=2.0)],
            gpus=[GpuFigures(node=_node(n), uuid=_uuid(n, g), index=g, units=1.0, sm_percent=50.0, monitored=True,
                             active=True, pod=f"{name}-0", pod_uid=f"pod-{name}", namespace="team-a", workload=name,
                             workload_uid=f"uid-{name}") for g in range(2)],
        ))
    waiting = WorkloadFigures(  # a pod whose device no agent has named yet: stand-in units on the last node
        uid="uid-fresh", namespace="team-a", name="fresh", kind="Job", api_version="batch/v1", project="alpha",
        phase="Running", allocated_gpus=1.0, nodes=[LAST_NODE],
        gpus=[GpuFigures(node=LAST_NODE, uuid=f"{UNNAMED_DEVICE_PREFIX}fresh-0/c/0", units=1.0)],
    )
    return [*held, waiting]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReadCountingStore]:
    opened = ReadCountingStore(tmp_path_factory.mktemp("fleet-scale") / "gpuwm.db", tiers=["15s:1h"])
    first = [sample(TIMES[0], _uuid(n, g), node=_node(n), index=g, sm=50.0 if n < HOLDING_NODES and g < 2 else 0.0)
             for n in range(NODES) for g in range(GPUS_PER_NODE)]
    for t in TIMES:
        opened.record(t, [each.model_copy(update={"t": t}) for each in first], _workloads(), [],
                      ClusterFigures(gpus=len(first)))
    opened.reads = []
    yield opened
    opened.close()


@pytest.fixture
def client(store: ReadCountingStore) -> Iterator[httpx.AsyncClient]:
    app = create_app(store, Settings(auth="none", status_interval=15.0, runai_compatible_metrics=True,
                                     cluster_id="c-1"))
    store.reads = []  # the reads of the requests only (registering the Run:ai collector reads the fleet once)
    yield httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm")


async def _pages(client: httpx.AsyncClient, url: str, items: str, **params: Any) -> list[list[dict[str, Any]]]:
    pages: list[list[dict[str, Any]]] = []
    following: str | None = None
    while True:
        answer = await client.get(url, params={**params, **({"continue": following} if following else {})})
        assert answer.status_code == 200, answer.text
        pages.append(answer.json()[items])
        following = answer.json()["continue"]
        if following is None:
            return pages


def _largest_node_read(store: ReadCountingStore) -> int:
    """The most series one read answered; a node's devices (and their holders' series) at most."""
    return max(count for _scope, count in store.reads)


def test_the_fleet_is_beyond_one_querys_series_limit(store: ReadCountingStore) -> None:
    query = RangeQuery("cluster", "", ("gpu_utilization_percent",), TIMES[0], TIMES[-1], 15.0, "gpu")
    assert NODES * GPUS_PER_NODE > MAX_SERIES_PER_QUERY
    with pytest.raises(QueryError, match="exceed the limit"):
        store.query_range(query)


async def test_every_gpu_listed_and_each_read_one_nodes(store: ReadCountingStore, client: httpx.AsyncClient) -> None:
    answer = await client.get("/api/v1/gpus")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["at"] == TIMES[-1] and body["continue"] is None
    gpus = body["gpus"]
    assert len(gpus) == NODES * GPUS_PER_NODE
    assert [(g["node"], g["index"]) for g in gpus] == [(_node(n), g) for n in range(NODES) for g in range(GPUS_PER_NODE)]
    states = [g["state"] for g in gpus]
    assert states.count("active") == 2 * HOLDING_NODES and states.count("free") == len(gpus) - 2 * HOLDING_NODES
    assert all(g["holders"][0]["workload"] == f"train-{int(g['node'][-3:])}" for g in gpus if g["state"] == "active")
    assert len([scope for scope, _count in store.reads if scope == "node"]) == NODES
    assert 0 < _largest_node_read(store) <= 5 * 2 * GPUS_PER_NODE  # 5 metrics of a node's devices and holders


async def test_gpus_in_pages_are_the_whole_list_and_a_page_reads_only_its_nodes(
    store: ReadCountingStore, client: httpx.AsyncClient
) -> None:
    whole = (await client.get("/api/v1/gpus")).json()["gpus"]
    store.reads = []
    first = (await client.get("/api/v1/gpus", params={"limit": 20})).json()
    assert len(first["gpus"]) == 20 and first["continue"]
    assert len([scope for scope, _count in store.reads if scope == "node"]) <= 20 // GPUS_PER_NODE + 2
    pages = await _pages(client, "/api/v1/gpus", "gpus", limit=1000)
    assert [len(page) for page in pages] == [1000, 1000, NODES * GPUS_PER_NODE - 2000]
    assert [g for page in pages for g in page] == whole
    active = await _pages(client, "/api/v1/gpus", "gpus", state="active", limit=7)
    assert [g["uuid"] for page in active for g in page] == [g["uuid"] for g in whole if g["state"] == "active"]
    (one_node,) = await _pages(client, "/api/v1/gpus", "gpus", node=_node(5))
    assert [g["uuid"] for g in one_node] == [_uuid(5, g) for g in range(GPUS_PER_NODE)]


async def test_nodes_listed_and_paged(client: httpx.AsyncClient) -> None:
    answer = (await client.get("/api/v1/nodes")).json()
    nodes = answer["nodes"]
    assert answer["continue"] is None
    assert [node["name"] for node in nodes] == [_node(n) for n in range(NODES)]
    assert all(node["gpus"] == GPUS_PER_NODE for node in nodes)
    assert [node["allocatedUnits"] for node in nodes[:HOLDING_NODES + 1]] == [2.0] * HOLDING_NODES + [0.0]
    assert nodes[-1]["unnamedUnits"] == 1.0
    pages = await _pages(client, "/api/v1/nodes", "nodes", limit=128)
    assert [len(page) for page in pages] == [128, 128, NODES - 256]
    assert [node for page in pages for node in page] == nodes


async def test_a_token_this_api_did_not_give_is_refused_by_name(client: httpx.AsyncClient) -> None:
    for url in ("/api/v1/gpus", "/api/v1/nodes"):
        for token in ("nonsense!", "WzEsMl0"):  # not base64 JSON; [1, 2]: not a key of this list
            answer = await client.get(url, params={"limit": 5, "continue": token})
            assert answer.status_code == 400 and answer.json()["parameter"] == "continue", (url, token, answer.text)


async def test_one_gpus_history_on_the_last_node(client: httpx.AsyncClient) -> None:
    uuid = _uuid(NODES - 1, GPUS_PER_NODE - 1)
    answer = await client.get(f"/api/v1/gpus/{uuid}/metrics", params={"metric": "gpu_utilization_percent"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["node"] == LAST_NODE
    assert answer.json()["series"] and all(s["labels"]["uuid"] == uuid for s in answer.json()["series"])
    held = await client.get(f"/api/v1/gpus/{_uuid(3, 1)}/metrics", params={"metric": "gpu_utilization_percent"})
    assert held.status_code == 200 and held.json()["node"] == _node(3)
    assert (await client.get("/api/v1/gpus/GPU-nope/metrics")).status_code == 404


async def test_runai_lists_the_free_gpus_too(client: httpx.AsyncClient) -> None:
    text = (await client.get("/metrics")).text
    allocated = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith("runai_allocated_gpu_count_per_gpu{")]
    # every GPU of the fleet, the free ones at 0; the stand-in device `fresh` holds is listed as held
    assert allocated.count(0.0) == NODES * GPUS_PER_NODE - 2 * HOLDING_NODES
    assert allocated.count(1.0) == 2 * HOLDING_NODES + 1
