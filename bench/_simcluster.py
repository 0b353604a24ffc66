"""A simulated cluster behind real agent HTTP endpoints, and the controller's path in front of it.

The agents (all nodes on one loopback server) run in a child process with the simulator,
so their CPU is not the controller's. The parent runs what the controller runs each
status interval: the real `AgentPuller` (HTTP, `/v1/snapshot?since=SEQ`, the agent's JSON
parsed by `parse_snapshot`), the accounting engine, the status builder (writes go to an
in-process recorder) and the embedded store. Simulated time runs as fast as the machine
allows; "lag" is the wall time from the end of an interval to its figures being stored.
"""

from __future__ import annotations

import asyncio
import bisect
import multiprocessing
import os
import resource
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

import orjson  # noqa: E402
from aiohttp import web  # noqa: E402

from gpuwm.accounting import Engine, EngineConfig  # noqa: E402
from gpuwm.config import Settings  # noqa: E402
from gpuwm.controller.pull import AgentPuller, SampleIntake  # noqa: E402
from gpuwm.controller.state.gctuning import collect_cycle_garbage, release_free_memory, tune_garbage_collector  # noqa: E402
from gpuwm.controller.status.build import build_project_status, build_workload_status  # noqa: E402
from gpuwm.feed import (  # noqa: E402
    DEVICES_TAG_PARAM,
    MergeRequest,
    columns_answer_json,
    merge_polls,
    merge_request,
    sample_columns,
)
from gpuwm.model.figures import ClusterFigures, ProjectFigures, WorkloadFigures  # noqa: E402
from gpuwm.model.podstats import PodStatsSample  # noqa: E402
from gpuwm.model.sample import GpuSample  # noqa: E402
from gpuwm.model.trace import NamespaceEvent, PodEvent, WorkloadEvent, parse_trace_line  # noqa: E402
from gpuwm.sim.simulator import SimConfig, Simulator  # noqa: E402
from gpuwm.sim.trace import truth_report  # noqa: E402
from gpuwm.store.embedded import EmbeddedStore  # noqa: E402


