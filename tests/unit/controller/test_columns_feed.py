"""The columnar snapshot feed: the agent's encoding, the controller's parsing and its intake.

Every GpuSample field survives agent -> JSON -> controller; a malformed column is named with
its row; the engine fed from columns reports exactly what it reports fed sample by sample.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
import pytest
from aiohttp import web
from pydantic import TypeAdapter

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.controller.pull import AgentPuller, SampleIntake
from gpuwm.feed import sample_columns
from gpuwm.feed.decode import FormatError, parse_snapshot
from gpuwm.model import DeviceReading, GpuSample
from tests.unit.accounting.helpers import pod

from .loopback import serving

#: a reading's JSON, as the engine's state saves it
_READING = TypeAdapter(DeviceReading)


def _random_sample(rng: random.Random, t: float, seq: int, uuid: str) -> GpuSample:
    values: dict[str, Any] = {"t": t, "seq": seq, "node": "n1", "uuid": uuid, "index": int(uuid[-1]),
                              "model": rng.choice(["NVIDIA H100 80GB HBM3", None])}
    if uuid.startswith("MIG"):
        values.update(parent_uuid="GPU-0", mig_profile="3g.40gb", device_units=3 / 7)
    for name, high in (("sm_percent", 100.0), ("memory_activity_percent", 100.0), ("memory_used_bytes", 8e10),
                       ("memory_total_bytes", 8e10), ("power_watts", 700.0), ("power_limit_watts", 700.0),
                       ("energy_joules", 1e9), ("temperature_celsius", 90.0), ("sm_clock_mhz", 2000.0),
                       ("memory_clock_mhz", 2600.0), ("pcie_rx_bytes_per_second", 1e9),
                       ("pcie_tx_bytes_per_second", 1e9)):
        if rng.random() < 0.8:
            values[name] = rng.choice([0.0, high, round(rng.uniform(0, high), 3)])
    if rng.random() < 0.1:
        values.update(healthy=False, error="GPU is lost", sm_percent=None)
    kind = rng.random()
    if kind < 0.2:
        values["processes"] = []
    elif kind < 0.6:
        values["processes"] = [
            {"pid": rng.randint(1, 10**6), "pod_uid": rng.choice(["pod-a", "pod-b", None]),
             "container": rng.choice(["main", None]), "sm_percent": rng.choice([None, 0.0, 12.5, 100.0]),
             "memory_used_bytes": rng.choice([None, 1e9])}
            for _ in range(rng.randint(1, 3))
        ]
    return GpuSample.model_validate(values)


def _snapshot_bytes(samples: list[GpuSample], **head: Any) -> bytes:
    """What the agent serves for `format=columns` (records are the samples' JSON, as in its buffer)."""
    rows = [orjson.loads(sample.model_dump_json()) for sample in samples]
    body = {"node": "n1", "seq": max((s.seq or 0 for s in samples), default=0), "agent_id": "a", "more": False,
            "truncated": False, "format": "columns", **sample_columns(rows), "pod_stats": [], "devices": [], **head}
    return orjson.dumps(body)


@pytest.mark.parametrize("seed", range(20))
def test_every_field_of_every_sample_survives_the_round_trip(seed: int) -> None:
    rng = random.Random(seed)
    samples = [_random_sample(rng, 100.0 + step + rng.random() * 0.01, step * 3 + index + 1, uuid)
               for step in range(20) for index, uuid in enumerate(("GPU-0", "GPU-1", "MIG-2"))]
    snapshot = parse_snapshot(_snapshot_bytes(samples), "n1")
    assert snapshot.columns is not None
    rebuilt = snapshot.columns.samples(list(range(len(samples))))
    assert rebuilt == [DeviceReading.of(sample) for sample in samples]
    # types too (5 != 5.0), as a restored state reads them
    assert [_READING.dump_json(s) for s in rebuilt] == [s.model_dump_json().encode() for s in samples]
    assert snapshot.max_seq == max(s.seq or 0 for s in samples)


def test_a_device_field_that_changes_within_a_snapshot_gets_its_own_entry() -> None:
    samples = [GpuSample(t=1.0, node="n1", uuid="GPU-0", power_limit_watts=700.0),
               GpuSample(t=2.0, node="n1", uuid="GPU-0", power_limit_watts=500.0)]
    body = orjson.loads(_snapshot_bytes(samples))
    assert [entry["power_limit_watts"] for entry in body["gpus"]] == [700.0, 500.0]
    assert body["columns"]["gpu"] == [0, 1] and "healthy" not in body["columns"] and "processes" not in body
    snapshot = parse_snapshot(orjson.dumps(body), "n1")
    assert snapshot.columns is not None
    assert [snapshot.columns.sample(row) for row in range(2)] == [DeviceReading.of(sample) for sample in samples]


@pytest.mark.parametrize(("change", "says"), [
    (lambda body: body["columns"].update(t=[1.0]), "column 'gpu': 2 values for 1 rows"),
    (lambda body: body["columns"].update(t=[1.0, None]), "column 't' row 1: None is not a finite time"),
    (lambda body: body["columns"].update(sm_percent=[5.0, "busy"]), "column 'sm_percent' row 1: 'busy' is not a number"),
    (lambda body: body["columns"].update(sm_percent=[5.0, 130.0]), "column 'sm_percent' row 1: 130 is above 100"),
    (lambda body: body["columns"].update(power_watts=[-1.0, None]), "column 'power_watts' row 0: -1 is below 0"),
    (lambda body: body["columns"].update(gpu=[0, 3]), "column 'gpu' row 1: 3 is not an entry of 'gpus' (1)"),
    (lambda body: body["columns"].update(seq=[1, 2.5]), "column 'seq' row 1: expected an integer"),
    (lambda body: body["columns"].update(healthy=[True, 1]), "column 'healthy': expected 2 booleans"),
    (lambda body: body["gpus"][0].update(device_units=2), "gpus[0].device_units"),
    (lambda body: body.update(processes={"row": [5], "pid": [1]}), "column 'processes.row'"),
    (lambda body: body.update(errors={"7": "x"}), "errors['7']"),
])
def test_a_malformed_column_is_named_with_its_row(change: Any, says: str) -> None:
    body = orjson.loads(_snapshot_bytes([GpuSample(t=1.0, node="n1", uuid="GPU-0", seq=1, sm_percent=5.0),
                                         GpuSample(t=2.0, node="n1", uuid="GPU-0", seq=2, sm_percent=6.0)]))
    change(body)
    with pytest.raises(ValueError, match="agent for node 'n9' sent a malformed snapshot") as raised:
        parse_snapshot(orjson.dumps(body), "n9")
    assert says in str(raised.value)


def test_rows_are_refused_and_pages_of_columns_join() -> None:
    """The controller reads one form: rows (the agent's default, for people) or any other are refused by name."""
    first = [GpuSample(t=2.0, node="n1", uuid="GPU-0", seq=1, processes=[{"pid": 1, "sm_percent": 3.0}])]
    second = [GpuSample(t=1.0, node="n1", uuid="GPU-1", seq=2, error="x", healthy=False,
                        processes=[{"pid": 2, "pod_uid": "p"}])]
    rows = {"node": "n1", "seq": 1, "samples": [first[0].model_dump()]}
    for answer in (rows, orjson.dumps(rows)):
        with pytest.raises(FormatError, match=r"^agent for node 'n1' answered format=rows; the controller reads "
                                              r"format=columns$"):
            parse_snapshot(answer, "n1")
    with pytest.raises(FormatError, match=r"answered format=parquet; the controller reads format=columns"):
        parse_snapshot(orjson.dumps({**orjson.loads(_snapshot_bytes(first)), "format": "parquet"}), "n1")
    joined = parse_snapshot(_snapshot_bytes(first, more=True), "n1").extend(parse_snapshot(_snapshot_bytes(second), "n1"))
    assert joined.columns is not None and joined.sample_count == 2 and joined.max_seq == 2
    assert [joined.columns.sample(row) for row in range(2)] == [DeviceReading.of(s) for s in first + second]
    assert joined.columns.time_order().tolist() == [1, 0]


def _node_samples(rng: random.Random, node: str, start: float, seconds: int) -> list[GpuSample]:
    samples: list[GpuSample] = []
    for step in range(seconds):
        for index in range(4):
            uuid = f"GPU-{node}-{index}"
            values: dict[str, Any] = {"t": start + step + rng.choice([0.0, 0.0, -5.0]), "node": node, "uuid": uuid,
                                      "seq": len(samples) + 1, "sm_percent": rng.choice([0.0, 50.0, None]),
                                      "memory_used_bytes": 1.0, "memory_total_bytes": rng.choice([0.0, 4.0]),
                                      "energy_joules": 10.0 * (start + step)}
            if index == 3:
                values.update(uuid=f"MIG-{node}", parent_uuid=f"GPU-{node}-0", device_units=1 / 7, energy_joules=None)
            if index == 2:
                values["processes"] = [{"pid": 1, "pod_uid": "pod-shared-0", "sm_percent": rng.choice([5.0, None])}]
            samples.append(GpuSample.model_validate(values))
    return samples


def test_intake_from_columns_equals_the_engine_fed_sample_by_sample() -> None:
    """The intake's batches of columns give the engine, `latest` and the counts what one sample at a time in time
    order gives (the reference: `Engine.observe_sample`, each device's latest by time, later rows winning ties)."""
    rng = random.Random(3)
    engines = [Engine(EngineConfig()), Engine(EngineConfig())]
    for engine in engines:
        for node in ("a", "b"):
            engine.observe(pod(0.0, f"job-{node}", node=node, devices=[(f"GPU-{node}-0", 1.0), (f"GPU-{node}-1", 1.0)]))
            engine.observe(pod(0.0, f"shared-{node}", uid="pod-shared-0", node=node, devices=[(f"GPU-{node}-2", 0.5)]))
            engine.observe(pod(0.0, f"mig-{node}", node=node, devices=[(f"MIG-{node}", 1 / 7)]))
    intake = SampleIntake(engines[1])
    latest: dict[str, GpuSample] = {}
    fed = 0
    for cycle in range(4):
        for node in ("a", "b"):
            samples = _node_samples(rng, node, 1.0 + 15 * cycle, 15)
            for sample in sorted(samples, key=lambda s: s.t):
                engines[0].observe_sample(sample)
                if sample.uuid not in latest or sample.t >= latest[sample.uuid].t:
                    latest[sample.uuid] = sample
            fed += len(samples)
            intake.take(parse_snapshot(_snapshot_bytes(samples, node=node), node))
        intake.flush()
    assert engines[1].report(70.0) == engines[0].report(70.0)
    assert engines[1].gpus(70.0) == engines[0].gpus(70.0)
    assert intake.latest == {uuid: DeviceReading.of(sample) for uuid, sample in latest.items()} and len(latest) == 8
    assert (intake.samples, intake.latest_time) == (fed, max(sample.t for sample in latest.values()))
    assert {uuid: gpu.latest for uuid, gpu in engines[1].gpu_records.items()} == {
        uuid: None if gpu.latest is None else DeviceReading.of(gpu.latest) for uuid, gpu in engines[0].gpu_records.items()}


async def test_the_puller_asks_for_columns_pages_them_and_tracks_since(caplog: pytest.LogCaptureFixture) -> None:
    samples = [GpuSample(t=float(seq), node="n1", uuid=f"GPU-{seq % 2}", seq=seq, sm_percent=50.0) for seq in range(1, 6)]
    asked: list[tuple[str, str | None]] = []
    broken = {"on": False}

    async def handle(request: web.Request) -> web.Response:
        since = int(request.query["since"])
        asked.append((request.query["since"], request.query.get("format")))
        page = [sample for sample in samples if (sample.seq or 0) > since][:2]
        more = len([sample for sample in samples if (sample.seq or 0) > since]) > 2
        body = orjson.loads(_snapshot_bytes(page, more=more, seq=(page[-1].seq if page else since) or 0))
        if broken["on"]:
            body["columns"]["sm_percent"][0] = 250.0
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/snapshot", handle)
    engine = Engine(EngineConfig())
    puller = AgentPuller(timeout_seconds=2)
    async with serving(app) as url:
        try:
            intake = SampleIntake(engine)
            result = await puller.pull_all({"n1": url}, on_snapshot=intake.take)
            intake.flush()
            assert asked == [("0", "columns"), ("2", "columns"), ("4", "columns")]
            assert intake.samples == 5 and puller.positions()["n1"]["since"] == 5
            assert result.snapshots[0].columns is None  # handed over, not kept
            assert {uuid: sample.seq for uuid, sample in intake.latest.items()} == {"GPU-0": 4, "GPU-1": 5}
            samples.append(GpuSample(t=6.0, node="n1", uuid="GPU-0", seq=6, sm_percent=50.0))
            broken["on"] = True
            result = await puller.pull_all({"n1": url}, on_snapshot=intake.take)
            assert result.failed_nodes == ["n1"] and puller.positions()["n1"]["since"] == 5
            assert any("column 'sm_percent' row 0: 250 is above 100" in record.message for record in caplog.records)
        finally:
            await puller.close()


def test_device_entries_hold_the_agents_device_fields_in_order() -> None:
    """`DeviceEntry` is the agent's DEVICE_FIELDS, by name and order (`_device` fills it from a `gpus` entry)."""
    import dataclasses

    from gpuwm.feed import DEVICE_FIELDS
    from gpuwm.feed.decode import DeviceEntry

    assert tuple(field.name for field in dataclasses.fields(DeviceEntry)) == DEVICE_FIELDS


def _plain_body(rng: random.Random, node: str, rows: int, seq_from: int) -> dict[str, Any]:
    """A snapshot's JSON with no processes or errors (what `parse_columns_many` reads together with others)."""
    samples = []
    for row in range(rows):
        uuid = f"GPU-{node}-{row % 3}"
        values: dict[str, Any] = {"t": 100.0 + row // 3 + rng.choice([0.0, 0.0, -7.0]), "node": node, "uuid": uuid,
                                  "seq": seq_from + row, "index": row % 3}
        for name, high in (("sm_percent", 100.0), ("memory_used_bytes", 8e10), ("energy_joules", 1e9),
                           ("merged_seconds", 14.0)):
            if rng.random() < 0.8:
                values[name] = rng.choice([0.0, high, round(rng.uniform(0, high), 3)])
        samples.append(GpuSample.model_validate(values))
    body: dict[str, Any] = orjson.loads(_snapshot_bytes(samples, node=node))
    return body


def _same_parse(ours: Any, theirs: Any) -> None:
    import numpy

    from gpuwm.feed.decode import SampleColumns

    if isinstance(theirs, ValueError):
        assert isinstance(ours, ValueError) and str(ours) == str(theirs)
        return
    assert isinstance(ours, SampleColumns) and isinstance(theirs, SampleColumns)
    assert ours.devices == theirs.devices and ours.errors == theirs.errors
    assert (ours.processes is None) == (theirs.processes is None)
    assert ours.gpu.dtype == theirs.gpu.dtype and numpy.array_equal(ours.gpu, theirs.gpu)
    assert numpy.array_equal(ours.t, theirs.t) and numpy.array_equal(ours.healthy, theirs.healthy)
    assert list(ours.numbers) == list(theirs.numbers)
    for name, column in theirs.numbers.items():
        assert numpy.array_equal(ours.numbers[name], column, equal_nan=True), name
    assert ours.max_seq == theirs.max_seq
    assert ours.in_time_order() == theirs.in_time_order() == (theirs.time_order() == numpy.arange(len(theirs))).all()
    assert [ours.sample(row) for row in range(len(ours))] == [theirs.sample(row) for row in range(len(theirs))]


_BREAKS: list[Any] = [
    lambda body: body["columns"].update(t=body["columns"]["t"][:-1]),
    lambda body: body["columns"]["t"].__setitem__(1, None),
    lambda body: body["columns"]["sm_percent"].__setitem__(0, "busy"),
    lambda body: body["columns"]["sm_percent"].__setitem__(1, 130.0),
    lambda body: body["columns"].__setitem__("power_watts", [-1.0] + [None] * (len(body["columns"]["t"]) - 1)),
    lambda body: body["columns"]["gpu"].__setitem__(1, len(body["gpus"])),
    lambda body: body["columns"]["gpu"].__setitem__(0, 0.5),
    lambda body: body["columns"]["seq"].__setitem__(1, 2.5),
    lambda body: body["columns"].__setitem__("healthy", [True] * (len(body["columns"]["t"]) - 1) + [1]),
    lambda body: body["gpus"][0].update(device_units=2),
    lambda body: body.update(processes={"row": [0], "pid": [1]}),
    lambda body: body.update(errors={"0": "GPU is lost"}),
    lambda body: body["columns"].update(t=[], gpu=[], seq=[], sm_percent=[], memory_used_bytes=[],
                                        energy_joules=[], merged_seconds=[]),
    lambda body: body["columns"].pop("seq"),
    lambda body: body["columns"]["seq"].__setitem__(0, None),  # not bad: a row without seq (its page's max skips it)
    lambda body: body["columns"].__setitem__("healthy", [False] * len(body["columns"]["t"])),
    lambda body: body.update(columns=[]),
]


@pytest.mark.parametrize("seed", range(12))
def test_pages_read_together_equal_each_read_on_its_own(seed: int) -> None:
    """`parse_columns_many`: the same SampleColumns (or the same error) as `parse_columns` of each page, whatever
    mix of plain pages, pages of another shape, with processes or errors, empty or malformed it is given; a bad
    page fails alone."""
    from gpuwm.feed.decode import parse_columns, parse_columns_many

    rng = random.Random(seed)
    pages = [_plain_body(rng, f"n{index}", rng.choice([1, 3, 9, 24]), 1 + 100 * index) for index in range(30)]
    for index in rng.sample(range(30), rng.randint(0, 4)):
        rng.choice(_BREAKS)(pages[index])
    for index in rng.sample(range(30), 2):  # a page with processes and errors: read on its own
        pages[index] = orjson.loads(_snapshot_bytes([_random_sample(rng, 5.0, 1, "GPU-1")]))
    expected: list[Any] = []
    for page in pages:
        try:
            expected.append(parse_columns(page))
        except (ValueError, TypeError, AttributeError) as error:
            expected.append(ValueError(str(error)))
    got = parse_columns_many(pages)
    assert len(got) == len(pages)
    for ours, theirs in zip(got, expected, strict=True):
        _same_parse(ours, theirs)


@pytest.mark.parametrize("index", range(len(_BREAKS)))
def test_each_kind_of_bad_page_among_good_ones_fails_alone(index: int) -> None:
    from gpuwm.feed.decode import SampleColumns, parse_columns, parse_columns_many

    rng = random.Random(index)
    pages = [_plain_body(rng, f"n{number}", 6, 1 + 10 * number) for number in range(5)]
    _BREAKS[index](pages[2])
    got = parse_columns_many(pages)
    assert all(isinstance(got[number], SampleColumns) for number in (0, 1, 3, 4))
    for ours, page in zip(got, pages, strict=True):
        try:
            theirs: Any = parse_columns(page)
        except (ValueError, TypeError, AttributeError) as error:
            theirs = ValueError(str(error))
        _same_parse(ours, theirs)


async def test_a_pull_reads_columns_outside_its_connection_slot_and_a_bad_agent_fails_alone(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pages wait to be read with other agents' outside the puller's connection slots: with 2 slots, an agent
    that answers only once every other agent was asked is still answered in time; a malformed agent fails alone,
    its `since` kept; the others' samples reach the intake (also when every page is read as soon as it waits)."""
    from gpuwm.feed.decode import ColumnBatch

    rng = random.Random(5)
    nodes = [f"n{index}" for index in range(6)]
    bodies = {node: _plain_body(rng, node, 6, 1) for node in nodes}
    bodies["n3"]["columns"]["sm_percent"][0] = 250.0
    asked: set[str] = set()
    everyone_asked = asyncio.Event()

    async def handle(request: web.Request) -> web.Response:
        node = request.match_info["node"]
        asked.add(node)
        if asked == set(nodes):
            everyone_asked.set()
        if node == "n0":
            await everyone_asked.wait()  # the slow one: held until every other agent was asked
        return web.Response(body=orjson.dumps(bodies[node]), content_type="application/json")

    app = web.Application()
    app.router.add_get("/{node}/v1/snapshot", handle)
    for batch_rows in (ColumnBatch.BATCH_ROWS, 1):
        monkeypatch.setattr(ColumnBatch, "BATCH_ROWS", batch_rows)
        asked.clear()
        everyone_asked.clear()
        caplog.clear()
        puller = AgentPuller(timeout_seconds=3, max_concurrency=2)
        intake = SampleIntake(Engine(EngineConfig()))
        async with serving(app) as url:
            try:
                result = await asyncio.wait_for(  # a pull stuck on its own batch fails here, not hangs
                    puller.pull_all({node: f"{url}/{node}" for node in nodes}, on_snapshot=intake.take), 20)
            finally:
                await puller.close()
        intake.flush()
        assert result.failed_nodes == ["n3"]
        assert sorted(snapshot.node for snapshot in result.snapshots) == [node for node in nodes if node != "n3"]
        assert intake.samples == 5 * 6
        assert puller.positions()["n3"]["since"] == 0 and puller.positions()["n0"]["since"] == 6
        assert any("agent for node 'n3' sent a malformed snapshot: column 'sm_percent' row 0: 250 is above 100"
                   in record.getMessage() for record in caplog.records)


async def test_a_pull_asks_at_most_max_concurrency_agents_at_once_and_times_each_from_when_it_is_sent() -> None:
    """Eight agents answering in 0.3 s each, two at a time: the pull takes four rounds (~1.2 s), past the 0.8 s
    timeout, yet every agent answers, as no request's timeout runs while it waits for a free slot; never more
    than two are asked at once, and the agents are asked in node order."""
    rng = random.Random(9)
    nodes = [f"n{index}" for index in range(8)]
    bodies = {node: _plain_body(rng, node, 3, 1) for node in nodes}
    in_flight, most, asked = 0, 0, []

    async def handle(request: web.Request) -> web.Response:
        nonlocal in_flight, most
        asked.append(request.match_info["node"])
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.3)
        finally:
            in_flight -= 1
        return web.Response(body=orjson.dumps(bodies[request.match_info["node"]]), content_type="application/json")

    app = web.Application()
    app.router.add_get("/{node}/v1/snapshot", handle)
    puller = AgentPuller(timeout_seconds=0.8, max_concurrency=2)
    intake = SampleIntake(Engine(EngineConfig()))
    async with serving(app) as url:
        try:
            started = asyncio.get_running_loop().time()
            result = await puller.pull_all({node: f"{url}/{node}" for node in reversed(nodes)}, on_snapshot=intake.take)
            took = asyncio.get_running_loop().time() - started
        finally:
            await puller.close()
    intake.flush()
    assert result.failed_nodes == []
    assert [snapshot.node for snapshot in result.snapshots] == nodes
    assert intake.samples == 8 * 3
    assert most == 2 and took >= 4 * 0.3
    assert asked == nodes


def test_a_puller_pulls_at_least_one_agent_at_a_time() -> None:
    with pytest.raises(ValueError, match="max_concurrency: at least 1 agent is pulled at a time, got 0"):
        AgentPuller(max_concurrency=0)
