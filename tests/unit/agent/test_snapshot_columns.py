"""`/v1/snapshot?format=columns` from the agent's own buffer: the same samples as the row format."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import orjson

from gpuwm.agent.buffer import SAMPLE
from gpuwm.agent.core import Agent
from gpuwm.agent.merge import MergeRequest
from gpuwm.agent.metrics import MetricsRenderer
from gpuwm.agent.server import AgentHTTPServer, serve_in_thread
from gpuwm.config import Settings
from gpuwm.controller.agents import parse_snapshot
from gpuwm.model import GpuSample


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
        from_rows, from_columns = parse_snapshot(rows, "node-1"), parse_snapshot(columns, "node-1")
        assert from_columns.columns is not None and from_columns.seq == from_rows.seq == 6
        assert [from_columns.columns.sample(row) for row in range(4)] == from_rows.samples == samples[2:]
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
        from_rows, from_columns = parse_snapshot(rows, "node-1"), parse_snapshot(columns, "node-1")
        assert from_columns.columns is not None
        assert [from_columns.columns.sample(row) for row in range(3)] == from_rows.samples
        first, run, last = from_rows.samples
        assert (first, last) == (samples[0], samples[-1])
        assert run.seq == 7 and run.merged_seconds == 5.0 and run.energy_joules == 600.0
        assert run.sm_percent == sum(41.0 + step for step in range(6)) / 6
        status, body = _get(base + "&merge_gap_seconds=-1&merge_seconds=15")
        assert status == 400 and b"merge_gap_seconds" in body