def rss_mib(field: str = "VmRSS") -> float:
    """Resident memory now (VmRSS) or the peak so far (VmHWM), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ----------------------------------------------------------------------------- agents (child)

#: records each simulated agent keeps (per kind); older ones are gone, as from the agent's ring buffer
RING_RECORDS = 20_000


@dataclass
class _AgentBuffer:
    agent_id: str = "sim-0"
    seq: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)
    pod_stats: list[dict[str, Any]] = field(default_factory=list)


def _after(records: list[dict[str, Any]], since: int) -> list[dict[str, Any]]:
    """Records with seq > since (records are in seq order)."""
    return records[bisect.bisect_right(records, since, key=lambda record: int(record["seq"])):]


def _serve_agents(config_json: str, pipe: Connection) -> None:
    asyncio.run(_agents_main(SimConfig.model_validate_json(config_json), pipe))


async def _agents_main(config: SimConfig, pipe: Connection) -> None:
    simulator = Simulator(config)
    buffers = {node.name: _AgentBuffer() for node in simulator.nodes}
    failing: dict[str, int] = {}  # node -> HTTP status to answer with (API-server-like 5xx/429 bursts)
    latest: dict[str, str] = {}  # pod uid or namespace -> its latest event (what a re-list would show)

    async def snapshot(request: web.Request) -> web.Response:
        node = request.match_info["node"]
        if node in failing:
            return web.Response(status=failing[node], text="injected failure")
        buffer = buffers[node]
        since = int(request.query.get("since", "0"))
        samples: list[Any] = _after(buffer.samples, since)
        merge = merge_request({name: request.query.getall(name) for name in request.query})
        if merge is not None:  # as the agent merges runs of polls (gpuwm.feed.merge)
            samples = merge_polls(samples, merge)
        body: dict[str, Any] = {"node": node, "seq": buffer.seq, "agent_id": buffer.agent_id, "truncated": False}
        if request.query.get("format") == "columns":  # what the controller asks for, encoded as the agent does
            body.update(format="columns", **sample_columns(samples))
        else:
            body["samples"] = samples
        body.update(pod_stats=_after(buffer.pod_stats, since), devices=[])
        if body.get("format") == "columns":  # its gpus left out when the controller holds them (as the agent does)
            return web.Response(body=columns_answer_json(body, request.query.get(DEVICES_TAG_PARAM)),
                                content_type="application/json")
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_get("/nodes/{node}/v1/snapshot", snapshot)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    loop = asyncio.get_running_loop()
    pipe.send({"port": port, "nodes": [node.name for node in simulator.nodes]})
    def generate(until: float) -> tuple[dict[str, list[tuple[bool, dict[str, Any]]]], list[str]]:
        """Run the simulator to `until` (in a worker thread, so the server keeps answering pulls)."""
        staged: dict[str, list[tuple[bool, dict[str, Any]]]] = {}  # node -> (is a sample, record)
        events: list[str] = []
        for step in simulator.run(until):
            for sample in step.samples:
                staged.setdefault(sample.node, []).append((True, sample.model_dump(exclude_none=True)))
            for stat in step.pod_stats:
                staged.setdefault(stat.node, []).append((False, stat.model_dump(exclude_none=True)))
            for event in step.events:
                line = event.model_dump_json(by_alias=True)
                events.append(line)
                latest[event.uid if isinstance(event, PodEvent | WorkloadEvent) else event.name] = line
        return staged, events

    while True:
        command = await loop.run_in_executor(None, pipe.recv)
        if command["op"] == "advance":
            staged, events = await loop.run_in_executor(None, generate, command["until"])
            for node, records in staged.items():  # published at once: a pull sees whole intervals
                buffer = buffers[node]
                for is_sample, record in records:
                    buffer.seq += 1
                    record["seq"] = buffer.seq
                    (buffer.samples if is_sample else buffer.pod_stats).append(record)
            for buffer in buffers.values():  # a ring buffer, like the agent's: reads do not remove records
                if len(buffer.samples) > RING_RECORDS:
                    del buffer.samples[:-RING_RECORDS]
                if len(buffer.pod_stats) > RING_RECORDS:
                    del buffer.pod_stats[:-RING_RECORDS]
            for node in command.get("kill", ()):  # SIGKILL and restart: what it had not served is gone
                generation = int(buffers[node].agent_id.rsplit("-", 1)[1]) + 1
                buffers[node] = _AgentBuffer(agent_id=f"sim-{generation}")
            pipe.send({"op": "advance", "clock": simulator.clock, "events": events})
        elif command["op"] == "fail":
            failing = dict(command["nodes"])
            pipe.send({"op": "fail"})
        elif command["op"] == "relist":
            pipe.send({"op": "relist", "events": list(latest.values())})
        elif command["op"] == "truth":
            pipe.send({"op": "truth", **truth_report(simulator)})
        else:
            break
    await runner.cleanup()


def _events(lines: list[str]) -> list[NamespaceEvent | PodEvent | WorkloadEvent]:
    events: list[NamespaceEvent | PodEvent | WorkloadEvent] = []
    for number, line in enumerate(lines, start=1):
        event = parse_trace_line(line, number)
        assert isinstance(event, NamespaceEvent | PodEvent | WorkloadEvent)
        events.append(event)
    return events


class SimulatedAgents:
    """The child process with every node's agent on one loopback port."""

    def __init__(self, config: SimConfig) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self.process = context.Process(target=_serve_agents, args=(config.model_dump_json(), child), daemon=True)
        self.process.start()
        hello = self._pipe.recv()
        self._stash: dict[str, list[dict[str, Any]]] = {}  # replies that came while waiting for another
        self.kill_next: list[str] = []
        self.urls = {node: f"http://127.0.0.1:{hello['port']}/nodes/{node}" for node in hello["nodes"]}

    def request_advance(self, until: float) -> None:
        """Ask the agents' simulator to run to `until` (it works while this process pulls the previous interval)."""
        self._pipe.send({"op": "advance", "until": until, "kill": self.kill_next})
        self.kill_next = []

    def _reply(self, op: str) -> dict[str, Any]:
        """The child's reply to `op`; an advance may be in flight while a fault is injected."""
        stashed = self._stash.get(op)
        if stashed:
            return stashed.pop(0)
        while True:
            reply: dict[str, Any] = self._pipe.recv()
            if reply["op"] == op:
                return reply
            self._stash.setdefault(reply["op"], []).append(reply)

    def wait_advance(self) -> tuple[float, list[NamespaceEvent | PodEvent | WorkloadEvent]]:
        reply = self._reply("advance")
        return float(reply["clock"]), _events(reply["events"])

    def kill_agents(self, nodes: list[str]) -> None:
        """The agents on `nodes` are killed and restarted at the end of the next interval requested,
        before the controller pulls it: that interval's samples from them are lost."""
        self.kill_next = list(nodes)

    def relist(self) -> list[NamespaceEvent | PodEvent | WorkloadEvent]:
        """Every pod's and namespace's current state, as a restarted controller's watch would list them."""
        self._pipe.send({"op": "relist"})
        return _events(self._reply("relist")["events"])

    def fail(self, nodes: dict[str, int]) -> None:
        self._pipe.send({"op": "fail", "nodes": nodes})
        self._reply("fail")

    def truth(self) -> dict[str, Any]:
        self._pipe.send({"op": "truth"})
        return self._reply("truth")

    def close(self) -> None:
        self._pipe.send({"op": "stop"})
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()


