"""`gpuwm demo`: the real engine, embedded store, API and dashboard on a simulated fleet, in one process.

The simulated clock starts `warmup` before now and catches up as fast as the machine
allows (so the dashboard has history at once), then runs at `speed` x real time. The
simulator, engine and store writes run in a worker thread in short chunks, so the API
stays responsive and Ctrl-C stops within a fraction of a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from rich.console import Console
from rich.live import Live

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.config import Settings
from gpuwm.model import ClusterFigures, GpuSample, PodStatsSample, WorkloadFigures
from gpuwm.sim.policies import DemoPolicies
from gpuwm.sim.simulator import Simulator, faulted_simulator
from gpuwm.sim.table import clock_text, cluster_line, render, truth_line
from gpuwm.sim.trace import truth_report
from gpuwm.store import Store

#: work per chunk in the worker thread: about this many device samples (keeps Ctrl-C and the API prompt)
_SAMPLES_PER_CHUNK = 4000


@dataclass(frozen=True)
class DemoOptions:
    nodes: int
    gpus_per_node: int
    speed: float
    listen: str
    seed: int
    warmup_seconds: float
    store_path: str | None
    faults: bool
    table: bool
    settings: Settings
    policies: DemoPolicies | None = None


class SimulatedController:
    """What the controller does each status interval, fed by the simulator instead of agents."""

    def __init__(
        self, simulator: Simulator, engine: Engine, store: Store, status_interval_seconds: float,
        retention_seconds: float = 7 * 86400.0, policies: DemoPolicies | None = None,
    ) -> None:
        self.simulator = simulator
        self.engine = engine
        self.store = store
        self.status_interval_seconds = status_interval_seconds
        self.retention_seconds = retention_seconds
        self.samples: list[GpuSample] = []
        self.pod_stats: list[PodStatsSample] = []
        self.next_record = simulator.config.start_time + status_interval_seconds
        self.workloads: list[WorkloadFigures] = []
        self.cluster: ClusterFigures | None = None
        self.records = 0
        self.samples_total = 0
        #: the simulator's ground truth at the latest recorded interval (`truth_report`), served at /demo/truth,
        #: set once the store holds that interval; `recording` while the store is being written
        self.truth: dict[str, Any] | None = None
        self.recording = False
        #: how the latest recorded figures compare with that truth (`truth_line`), for the terminal
        self.truth_summary = truth_line(None, [])
        #: the dry-run idle policy and the cost of the fleet's GPUs, each status interval
        self.policies = policies if policies is not None else DemoPolicies.with_defaults()

    def advance(self, until: float, max_steps: int) -> int:
        """Step the simulation up to `until` (at most `max_steps` steps); record each status interval."""
        steps = 0
        interval = self.simulator.config.interval_seconds
        while steps < max_steps and self.simulator.clock + interval <= until:
            step = self.simulator.step()
            for sample in step.samples:
                self.engine.observe_sample(sample)
            for event in step.events:
                self.engine.observe(event)
            self.samples.extend(step.samples)
            self.pod_stats.extend(step.pod_stats)
            self.samples_total += len(step.samples)
            steps += 1
            if step.t >= self.next_record:
                self.record(step.t)
                while self.next_record <= step.t:
                    self.next_record += self.status_interval_seconds
        return steps

    def record(self, now: float) -> None:
        workloads, projects, cluster = self.engine.report(now)
        truth = truth_report(self.simulator)
        # a reader of /api/v1/workloads between two answers of /demo/truth with the same `at`, the second not
        # `recording`, read that interval's figures: the truth is published only once the store holds them
        self.recording = True
        self.store.record(now, self.samples, workloads, projects, cluster, self.pod_stats)
        self.samples, self.pod_stats = [], []
        self.workloads, self.cluster = workloads, cluster
        self.truth, self.truth_summary = truth, truth_line(truth, workloads)
        self.recording = False
        self.policies.observe(workloads, now)
        self.store.record_prices(now, self.policies.prices)
        self.records += 1
        for figures in workloads:  # as the controller does: a finished workload is kept for `retention`
            if figures.end_time is not None and figures.allocated_gpus <= 0 and now - figures.end_time >= self.retention_seconds:
                self.engine.forget_workload(figures.uid)


def add_truth_route(app: FastAPI, controller: SimulatedController) -> None:
    """`GET /demo/truth`: what the simulator generated, to hold the API's figures against (the demo only)."""

    async def demo_truth() -> JSONResponse:
        """The simulator's exact GPU-seconds and energy per workload at the latest recorded status interval.

        The JSON `gpuwm demo --write-trace FILE --write-truth TRUTH` writes: `at` (the interval's time),
        `seed` and `workloads` (namespace, name, kind, allocated/active/idle/unmonitored GPU-seconds, energy
        and lifetime utilisation, as generated), and `recording`: whether the next interval is being stored
        now. `/api/v1/workloads` read between two answers with the same `at`, the second one not
        `recording`, holds that interval's figures.
        """
        truth = controller.truth
        recording = controller.recording  # read after the truth (see `SimulatedController.record`)
        if truth is None:
            return JSONResponse({"error": "not_ready", "message": "no status interval recorded yet"}, status_code=503)
        return JSONResponse({**truth, "recording": recording})

    app.add_api_route("/demo/truth", demo_truth, methods=["GET"], tags=["demo"],
                      summary="The simulator's ground truth (gpuwm demo only)")


