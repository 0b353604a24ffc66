"""What the controller refuses from agents: a sample with NaN/±Infinity in a number is dropped alone (counted,
logged once per pull naming the node), a snapshot of another node or in another form than columns (rows, what an
agent that ignores `format` sends) is dropped whole (counted, logged)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from gpuwm.controller.pull import AgentPuller, IntakeCollector
from gpuwm.feed import sample_columns
from gpuwm.feed.decode import (
    FormatError,
    SampleColumns,
    Snapshot,
    WrongNodeError,
    parse_columns_many,
    parse_snapshot,
)

from .loopback import serving

#: JSON spellings of numbers that are not: orjson refuses them all, Python's reader takes them
NOT_FINITE = ("NaN", "Infinity", "-Infinity", "1e999", "-1e999")
_MARK = "__number__"


def _sample(seq: int, **figures: Any) -> dict[str, Any]:
    return {"t": float(seq), "node": "n1", "uuid": f"GPU-{seq % 2}", "seq": seq, "sm_percent": 10.0 * seq,
            "memory_used_bytes": 1e9, "memory_total_bytes": 8e10, "energy_joules": 100.0 * seq, **figures}


def _processes(seq: int) -> list[dict[str, Any]]:
    return [{"pid": 100 + seq, "pod_uid": f"pod-{seq}", "sm_percent": 5.0}, {"pid": 200 + seq, "sm_percent": 1.0}]


def _body(samples: list[dict[str, Any]], columns: bool = True, node: str = "n1") -> dict[str, Any]:
    """The agent's answer: columns as its encoder writes them (`sample_columns`), or rows (`columns=False`)."""
    head = {"node": node, "seq": max(s["seq"] for s in samples if type(s["seq"]) is int), "agent_id": "a",
            "pod_stats": [{"t": 1.0, "node": node, "namespace": "ns", "pod": "p", "pod_uid": "u", "cpu_usage_cores": 1}],
            "devices": []}
    if columns:
        return {**head, "format": "columns", **sample_columns(samples)}
    return {**head, "samples": samples}


def _with_token(body: dict[str, Any], token: str) -> bytes:
    """`body` as the agent's JSON with every `_MARK` written as the bare token `token`."""
    return json.dumps(body).replace(f'"{_MARK}"', token).encode()


def _seqs(snapshot: Snapshot) -> list[int]:
    assert snapshot.columns is not None
    return [sample.seq or 0 for sample in snapshot.columns.samples(list(range(len(snapshot.columns))))]


SAMPLES = [_sample(1, processes=_processes(1)), _sample(2, processes=[]), _sample(3, processes=_processes(3)),
           _sample(4, healthy=False, error="GPU is lost", sm_percent=None), _sample(5, processes=_processes(5))]


@pytest.mark.parametrize("token", NOT_FINITE)
@pytest.mark.parametrize("field", ["t", "sm_percent", "energy_joules", "temperature_celsius", "power_watts",
                                   "merged_seconds", "seq", "process.sm_percent", "process.pid",
                                   "process.memory_used_bytes"])
def test_a_sample_with_a_number_that_is_not_finite_is_dropped_alone(token: str, field: str) -> None:
    samples = [dict(sample) for sample in SAMPLES]
    if field.startswith("process."):
        samples[2]["processes"] = [_processes(3)[0], {**_processes(3)[1], field.split(".")[1]: _MARK}]
    else:
        samples[2][field] = _MARK
    snapshot = parse_snapshot(_with_token(_body(samples), token), "n1")
    assert snapshot.rejected_samples == 1
    assert _seqs(snapshot) == [1, 2, 4, 5]
    # the rest is what the same snapshot without the bad sample gives, row by row (processes, errors, empty lists)
    clean = parse_snapshot(orjson.dumps(_body([SAMPLES[index] for index in (0, 1, 3, 4)])), "n1")
    assert clean.rejected_samples == 0
    assert snapshot.columns is not None and clean.columns is not None
    everything = list(range(4))
    assert snapshot.columns.samples(everything) == clean.columns.samples(everything)
    assert snapshot.columns.batch(snapshot.columns.time_order()).pod_sm == clean.columns.batch(
        clean.columns.time_order()).pod_sm
    assert snapshot.max_seq == 5


