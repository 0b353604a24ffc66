"""The puller sends back each agent's `devices_tag`; unchanged devices are left out and the kept ones are used.

Every pull must come out as a pull of full answers would: the same samples into the engine, the
same latest samples, the same device holders. An agent that claims unchanged devices the
controller does not hold fails alone and is asked for them again; so is any agent after a
failed pull.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.controller.pull import AgentPuller, SampleIntake
from gpuwm.feed import DEVICES_TAG_PARAM, columns_answer_json, sample_columns

from .loopback import serving


class TaggingAgent:
    """Serves its samples after `since` as columns, leaving the devices out under their tag unless told not to."""

    def __init__(self, honour_tags: bool = True) -> None:
        self.honour_tags = honour_tags
        self.samples: list[dict[str, Any]] = []
        self.holders = [self.holder(0, "train-0"), self.holder(1, "train-0")]
        self.asked: list[str | None] = []  # the devices_tag of each request
        self.answers: list[dict[str, Any]] = []
        self.lie = False  # answer `devices_unchanged` whatever tag was asked for
        self.tag_override: str | None = None
        self.fail = False

    @staticmethod
    def holder(gpu: int, pod: str) -> dict[str, Any]:
        return {"uuid": f"GPU-{gpu}", "device_id": f"GPU-{gpu}", "units": 1.0, "namespace": "ml", "pod": pod,
                "pod_uid": f"uid-{pod}", "container": "main", "state": "active"}

    def poll(self, t: float) -> None:
        for gpu in range(2):
            self.samples.append({"t": t, "node": "n1", "uuid": f"GPU-{gpu}", "index": gpu, "seq": len(self.samples) + 1,
                                 "sm_percent": (t * 7 + gpu * 31) % 100, "memory_used_bytes": 1e9 + t,
                                 "memory_total_bytes": 8e10, "energy_joules": 10.0 * t})

    async def handle(self, request: web.Request) -> web.Response:
        if self.fail:
            return web.Response(status=500, text="broken")
        since = int(request.query["since"])
        asked = request.query.get(DEVICES_TAG_PARAM)
        self.asked.append(asked)
        page = [sample for sample in self.samples if sample["seq"] > since]
        answer = {"node": "n1", "seq": page[-1]["seq"] if page else since, "agent_id": "a1", "truncated": False,
                  "format": "columns", **sample_columns(page), "pod_stats": [], "devices": self.holders}
        body = orjson.loads(columns_answer_json(answer, asked if self.honour_tags else None))
        if self.tag_override is not None:
            body["devices_tag"] = self.tag_override
        if self.lie:
            body.pop("gpus", None)
            body.pop("devices", None)
            body["devices_unchanged"] = True
        self.answers.append(body)
        return web.Response(body=orjson.dumps(body), content_type="application/json")


async def _pull(puller: AgentPuller, url: str, engine: Engine, holders: dict[str, Any]) -> tuple[SampleIntake, Any]:
    intake = SampleIntake(engine, holders)
    result = await puller.pull_all({"n1": url}, on_snapshot=intake.take)
    intake.flush()
    return intake, result


async def test_unchanged_devices_are_left_out_and_every_pull_equals_one_of_full_answers() -> None:
    tagged, plain = TaggingAgent(), TaggingAgent(honour_tags=False)
    apps = []
    for agent in (tagged, plain):
        app = web.Application()
        app.router.add_get("/v1/snapshot", agent.handle)
        apps.append(app)
    engines = [Engine(EngineConfig(interval_seconds=1.0)), Engine(EngineConfig(interval_seconds=1.0))]
    holders: list[dict[str, Any]] = [{}, {}]
    pullers = [AgentPuller(timeout_seconds=2), AgentPuller(timeout_seconds=2)]
    async with serving(apps[0]) as tagged_url, serving(apps[1]) as plain_url:
        try:
            for step in range(4):
                for agent in (tagged, plain):
                    for second in range(3):
                        agent.poll(100.0 + 3 * step + second)
                    if step == 2:  # a pod change: the devices go again, with a new tag
                        agent.holders = [agent.holder(0, "train-1"), agent.holder(1, "serve-0")]
                pulls = [await _pull(puller, url, engine, kept)
                         for puller, url, engine, kept in zip(pullers, (tagged_url, plain_url), engines, holders,
                                                              strict=True)]
                (mine, my_result), (theirs, their_result) = pulls
                assert not my_result.failed_nodes and not their_result.failed_nodes
                assert mine.samples == theirs.samples == 6
                assert mine.latest == theirs.latest and mine.latest_time == theirs.latest_time
                assert holders[0]["n1"] == holders[1]["n1"] and len(holders[0]["n1"]) == 2
                assert mine.changed_nodes == theirs.changed_nodes == ({"n1"} if step in (0, 2) else set())
            assert {uuid: gpu.latest for uuid, gpu in engines[0].gpu_records.items()} == {
                uuid: gpu.latest for uuid, gpu in engines[1].gpu_records.items()}
            assert engines[0].save() == engines[1].save()
            # the first answer gave a tag, each later pull sent the one it held; the pod change gave a new one
            tags = [answer["devices_tag"] for answer in tagged.answers]
            assert tagged.asked == [None, tags[0], tags[1], tags[2]] and tags[0] == tags[1] != tags[2] == tags[3]
            assert [answer.get("devices_unchanged", False) for answer in tagged.answers] == [False, True, False, True]
            assert ["gpus" in answer for answer in tagged.answers] == [True, False, True, False]
            assert holders[0]["n1"][0].pod == "train-1"
        finally:
            for puller in pullers:
                await puller.close()


@pytest.fixture
async def agent() -> Any:
    state = TaggingAgent()
    app = web.Application()
    app.router.add_get("/v1/snapshot", state.handle)
    async with serving(app) as url:
        yield state, url


Pull = Callable[[], Awaitable[tuple[SampleIntake, Any]]]


@pytest.fixture
async def pulling(agent: tuple[TaggingAgent, str]) -> AsyncIterator[tuple[TaggingAgent, Pull]]:
    """The agent, and one pull of it by a puller and engine of the test's own (the same ones each call)."""
    state, url = agent
    puller = AgentPuller(timeout_seconds=2)
    engine = Engine(EngineConfig(interval_seconds=1.0))

    async def pull() -> tuple[SampleIntake, Any]:
        return await _pull(puller, url, engine, {})

    try:
        yield state, pull
    finally:
        await puller.close()


