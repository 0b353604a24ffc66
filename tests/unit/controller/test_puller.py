"""AgentPuller: `since` per agent, paging, agent restarts, timeouts -> no samples (unmonitored, not idle)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.connector
import orjson
import pytest
from aiohttp import web

from gpuwm.accounting import Engine
from gpuwm.controller.pull import AgentPuller, SampleIntake
from gpuwm.feed import answer_json, sample_columns
from gpuwm.feed.decode import Snapshot

from .loopback import serving


class Agent:
    """Pages of at most 2 samples, like the real agent's `limit`, with `more` when there is a rest; encoded as the
    agent encodes the columns the controller asks for (`gpuwm.feed.encode.answer_json`)."""

    def __init__(self) -> None:
        self.agent_id = "first"
        self.samples = [self.sample(seq) for seq in range(1, 6)]
        self.hang = False
        self.requests: list[int] = []

    @staticmethod
    def sample(seq: int) -> dict[str, Any]:
        return {"t": float(seq), "node": "n1", "uuid": "GPU-1", "seq": seq, "sm_percent": 50.0}

    async def handle(self, request: web.Request) -> web.Response:
        since = int(request.query["since"])
        self.requests.append(since)
        if self.hang:
            await asyncio.sleep(1)
        after = [s for s in self.samples if s["seq"] > since]
        page = after[:2]
        seq = page[-1]["seq"] if page else max([since, *(s["seq"] for s in self.samples)])
        head = {"node": "n1", "seq": seq, "agent_id": self.agent_id, "truncated": False, "more": len(after) > 2}
        body = answer_json(head, [orjson.dumps(sample) for sample in page], [], b"[]",
                           columns=request.query.get("format") == "columns")
        return web.Response(body=body, content_type="application/json")


def _seqs(snapshot: Snapshot) -> list[int | None]:
    assert snapshot.columns is not None
    return [sample.seq for sample in snapshot.columns.samples(list(range(len(snapshot.columns))))]


@pytest.fixture
async def agent() -> AsyncIterator[tuple[Agent, str]]:
    state = Agent()
    app = web.Application()
    app.router.add_get("/v1/snapshot", state.handle)
    async with serving(app) as url:
        yield state, url


async def test_pages_then_tracks_since(agent: tuple[Agent, str]) -> None:
    state, url = agent
    puller = AgentPuller(timeout_seconds=2)
    result = await puller.pull_all({"n1": url})
    assert _seqs(result.snapshots[0]) == [1, 2, 3, 4, 5]
    assert state.requests == [0, 2, 4] and puller.positions()["n1"]["since"] == 5
    state.samples.append(state.sample(6))
    result = await puller.pull_all({"n1": url})
    assert _seqs(result.snapshots[0]) == [6]
    await puller.close()


async def test_restarted_agent_is_read_from_the_start(agent: tuple[Agent, str]) -> None:
    state, url = agent
    puller = AgentPuller(timeout_seconds=2)
    await puller.pull_all({"n1": url})
    state.agent_id, state.samples = "second", [state.sample(1)]
    result = await puller.pull_all({"n1": url})
    assert _seqs(result.snapshots[0]) == [1]
    assert puller.positions()["n1"] == {"since": 1, "agent_id": "second"}
    await puller.close()


async def test_timeout_gives_no_samples_and_one_warning(agent: tuple[Agent, str], caplog: pytest.LogCaptureFixture) -> None:
    state, url = agent
    state.hang = True
    puller = AgentPuller(timeout_seconds=0.2)
    for _ in range(2):
        result = await puller.pull_all({"n1": url, "gone": "http://127.0.0.1:9"})
        assert result.snapshots == [] and sorted(result.failed_nodes) == ["gone", "n1"]
    assert sum("did not answer" in r.message and "n1" in r.message for r in caplog.records) == 1
    await puller.close()


async def test_each_snapshot_is_handed_over_and_not_kept_and_the_intake_takes_it_in_time_order(
    agent: tuple[Agent, str],
) -> None:
    state, url = agent
    state.samples = [state.sample(seq) for seq in (1, 2, 3)]
    state.samples[0]["t"], state.samples[2]["t"] = 3.0, 1.0  # served in seq order, not time order
    handed: list[list[float]] = []
    intake = SampleIntake(Engine())

    def take(snapshot: Snapshot) -> None:
        assert snapshot.columns is not None
        handed.append(snapshot.columns.t.tolist())
        intake.take(snapshot)

    puller = AgentPuller(timeout_seconds=2)
    try:
        result = await puller.pull_all({"n1": url}, on_snapshot=take)
    finally:
        await puller.close()
    intake.flush()
    assert handed == [[3.0, 2.0, 1.0]]  # the agent's two pages joined, as served
    assert intake.samples == 3 and intake.latest["GPU-1"].seq == 1 and intake.latest_time == 3.0
    assert result.snapshots[0].columns is None and result.snapshots[0].seq == 3
    assert puller.positions()["n1"]["since"] == 3
    await puller.close()


async def test_the_connection_to_an_agent_outlives_a_status_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    peers: list[object] = []

    async def handle(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return web.json_response({"node": "n1", "seq": 0, "format": "columns", **sample_columns([]), "devices": []})

    app = web.Application()
    app.router.add_get("/v1/snapshot", handle)
    puller = AgentPuller(timeout_seconds=2)
    async with serving(app) as url:
        try:
            await puller.pull_all({"n1": url})
            # aiohttp's connector ages idle connections by its `monotonic`: the next pull, 20 s on
            monkeypatch.setattr(aiohttp.connector, "monotonic", lambda: time.monotonic() + 20.0)
            await puller.pull_all({"n1": url})
            assert len(peers) == 2 and peers[0] == peers[1]  # the same kept-alive connection
            monkeypatch.setattr(aiohttp.connector, "monotonic", lambda: time.monotonic() + 90.0)
            await puller.pull_all({"n1": url})  # idle past the keep-alive time (60 s): a new one
            assert len(peers) == 3 and peers[2] != peers[0]
        finally:
            await puller.close()