# ----------------------------------------------------------------------------- controller (parent)


@dataclass
class CycleFigures:
    cpu_seconds: float
    lag_seconds: float
    samples: int
    status_changes: int
    status_bytes: int
    store_cpu_seconds: float = 0.0  # part of cpu_seconds: the embedded store's record()
    #: part of cpu_seconds: every workload's and project's full status built and serialised, to count changes
    #: (the controller builds only those it writes, but pays about as much in signatures, renders and HTTP)
    status_cpu_seconds: float = 0.0


class SimulatedController:
    """Pull -> engine -> status -> store, once per status interval, on the simulated clock."""

    def __init__(self, agents: SimulatedAgents, config: SimConfig, store_path: Path, status_interval: float,
                 merge_seconds: float = 15.0) -> None:
        self.agents = agents
        self.config = config
        self.status_interval = status_interval
        self.merge_seconds = merge_seconds
        self.engine = Engine(EngineConfig(interval_seconds=config.interval_seconds,
                                          idle_threshold_percent=config.idle_threshold_percent))
        self.puller = AgentPuller(timeout_seconds=30.0, merge=self.merge_request())
        # the controller's default refresh of running workloads' latest rows (gpuwm.config.Settings)
        self.store = EmbeddedStore(store_path, latest_rows_per_interval=Settings().store_latest_rows_per_interval)
        self.store_path = store_path
        self.recorder: dict[str, str] = {}  # CR path -> last status written (JSON)
        self.cycles: list[CycleFigures] = []
        self.store_failures = 0  # store.record calls that raised (counted, as the controller logs and goes on)
        self.clock = config.start_time - config.interval_seconds
        self._requested: float | None = None
        tune_garbage_collector()  # the controller's garbage-collector settings, as its startup sets them

    async def cycle(self, end: float) -> CycleFigures:
        """One status interval; the agents simulate the next one meanwhile (unless it would pass `end`)."""
        if self._requested is None:
            self.agents.request_advance(self.clock + self.status_interval)
        self.clock, events = await asyncio.to_thread(self.agents.wait_advance)
        interval_end = time.perf_counter()  # the interval is over: the agents hold its samples
        self._requested = None
        if self.clock < end and not self.agents.kill_next:  # a kill waits for this pull: one interval lost, not two
            self._requested = self.clock + self.status_interval
            self.agents.request_advance(self._requested)
        cpu_before = cpu_seconds()
        for event in events:
            self.engine.observe(event)
        intake = SampleIntake(self.engine)  # as the controller does: each agent's samples into the engine on arrival
        result = await self.puller.pull_all(self.agents.urls, on_snapshot=intake.take)
        intake.flush()  # columnar snapshots go to the engine as one batch
        samples = sorted(intake.latest.values(), key=lambda sample: sample.t)  # the store reads each device's latest
        now = self.clock
        workloads, projects, cluster = self.engine.report(now)
        changes, size = 0, 0
        status_started = time.thread_time()
        for figures in workloads:
            status = build_workload_status(figures, now).model_dump_json(by_alias=True, exclude={"last_update_time"})
            path = f"{figures.namespace}/{figures.name}"
            if self.recorder.get(path) != status:
                self.recorder[path] = status
                changes, size = changes + 1, size + len(status)
        for project in projects:
            status = build_project_status(project, now).model_dump_json(by_alias=True, exclude={"last_update_time"})
            if self.recorder.get(project.name) != status:
                self.recorder[project.name] = status
                changes, size = changes + 1, size + len(status)
        status_cpu = time.thread_time() - status_started
        pod_stats = [stat for snapshot in result.snapshots for stat in snapshot.pod_stats]
        def record(samples: list[GpuSample], workloads: list[WorkloadFigures], projects: list[ProjectFigures],
                   cluster: ClusterFigures, pod_stats: list[PodStatsSample]) -> float:
            started = time.thread_time()
            try:
                self.store.record(now, samples, workloads, projects, cluster, pod_stats, compact=False)
            except Exception as error:  # as the controller does: CR status goes on without the store
                self.store_failures += 1
                if self.store_failures == 1:
                    print(f"store write failed at {now:.0f} ({len(samples)} samples, {len(workloads)} workloads): "
                          f"{type(error).__name__}: {error}", flush=True)
            return time.thread_time() - started

        store_cpu = await asyncio.to_thread(record, samples, workloads, projects, cluster, pod_stats)  # its own thread
        del samples, workloads, projects, cluster, result, pod_stats
        collect_cycle_garbage()  # as the controller does after each cycle (the young generation)
        store_cpu += await asyncio.to_thread(self._compact_slice, now)  # as the controller: once the figures are freed
        release_free_memory()  # as the controller does after each cycle (malloc_trim)
        cycle = CycleFigures(cpu_seconds() - cpu_before, time.perf_counter() - interval_end, intake.samples,
                             changes, size, store_cpu, status_cpu)
        self.cycles.append(cycle)
        return cycle

    def _compact_slice(self, now: float) -> float:
        """The store's compaction slice of the interval, as the controller runs it (`ControllerRuntime._compact`)."""
        started = time.thread_time()
        try:
            self.store.compact_slice(now)
        except Exception as error:  # as the controller does: the next slice tries again
            print(f"store compaction failed at {now:.0f}: {type(error).__name__}: {error}", flush=True)
        return time.thread_time() - started

    def merge_request(self) -> MergeRequest | None:
        """What the controller asks the agents to merge (`snapshotMerge`, as `gpuwm controller` asks)."""
        if self.merge_seconds <= 0:
            return None
        config = self.engine.config
        return MergeRequest(self.merge_seconds, config.idle_threshold_percent, config.gap_seconds)

    def store_bytes(self) -> int:
        return sum(os.path.getsize(path) for path in self.store_path.parent.glob(self.store_path.name + "*"))

    def store_projection(self, duration: float) -> dict[str, float]:
        """Bytes per stored row, and the steady-state size at the default roll-ups (15s:2d, 5m:30d).

        A row is one series' figures for one step. Each series writes one 15 s row per interval
        and one 5 m row per 20 of those, so at steady state the file holds 2 days of the fine rate
        plus 30 days of a twentieth of it. A store that keeps points in compressed chunks (schema
        2: `head` rows compacted into `chunks`) is compacted completely first and its rows are the
        chunks' points per tier; one with a table per tier (`points_15`, `points_300`) is counted as is.
        """
        connection = sqlite3.connect(self.store_path)
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "chunks" in tables:
            connection.close()
            store = EmbeddedStore(self.store_path)
            try:
                store.compact(everything=True)
            finally:
                store.close()
            connection = sqlite3.connect(self.store_path)
        try:
            connection.execute("VACUUM")  # pages freed by compaction are not the store's size
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            page_size = connection.execute("PRAGMA page_size").fetchone()[0]
            pages = connection.execute("PRAGMA page_count").fetchone()[0]
            series = connection.execute("SELECT count(*) FROM series").fetchone()[0]
            if "chunks" in tables:
                fine_rows, coarse_rows = (connection.execute(
                    "SELECT coalesce(sum(points), 0) FROM chunks WHERE tier = ?", (tier,)).fetchone()[0]
                    for tier in (15, 300))
            else:
                fine_rows = connection.execute("SELECT count(*) FROM points_15").fetchone()[0]
                coarse_rows = connection.execute("SELECT count(*) FROM points_300").fetchone()[0]
        finally:
            connection.close()
        file_bytes = float(page_size * pages)
        bytes_per_row = file_bytes / max(1, fine_rows + coarse_rows)
        fine_rows_per_second = fine_rows / duration
        steady = bytes_per_row * fine_rows_per_second * (2 * 86400 + 30 * 86400 / 20)
        return {"file_bytes": file_bytes, "bytes_per_row": bytes_per_row, "series": float(series),
                "steady_bytes": steady}

    async def close(self) -> None:
        await self.puller.close()
        self.store.close()