async def test_unchanged_devices_the_controller_does_not_hold_fail_that_agent_then_it_is_asked_afresh(
    pulling: tuple[TaggingAgent, Pull], caplog: pytest.LogCaptureFixture,
) -> None:
    state, pull = pulling
    state.poll(100.0)
    state.lie = True
    _, result = await pull()
    assert result.failed_nodes == ["n1"]  # its samples are read by the next pull (below: both of them)
    assert any("'devices_unchanged'" in record.getMessage() and "'gpus' and 'devices' are needed" in record.getMessage()
               for record in caplog.records)
    state.lie = False
    intake, result = await pull()
    assert not result.failed_nodes and intake.samples == 2 and state.asked == [None, None]
    # it held them once read: a lie about another tag fails too, and the next request sends no tag
    state.poll(101.0)
    state.tag_override, state.lie = "f" * 32, True
    _, result = await pull()
    assert result.failed_nodes == ["n1"] and state.asked[-1] == state.answers[1]["devices_tag"]
    state.tag_override, state.lie = None, False
    intake, result = await pull()
    assert not result.failed_nodes and intake.samples == 2 and state.asked[-1] is None


async def test_a_failed_pull_forgets_the_kept_devices(pulling: tuple[TaggingAgent, Pull]) -> None:
    state, pull = pulling
    state.poll(100.0)
    await pull()
    state.poll(101.0)
    await pull()
    assert state.asked == [None, state.answers[0]["devices_tag"]]
    state.fail = True
    _, result = await pull()
    assert result.failed_nodes == ["n1"]
    state.fail = False
    state.poll(102.0)
    intake, result = await pull()
    assert not result.failed_nodes and state.asked[-1] is None and "gpus" in state.answers[-1]
    assert intake.samples == 2


async def test_a_tag_too_long_to_send_back_is_not_kept(pulling: tuple[TaggingAgent, Pull]) -> None:
    state, pull = pulling
    state.tag_override = "x" * 65
    for t in (100.0, 101.0):
        state.poll(t)
        intake, result = await pull()
        assert not result.failed_nodes and intake.samples == 2
    assert state.asked == [None, None]