def test_a_pod_stats_entry_that_is_not_finite_is_dropped_alone() -> None:
    body = _body(SAMPLES)
    body["pod_stats"] = [{**body["pod_stats"][0], "cpu_usage_cores": _MARK}, {**body["pod_stats"][0], "pod": "q"}]
    snapshot = parse_snapshot(_with_token(body, "NaN"), "n1")
    assert [stats.pod for stats in snapshot.pod_stats] == ["q"]
    assert snapshot.rejected_samples == 1 and _seqs(snapshot) == [1, 2, 3, 4, 5]


def test_columns_given_as_objects_with_float_nan_drop_the_row() -> None:
    # in the arrays NaN means null; a float NaN handed in as a value is a NaN the agent sent, not a null
    body = _body(SAMPLES, columns=True)
    body["columns"]["sm_percent"][1] = math.nan
    body["columns"]["energy_joules"][3] = math.inf
    snapshot = parse_snapshot(body, "n1")
    assert snapshot.rejected_samples == 2 and _seqs(snapshot) == [1, 3, 5]


def test_every_sample_refused_leaves_an_empty_snapshot_not_an_error() -> None:
    body = _body([_sample(1, t=_MARK), _sample(2, sm_percent=_MARK)], columns=True)
    snapshot = parse_snapshot(_with_token(body, "Infinity"), "n1")
    assert snapshot.rejected_samples == 2 and _seqs(snapshot) == []


def test_a_finite_number_out_of_range_still_refuses_the_snapshot() -> None:
    # only NaN and infinity drop a sample alone; other malformed input is the agent's fault as before
    body = _body([_sample(1, sm_percent=150.0), _sample(2, energy_joules=_MARK)])
    with pytest.raises(ValueError, match="malformed snapshot"):
        parse_snapshot(_with_token(body, "NaN"), "n1")


def test_a_snapshot_of_another_node_is_refused() -> None:
    with pytest.raises(WrongNodeError, match="pulled for node 'n1' answered for node 'n2'"):
        parse_snapshot(orjson.dumps(_body(SAMPLES, node="n2")), "n1")
    # no `node` at all is the node pulled (older agents)
    body = _body(SAMPLES)
    del body["node"]
    assert parse_snapshot(orjson.dumps(body), "n1").node == "n1"


def test_rows_are_refused_whatever_they_hold() -> None:
    """Rows are refused as rows, before anything in them is read: a good answer, one of another node, one with a
    NaN; the message names the node pulled and what it answered."""
    refusal = r"^agent for node 'n1' answered format=rows; the controller reads format=columns$"
    for answer in (orjson.dumps(_body(SAMPLES, columns=False)), orjson.dumps(_body(SAMPLES, False, node="n2")),
                   _with_token(_body([_sample(1, sm_percent=_MARK)], columns=False), "NaN"), _body(SAMPLES, False)):
        with pytest.raises(FormatError, match=refusal):
            parse_snapshot(answer, "n1")
    with pytest.raises(FormatError, match=r"^agent for node 'n1' answered format=''; the controller reads format=columns$"):
        parse_snapshot(orjson.dumps({**_body(SAMPLES), "format": ""}), "n1")


