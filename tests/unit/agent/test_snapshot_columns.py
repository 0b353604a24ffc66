"""`/v1/snapshot?format=columns` from the agent's own buffer: the same samples as the row format.

Rows are for people (and the tests' model of them, `AgentSnapshot` in tests/snapshot_rows.py, reads
them here); the controller's decoder reads columns only and refuses rows by name.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import orjson
import pytest

from gpuwm.agent.buffer import SAMPLE
from gpuwm.agent.core import Agent
from gpuwm.agent.metrics import MetricsRenderer
from gpuwm.agent.server import AgentHTTPServer, serve_in_thread
from gpuwm.config import Settings
from gpuwm.feed import AgentDevice, MergeRequest
from gpuwm.feed.decode import FormatError, KnownDevices, parse_snapshot
from gpuwm.model import DeviceReading, GpuSample
from tests.snapshot_rows import AgentSnapshot


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@contextmanager
def _serving(agent: Agent) -> Iterator[str]:
    """The agent's HTTP server on a free loopback port while the block runs: its /v1/snapshot URL."""
    server = AgentHTTPServer(("127.0.0.1", 0), agent, MetricsRenderer(agent, process_metrics=False).render)
    thread = serve_in_thread(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/snapshot"
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


def test_columns_and_rows_carry_the_same_samples() -> None:
    agent = Agent(Settings(pod_resources_socket="/nonexistent.sock", proc_root="/nonexistent"), "node-1")
    samples = [
        GpuSample(t=10.0 + step, node="node-1", uuid=f"GPU-{index}", seq=2 * step + index + 1, index=index,
                  sm_percent=None if index else 40.0, healthy=index == 0, error=None if index == 0 else "GPU is lost",
                  energy_joules=100.0 * step, processes=[{"pid": 7, "pod_uid": "p", "sm_percent": 40.0}] if index == 0 else None)
        for step in range(3) for index in range(2)
    ]
    agent._records.append([(SAMPLE, sample) for sample in samples])
    with _serving(agent) as base:
        status, rows = _get(base + "?since=2")
        assert status == 200 and b'"samples":[' in rows
        status, columns = _get(base + "?since=2&format=columns")
        assert status == 200 and orjson.loads(columns)["format"] == "columns"
        from_rows, from_columns = AgentSnapshot.model_validate_json(rows), parse_snapshot(columns, "node-1")
        assert from_columns.columns is not None and from_columns.seq == from_rows.seq == 6
        assert [from_columns.columns.sample(row) for row in range(4)] == [DeviceReading.of(s) for s in from_rows.samples]
        assert from_rows.samples == samples[2:]
        with pytest.raises(FormatError, match=r"^agent for node 'node-1' answered format=rows; the controller reads "
                                              r"format=columns$"):
            parse_snapshot(rows, "node-1")
        status, body = _get(base + "?format=parquet")
        assert status == 400 and b"format='parquet'" in body


def test_merged_rows_and_columns_carry_the_same_samples() -> None:
    """`merge_seconds=...`: both formats send the same merged samples, which the controller reads alike."""
    agent = Agent(Settings(pod_resources_socket="/nonexistent.sock", proc_root="/nonexistent"), "node-1")
    samples = [
        GpuSample(t=10.0 + step, node="node-1", uuid="GPU-0", seq=step + 1, index=0, sm_percent=40.0 + step,
                  energy_joules=100.0 * step, memory_used_bytes=1e9, memory_total_bytes=8e10,
                  processes=[{"pid": 7, "pod_uid": "p", "sm_percent": 40.0 + step}])
        for step in range(8)
    ]
    agent._records.append([(SAMPLE, sample) for sample in samples])
    with _serving(agent) as url:
        base = url + "?since=0"
        merge = MergeRequest(15.0, 1.0, 3.0).query()
        status, rows = _get(base + merge)
        assert status == 200
        status, columns = _get(base + "&format=columns" + merge)
        assert status == 200
        from_rows, from_columns = AgentSnapshot.model_validate_json(rows), parse_snapshot(columns, "node-1")
        assert from_columns.columns is not None
        assert [from_columns.columns.sample(row) for row in range(3)] == [DeviceReading.of(s) for s in from_rows.samples]
        first, run, last = from_rows.samples
        assert (first, last) == (samples[0], samples[-1])
        assert run.seq == 7 and run.merged_seconds == 5.0 and run.energy_joules == 600.0
        assert run.sm_percent == sum(41.0 + step for step in range(6)) / 6
        status, body = _get(base + "&merge_gap_seconds=-1&merge_seconds=15")
        assert status == 400 and b"merge_gap_seconds" in body


def test_devices_the_puller_holds_are_left_out_under_their_tag() -> None:
    """`?devices_tag=`: the same `gpus` and `devices` as before are left out; any change sends them with a new tag."""
    agent = Agent(Settings(pod_resources_socket="/nonexistent.sock", proc_root="/nonexistent"), "node-1")
    agent.state.devices = [AgentDevice(uuid="GPU-0", device_id="GPU-0", units=1.0, namespace="ml", pod="train-0",
                                       pod_uid="uid-0", container="main", state="active")]
    samples = [GpuSample(t=10.0 + step, node="node-1", uuid=f"GPU-{index}", seq=2 * step + index + 1, index=index,
                         sm_percent=30.0 * index, energy_joules=100.0 * step) for step in range(3) for index in range(2)]
    agent._records.append([(SAMPLE, sample) for sample in samples])
    with _serving(agent) as base:
        _, first = _get(base + "?since=0&format=columns")
        full = orjson.loads(first)
        tag = full["devices_tag"]
        assert full["gpus"] and full["devices"] and "devices_unchanged" not in full
        _, again = _get(base + f"?since=2&format=columns&devices_tag={tag}")
        unchanged = orjson.loads(again)
        assert unchanged["devices_unchanged"] is True and unchanged["devices_tag"] == tag
        assert "gpus" not in unchanged and "devices" not in unchanged and len(again) < len(first) / 2
        # the controller reads it with the devices it kept from the full answer: the samples of a full answer
        kept = parse_snapshot(first, "node-1")
        assert kept.devices_tag == tag and kept.device_entries is not None
        known = KnownDevices(tag, "node-1", kept.device_entries, kept.holders)
        from_tag = parse_snapshot(again, "node-1", known=known)
        _, whole = _get(base + "?since=2&format=columns")
        from_whole = parse_snapshot(whole, "node-1")
        assert from_tag.columns is not None and from_whole.columns is not None
        assert [from_tag.columns.sample(row) for row in range(4)] == [from_whole.columns.sample(row) for row in range(4)]
        assert from_tag.holders is kept.holders and from_tag.holders == from_whole.holders
        # another tag, or devices that changed, give them again (with their own tag)
        _, other = _get(base + "?since=2&format=columns&devices_tag=0123")
        assert orjson.loads(other)["devices_tag"] == tag and "gpus" in orjson.loads(other)
        agent.state.devices = [agent.state.devices[0].model_copy(update={"pod": "train-1", "pod_uid": "uid-1"})]
        _, moved = _get(base + f"?since=2&format=columns&devices_tag={tag}")
        assert orjson.loads(moved)["devices_tag"] != tag and orjson.loads(moved)["devices"][0]["pod"] == "train-1"
        # rows carry their devices as always
        _, rows = _get(base + f"?since=2&devices_tag={tag}")
        assert "devices_tag" not in orjson.loads(rows) and orjson.loads(rows)["devices"]