def _check_can_listen(host: str, port: int) -> None:
    """Raise OSError (address in use, not available) before uvicorn tries."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


async def run_demo(options: DemoOptions) -> int:
    """Serve the demo until SIGINT/SIGTERM; returns the exit status."""
    from gpuwm.api import ApiServer, create_app
    from gpuwm.config import parse_listen
    from gpuwm.store import open_store

    settings = options.settings
    host, port = parse_listen(options.listen, "--listen", 8080)
    temp_dir: Path | None = None
    if options.store_path is None:
        temp_dir = Path(tempfile.mkdtemp(prefix="gpuwm-demo-"))
        store_path = str(temp_dir / "gpuwm.db")
    else:
        store_path = options.store_path
    store: Any = None
    console = Console()
    try:  # from here on the temporary folder goes, whatever fails (a bad --store-rollups, a port in use)
        store = open_store(store_path, rollups=settings.store_rollups, retention_seconds=settings.retention,
                           latest_rows_per_interval=settings.store_latest_rows_per_interval)
        started_wall = time.time()
        start = float(int(started_wall - options.warmup_seconds))  # whole seconds: tidy sample times
        simulator = faulted_simulator(options.seed, options.nodes, options.gpus_per_node, settings.interval, start,
                                      settings.idle_threshold_percent, options.warmup_seconds if options.faults else None)
        engine = Engine(EngineConfig.from_settings(settings))
        controller = SimulatedController(simulator, engine, store, settings.status_interval, settings.retention,
                                         options.policies)
        # the API prices its period reports as the simulated controller priced the workloads
        app = create_app(store, settings.model_copy(update={
            "auth": "none", "api_listen": options.listen, "pricing": controller.policies.meter.book.pricing}))
        add_truth_route(app, controller)
        server = ApiServer(app, host, port, log_level=settings.log_level)
        _check_can_listen(host, port)  # uvicorn would sys.exit() from inside the loop instead
        await server.start()
        url = f"http://{host if ':' not in host else f'[{host}]'}:{server.port}/"
        print(f"gpuwm demo: dashboard {url}  API {url}api/v1/workloads  (store {store_path}; Ctrl-C stops)", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(signum, stop.set)
        try:
            await _drive(options, controller, console, url, stop)
        finally:
            await server.stop()
        print(f"gpuwm demo: stopped at simulated {clock_text(simulator.clock)}; "
              f"{controller.samples_total} samples, {controller.records} status intervals recorded\n"
              f"gpuwm demo: {controller.policies.summary()}", flush=True)
        return 0
    finally:
        if store is not None:
            store.close()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


async def _drive(
    options: DemoOptions, controller: SimulatedController, console: Console, url: str, stop: asyncio.Event
) -> None:
    """Warm up to now, then run at `speed`; refresh the terminal view about once a second."""
    simulator = controller.simulator
    sampled_devices = max(1, sum(len(gpu.devices) + 1 for node in simulator.nodes for gpu in node.gpus))
    max_steps = max(1, _SAMPLES_PER_CHUNK // sampled_devices)
    warm_start = simulator.config.start_time
    live = Live(console=console, refresh_per_second=2, transient=False) if options.table else None
    anchor: tuple[float, float] | None = None  # (simulated, monotonic) when warm-up ended
    last_view = 0.0
    with live if live is not None else contextlib.nullcontext():
        while not stop.is_set():
            if anchor is None:
                target = time.time()
            else:
                target = anchor[0] + options.speed * (time.monotonic() - anchor[1])
            steps = await asyncio.to_thread(controller.advance, target, max_steps)
            if anchor is None and simulator.clock + simulator.config.interval_seconds > target:
                anchor = (simulator.clock, time.monotonic())
                if live is None:
                    print(f"gpuwm demo: warm-up done ({clock_text(simulator.clock)}); running at {options.speed:g}x",
                          flush=True)
            if time.monotonic() - last_view >= (1.0 if live is not None else 10.0):
                last_view = time.monotonic()
                if anchor is None:
                    done = (simulator.clock - warm_start) / max(1.0, target - warm_start)
                    header = (f"gpuwm demo: warming up, simulating the last {options.warmup_seconds / 60:.0f} minutes: "
                              f"{100 * done:.0f}% ({clock_text(simulator.clock)})   dashboard {url}")
                else:
                    header = (f"gpuwm demo: {options.nodes} nodes x {options.gpus_per_node} GPUs (simulated), "
                              f"{options.speed:g}x real time, now {clock_text(simulator.clock)}   dashboard {url}")
                if live is not None:
                    rows = max(5, console.size.height - 6)
                    live.update(render(header, controller.workloads, controller.cluster, simulator.clock, rows - 2,
                                       f"{controller.truth_summary}\n{controller.policies.summary()}"))
                else:
                    print(f"{header}\n  {cluster_line(controller.cluster)}\n  {controller.truth_summary}\n"
                          f"  {controller.policies.summary()}", flush=True)
            if steps < max_steps:  # caught up: wait for the clock (or Ctrl-C)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=0.2)
    sys.stdout.flush()