class Agents:
    """Three agents behind one server: `good` answers for itself, `lost` for another node, `old` in rows whatever
    it is asked (an agent older than the columnar feed); `good`'s samples can carry a `NaN` token."""

    def __init__(self) -> None:
        self.token: str | None = None

    async def handle(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        columns = request.query.get("format") == "columns" and node != "old"
        samples = [dict(sample) for sample in SAMPLES]
        if self.token is not None:
            samples[0]["sm_percent"] = _MARK
            samples[4]["energy_joules"] = _MARK
        body = _body(samples, columns, node="elsewhere" if node == "lost" else node)
        return web.Response(body=_with_token(body, self.token or "0"), content_type="application/json")


@pytest.fixture
async def agents() -> AsyncIterator[tuple[Agents, str]]:
    state = Agents()
    app = web.Application()
    app.router.add_get("/{node}/v1/snapshot", state.handle)
    async with serving(app) as url:
        yield state, url


async def test_the_puller_counts_and_logs_what_it_refused(agents: tuple[Agents, str],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    state, url = agents
    puller = AgentPuller(timeout_seconds=2)
    registry = CollectorRegistry()
    registry.register(IntakeCollector(puller))
    scraped = generate_latest(registry).decode()
    assert 'gpuwm_controller_rejected_samples_total{reason="not-finite"} 0.0' in scraped
    assert 'gpuwm_controller_rejected_snapshots_total{reason="wrong-format"} 0.0' in scraped
    state.token = "NaN"
    caplog.set_level(logging.WARNING, logger="gpuwm.controller.pull.agents")
    taken: list[Snapshot] = []
    urls = {node: f"{url}/{node}" for node in ("good", "lost", "old")}
    result = await puller.pull_all(urls, on_snapshot=taken.append)
    assert result.failed_nodes == ["lost", "old"]  # their GPUs unmonitored
    assert [snapshot.node for snapshot in taken] == ["good"]
    assert puller.positions()["old"]["since"] == 0
    assert dict(puller.rejected_samples) == {"not-finite": 2}
    assert dict(puller.rejected_snapshots) == {"wrong-node": 1, "wrong-format": 1}
    lines = [record.getMessage() for record in caplog.records]
    assert sum("good" in line and "2 samples with NaN or infinity" in line for line in lines) == 1
    assert sum("'lost'" in line and "'elsewhere'" in line for line in lines) == 1
    assert sum(f"agent for node 'old' answered format=rows; the controller reads format=columns ({url}/old)" in line
               for line in lines) == 1
    scraped = generate_latest(registry).decode()
    assert 'gpuwm_controller_rejected_samples_total{reason="not-finite"} 2.0' in scraped
    assert 'gpuwm_controller_rejected_snapshots_total{reason="wrong-node"} 1.0' in scraped
    assert 'gpuwm_controller_rejected_snapshots_total{reason="wrong-format"} 1.0' in scraped
    # every pull counts what it refused; the wrong node's and the rows' warnings are not repeated while they last
    state.token = "Infinity"
    caplog.clear()
    await puller.pull_all(urls, on_snapshot=taken.append)
    assert dict(puller.rejected_samples) == {"not-finite": 4}  # this fake agent sends the same samples again
    assert dict(puller.rejected_snapshots) == {"wrong-node": 2, "wrong-format": 2}
    lines = [record.getMessage() for record in caplog.records]
    assert sum("good" in line and "2 samples with NaN or infinity" in line for line in lines) == 1
    assert not any("'lost'" in line or "'old'" in line for line in lines)
    await puller.close()


def test_the_collector_reads_the_current_puller() -> None:
    pullers: list[AgentPuller | None] = [None]
    registry = CollectorRegistry()
    registry.register(IntakeCollector(lambda: pullers[0]))
    assert 'gpuwm_controller_rejected_snapshots_total{reason="wrong-node"} 0.0' in generate_latest(registry).decode()


def test_pages_read_together_drop_only_the_rows_that_are_not_finite() -> None:
    # plain pages (no processes, no errors) are read as one table; one infinite value sends its page to be read
    # alone, where its row is dropped, and leaves the others as they were
    plain = [_sample(seq) for seq in range(1, 5)]
    pages = [dict(_body(plain, columns=True)) for _ in range(3)]
    pages[1] = orjson.loads(orjson.dumps(pages[1]))
    pages[1]["columns"]["power_watts"] = [100.0, math.inf, 100.0, 100.0]
    results = parse_columns_many(pages)
    assert [len(result) for result in results if isinstance(result, SampleColumns)] == [4, 3, 4]
    assert [result.rejected_rows for result in results if isinstance(result, SampleColumns)] == [0, 1, 0]