def lost_gpu_seconds(controller: SimulatedController, truth: dict[str, Any]) -> dict[str, float]:
    """Engine vs simulator, summed over workloads: what the pipeline lost or miscounted."""
    reported = {f"{w.namespace}/{w.name}": w for w in controller.engine.workloads(controller.clock)}
    totals = {"allocated": 0.0, "active": 0.0, "idle": 0.0, "unmonitored": 0.0,
              "truth_allocated": 0.0, "truth_unmonitored": 0.0, "missing_workloads": 0.0}
    for expected in truth["workloads"]:
        key = f"{expected['namespace']}/{expected['name']}"
        got = reported.get(key)
        totals["truth_allocated"] += expected["allocatedGpuSeconds"]
        totals["truth_unmonitored"] += expected["unmonitoredGpuSeconds"]
        if got is None:
            totals["missing_workloads"] += 1
            totals["allocated"] += expected["allocatedGpuSeconds"]
            continue
        totals["allocated"] += expected["allocatedGpuSeconds"] - got.allocated_gpu_seconds
        totals["active"] += expected["activeGpuSeconds"] - got.active_gpu_seconds
        totals["idle"] += expected["idleGpuSeconds"] - got.idle_gpu_seconds
        totals["unmonitored"] += expected["unmonitoredGpuSeconds"] - got.unmonitored_gpu_seconds
    return totals
