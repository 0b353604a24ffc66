"""Controller benchmark: a simulated 1,000-node / 8,000-GPU / 4,000-workload cluster.

The API emulator and the agents run in a child process on loopback (so their CPU is not
counted); this process runs the controller's real runtime (owner walk, agent pulls, engine,
status builder, rate-limited writer, state save) and prints per-cycle figures:
CPU seconds per status cycle, RSS, status writes per second, and the lag from a sample to
the CR status that includes it (p50/p99, over the statuses written). Freshness as
`kubectl get gwm` sees it (`Freshness`): the age of EVERY running workload's CR figures at the
end of each interval (p50/p99/max over all CRs, written lately or not, and read back from the
API at the end), and the lag from a state change (`--state-changes` workloads end or go idle
before `--change-cycle`) to the first written status that shows it.

    .venv/bin/python bench/controller.py                  # full size, 15 s cycles, 11 after an hour (steady: 4-11)
    .venv/bin/python bench/controller.py --nodes 100 --cycles 3 --status-interval 5 --history-minutes 5
    .venv/bin/python bench/controller.py --restart

With `--restart` a first controller runs in a child process (the history, then `--restart-after` cycles)
and stops, its engine state saved; this process then starts from that state and the store file as a
restarted controller does (state restored, store reopened, no history fed: the restored engine holds the
hour) against the same cluster, and its cycles are the ones measured.

Before the first cycle the engine is fed an hour of samples (`--history-minutes`, ~1.5-3 CPU-
minutes at full size, not counted): a controller's window segments and GPU history reach their
steady size only after the hour its 1h window spans, which a few cycles never did.

Targets: <= 1.5 CPU-seconds per 15 s cycle, <= 320 MiB RSS, writes <= the configured
rate, p99 lag <= 2 intervals. kopf's pod watch is replaced by feeding the same Pod bodies
to `ControllerRuntime.on_pod`, which is what the kopf handler does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402
from tests.integration.fakeagent import FakeNode, merge_of  # noqa: E402
from tests.integration.kubeemu import EmulatorThread, KubernetesEmulator  # noqa: E402

from _interpreter import interpreter_description  # noqa: E402
from gpuwm.controller.kopf_import import import_kopf_without_clients  # noqa: E402

import_kopf_without_clients()  # as `gpuwm controller` does first: the controller's modules import kopf

from gpuwm.config import Settings  # noqa: E402
from gpuwm.controller.command import event_loop_factory  # noqa: E402
from gpuwm.controller.kube.client import KubeClient  # noqa: E402
from gpuwm.controller.pull.agents import index_holders  # noqa: E402
from gpuwm.controller.runtime import ControllerRuntime  # noqa: E402
from gpuwm.controller.state.gctuning import tune_garbage_collector  # noqa: E402
from gpuwm.feed import DEVICES_TAG_PARAM  # noqa: E402
from gpuwm.feed.decode import DeviceHolder  # noqa: E402

NAMESPACES = 40
#: cycles left out of the steady figures when there are more (see `run_bench`): the runtime saves its state at
#: each of its first three cycles (every stateSaveInterval after that)
STARTUP_CYCLES = 3


def rss_mib(field: str = "VmRSS") -> float:
    """This process's resident memory now (VmRSS) or at its peak so far (VmHWM), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reference_cpu_seconds(repeats: int = 5) -> float:
    """The least CPU time of a fixed piece of Python work (dicts, JSON, sorting, float sums), over `repeats` runs.

    The same code's cycle CPU moved ~2x between sessions on VMs of one kind (0.55 and 1.08 CPU-s, every phase
    alike: the host's load, not the code), so each run prints this beside its figures: compare cycles
    across runs only together with it.
    """
    import json

    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        rows = [{"uid": f"pod-{index:06d}", "t": index * 0.25, "sm_percent": (index * 37) % 101} for index in range(40_000)]
        decoded = json.loads(json.dumps(rows))
        decoded.sort(key=lambda row: (row["sm_percent"], row["uid"]))
        total = 0.0
        for row in decoded:
            total += row["t"] * row["sm_percent"]
        best = min(best, time.process_time() - started)
    return best


def reset_peak_rss() -> None:
    """Start VmHWM again from the current RSS (Linux: `clear_refs` 5), to see which phase peaks."""
    with open("/proc/self/clear_refs", "w") as file:
        file.write("5")


def track_collections() -> dict[int, list[float]]:
    """CPU seconds of each cyclic garbage collection, by generation, since the last `clear()` of each list."""
    import gc

    spent: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.process_time()
        else:
            spent[info["generation"]].append(time.process_time() - started[0])

    gc.callbacks.append(callback)
    return spent


def track_phase_peaks() -> dict[str, float]:
    """Each status-cycle phase's peak RSS (MiB), kept in the returned dict (the latest cycle's; `between`:
    from the end of a cycle to the start of the next, the writer's work)."""
    from gpuwm.controller import runtime as runtime_module

    peaks: dict[str, float] = {}
    mark = runtime_module._PhaseTimer.mark

    def marked(self: Any, phase: str) -> None:
        mark(self, phase)
        peaks[phase] = rss_mib("VmHWM")
        reset_peak_rss()

    runtime_module._PhaseTimer.mark = marked  # type: ignore[method-assign]
    return peaks


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class Freshness:
    """What `kubectl get gwm` would show and how old it is: the age of EVERY CR's figures, and state-change lag.

    Watches the writer's `write` (its signature is the same in every version of the writer): each
    GPUWorkloadMetrics status it sends is seen as rendered and its `lastUpdateTime` (the time its
    figures are as of) kept per CR. The age of a CR's figures at a moment is that moment minus its
    `lastUpdateTime`, over all running workloads' CRs, not only those written lately; a CR not
    written since the bench began counts from the bench's start (its figures are older still).
    A state change (`change`) is reached when a status that shows it is written: its lag is that
    write's time minus the change's.
    """

    def __init__(self, runtime: ControllerRuntime, names: list[str]) -> None:
        self.names = names
        self.started = time.time()
        self.as_of: dict[str, float] = {}
        self.changes: dict[str, tuple[float, str, Any]] = {}  # CR name -> (changed at, kind, shows it?)
        self.lags: dict[str, list[float]] = {}  # kind -> lag of each change reached
        writer = runtime.writer
        write = writer.write

        async def watched(desired: Any) -> None:
            render, seen = desired.render, []

            def rendered() -> dict[str, Any]:
                status = render()
                seen.append(status)
                return status

            desired.render = rendered
            await write(desired)
            if seen and desired.plural == "gpuworkloadmetrics":
                self._written(desired.name, seen[-1], time.time())

        writer.write = watched  # type: ignore[method-assign]

    def _written(self, name: str, status: dict[str, Any], at: float) -> None:
        stamp = status.get("lastUpdateTime")
        if stamp:
            self.as_of[name] = time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
        change = self.changes.get(name)
        if change is not None and change[2](status):
            del self.changes[name]
            self.lags.setdefault(change[1], []).append(at - change[0])

    def change(self, name: str, kind: str, shows: Any, at: float) -> None:
        self.changes[name] = (at, kind, shows)

    def ages(self, now: float) -> tuple[list[float], int]:
        """Each running workload's CR figures' age now, and how many were not written since the start."""
        ages = [now - self.as_of.get(name, self.started) for name in self.names]
        return ages, sum(name not in self.as_of for name in self.names)


def layout(nodes: int, gpus_per_node: int, gpus_per_workload: int) -> list[tuple[str, str, str, list[str]]]:
    """(namespace, job name, node, gpu uuids) per workload: each node's GPUs split into workloads."""
    workloads: list[tuple[str, str, str, list[str]]] = []
    for node_index in range(nodes):
        node = f"node-{node_index:04d}"
        gpus = [f"GPU-{node_index:04d}-{g}" for g in range(gpus_per_node)]
        for start in range(0, gpus_per_node, gpus_per_workload):
            index = len(workloads)
            workloads.append((f"team-{index % NAMESPACES:02d}", f"job-{index:05d}", node, gpus[start:start + gpus_per_workload]))
    return workloads


def finished_layout(count: int) -> list[tuple[str, str, str, list[str]]]:
    """Workloads that ran and ended before the bench (kept for the retention, as in a cluster after days)."""
    return [(f"team-{index % NAMESPACES:02d}", f"done-{index:05d}", f"node-{index % 1000:04d}", [])
            for index in range(count)]


def finished_pod_body(namespace: str, name: str, node: str, job_uid: str, origin: float) -> dict[str, Any]:
    """A pod that ran from `origin` - 2 h to `origin` - 1 h (the same body in both of --restart's controllers)."""
    body = pod_body(namespace, name, node, 1, job_uid, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(origin - 7200)))
    ended = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(origin - 3600))
    body["status"] = {"phase": "Succeeded", "startTime": body["status"]["startTime"], "containerStatuses": [
        {"name": "main", "state": {"terminated": {"startedAt": body["status"]["startTime"], "finishedAt": ended,
                                                  "exitCode": 0}}}]}
    return body


def agent_holders(plan: list[tuple[str, str, str, list[str]]]) -> dict[str, list[DeviceHolder]]:
    """Each node's device holders as its agent reports them (what the first pull would tell the controller)."""
    by_node: dict[str, list[DeviceHolder]] = {}
    for namespace, name, node, gpus in plan:
        by_node.setdefault(node, []).extend(
            DeviceHolder(uuid=gpu, device_id=gpu, units=1.0, resource_name="nvidia.com/gpu", namespace=namespace,
                         pod=f"{name}-0", pod_uid=f"pod-{name}", container="main")
            for gpu in gpus)
    return by_node


def warm_up(runtime: ControllerRuntime, plan: list[tuple[str, str, str, list[str]]], minutes: float,
            interval: float, jitter_percent: float, chase: bool = True, store_history: bool = False) -> tuple[int, float]:
    """Feed the engine `minutes` of samples of every held GPU, ending now: the state of a controller that has
    been running that long (window segments and history at their steady size, the hour's segments
    dropped as they age). The samples go in as the pulls would put them (`Engine.observe_samples`, one
    status interval's rows at a time), chasing the clock until they reach it. Returns (rows, CPU-s).

    `store_history`: each status interval of it is also reported and recorded in the store, without its
    compaction slices (see `record_history`).
    """
    import numpy

    from gpuwm.accounting.state import SampleBatch
    from gpuwm.model.sample import GpuSample

    gpus = [(node, gpu) for _, _, node, held in plan for gpu in held]
    uuids, nodes = [gpu for _, gpu in gpus], [node for node, _ in gpus]
    latest = [GpuSample(t=0.0, node=node, uuid=gpu, sm_percent=60.0) for node, gpu in gpus]
    rng = numpy.random.default_rng(7)
    count = len(gpus)
    t = origin = time.time() - minutes * 60.0
    rows = 0
    started = time.process_time()
    # without `chase` (traced runs, slower than real time) the history ends where the warm-up started
    stop = time.time() - interval

    def end_of() -> float:
        return time.time() - interval if chase else stop

    while t < end_of():
        steps = numpy.arange(t, min(t + runtime.settings.status_interval, end_of()), interval)
        if not len(steps):
            break
        sm = numpy.clip(numpy.rint(60.0 + rng.uniform(-jitter_percent, jitter_percent, (len(steps), count))), 0, 100)
        merged = numpy.zeros(len(steps))
        if runtime.settings.snapshot_merge > 0 and len(steps) >= 4:
            # what the agents send when asked to merge (gpuwm.feed.merge): the pull's first poll, the busy run
            # between as one sample at its last poll (its mean), the last poll
            sm = numpy.stack((sm[0], sm[1:-1].mean(axis=0), sm[-1]))
            merged = numpy.array([0.0, steps[-2] - steps[1], 0.0])
            steps = numpy.array([steps[0], steps[-2], steps[-1]])
        times = numpy.repeat(steps, count)
        runtime.engine.observe_samples(SampleBatch(
            uuids=uuids, nodes=nodes, parent_uuids=[None] * count, device_units=[1.0] * count,
            device=numpy.tile(numpy.arange(count), len(steps)), t=times, sm=sm.ravel(),
            memory=numpy.full(len(times), 50.0), energy=200.0 * (times - origin), pod_sm=[None] * len(times),
            sample=lambda row: latest[row % count], merged=numpy.repeat(merged, count),
        ))
        rows += len(times)
        t = float(steps[-1]) + interval
        if store_history:
            last = float(steps[-1])
            record_history(runtime, last, [
                GpuSample(t=last, node=node, uuid=gpu, sm_percent=float(value), memory_used_bytes=40e9,
                          memory_total_bytes=80e9, power_watts=300.0 + float(value), energy_joules=200.0 * (last - origin))
                for node, gpu, value in zip(nodes, uuids, sm[-1], strict=True)])
    return rows, time.process_time() - started


def record_history(runtime: ControllerRuntime, t: float, samples: list[Any]) -> None:
    """One interval of the warm-up's history into the store, as a cycle records it, without the compaction slice.

    So the store's head holds the hour a running controller's does, none of it compacted: the first cycle starts
    the compaction round of the closed hour (the span before the current one, which an hour of history always
    reaches into), as in the first 49 minutes of every hour at 1,000 nodes, and each steady cycle runs its slice. Without this the
    store starts empty and the cycles never compact (unless the run crosses an hour).
    """
    workloads, projects, cluster = runtime.engine.report(t)
    runtime.store.record(t, samples, workloads, projects, cluster, compact=False)


def serve_cluster(args: argparse.Namespace, pipe: Any) -> None:
    """Child process: the API emulator with the Jobs and namespaces, and every node's agent on one port."""
    emulator = KubernetesEmulator(ROOT / "crds")
    store = emulator.store
    ns_type = emulator.types[("", "v1", "namespaces")]
    job_type = emulator.types[("batch", "v1", "jobs")]
    for index in range(NAMESPACES):
        store.create(ns_type, None, {"metadata": {"name": f"team-{index:02d}",
                                                  "labels": {"gpuwm.io/project": f"project-{index % 10}"}}}, "bench")
    jobs = {}
    plan = layout(args.nodes, args.gpus_per_node, args.gpus_per_workload)
    for namespace, name, _, _ in plan + finished_layout(args.finished):
        jobs[name] = store.create(job_type, namespace, {"metadata": {"name": name}, "spec": {}}, "bench")["metadata"]["uid"]
    if getattr(args, "state_dir", None):  # a run that may restore or be restored (bench/pull.py's cluster has no pods)
        # the pods exist, as in a cluster: a restarted controller lists them and ends the ones that vanished
        # while it was down (without them here it would end every pod at its restore and start it again)
        store.keep_client_uids = True
        pod_type = emulator.types[("", "v1", "pods")]
        for namespace, name, node, gpus in plan:
            store.create(pod_type, namespace, pod_body(namespace, name, node, len(gpus), jobs[name], args.pods_started),
                         "bench")
        for namespace, name, node, _ in finished_layout(args.finished):
            store.create(pod_type, namespace, finished_pod_body(namespace, name, node, jobs[name], args.origin), "bench")
    nodes = {f"node-{i:04d}": FakeNode(f"node-{i:04d}", [f"GPU-{i:04d}-{g}" for g in range(args.gpus_per_node)],
                                       interval=args.interval, sm_percent=60.0,
                                       sm_jitter_percent=args.jitter_percent) for i in range(args.nodes)}
    for namespace, name, node, gpus in plan:
        for gpu in gpus:
            nodes[node].hold(gpu, namespace, f"{name}-0", pod_uid=f"pod-{name}")
    if args.existing_crs:  # as after an earlier controller ran: every CR exists, status writes are PATCHes only
        cr_type = emulator.types[("gpuwm.io", "v1alpha1", "gpuworkloadmetrics")]
        for namespace, name, _, _ in plan:
            store.create(cr_type, namespace, {
                "apiVersion": "gpuwm.io/v1alpha1", "kind": "GPUWorkloadMetrics",
                "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpuwm"}},
                "spec": {"workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": jobs[name]},
                         "project": f"project-{int(namespace[-2:]) % 10}"},
            }, "gpuwm")
    thread = EmulatorThread(emulator)
    thread.start()

    async def start_agents() -> str:
        async def snapshot(request: web.Request) -> web.Response:
            node = nodes[request.match_info["node"]]  # the agent's JSON, in the format asked for (columns)
            body = node.snapshot_json(int(request.query.get("since", "0")), request.query.get("format"),
                                      merge_of(request), request.query.get(DEVICES_TAG_PARAM))
            return web.Response(body=body, content_type="application/json")
        async def control(request: web.Request) -> web.Response:
            # the bench's state changes: a node's GPUs turn idle (or busy) from the next poll on
            node = nodes[request.match_info["node"]]
            node.sm_percent = float(request.query["sm"])
            if not node.sm_percent:
                node.sm_jitter_percent = 0.0  # idle is 0 %, not 0 +- the jitter
            return web.Response(text="ok")
        app = web.Application()
        app.router.add_get("/{node}/v1/snapshot", snapshot)
        app.router.add_post("/{node}/control", control)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    agents_url = thread.run(start_agents())
    pipe.send((thread.url, agents_url, jobs))
    pipe.recv()  # until the parent is done
    thread.stop()


@contextlib.contextmanager
def cluster_served(args: argparse.Namespace) -> Iterator[tuple[str, str, dict[str, str]]]:
    """`serve_cluster` in a child process for the block: (API URL, agents' base URL, job uids by name)."""
    parent, child = multiprocessing.Pipe()
    cluster = multiprocessing.Process(target=serve_cluster, args=(args, child), daemon=True)
    cluster.start()
    try:
        yield parent.recv()
    finally:
        parent.send("done")
        cluster.join(timeout=20)
        if cluster.is_alive():
            cluster.kill()


def pod_body(namespace: str, name: str, node: str, gpus: int, job_uid: str, started: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{name}-0", "namespace": namespace, "uid": f"pod-{name}", "creationTimestamp": started,
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job_uid,
                                          "controller": True}]},
        "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": "Running", "startTime": started,
                   "containerStatuses": [{"name": "main", "state": {"running": {"startedAt": started}}}]},
    }


async def run_bench(args: argparse.Namespace, api_url: str, agents_url: str, jobs: dict[str, str]) -> None:
    if args.process_modules:
        # what `gpuwm controller` holds besides the runtime in a pod: kopf (without the official client: the
        # service account login does not load it, gpuwm.controller.kube.login), its handlers and the metrics API
        import gpuwm.api.app
        import gpuwm.controller.handlers  # noqa: F401
    plan = layout(args.nodes, args.gpus_per_node, args.gpus_per_workload)
    state_dir = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="gpuwm-bench-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        agents="static:" + ",".join(f"node-{i:04d}={agents_url}/node-{i:04d}" for i in range(args.nodes)),
        status_interval=args.status_interval, interval=args.interval, store=str(state_dir / "gpuwm.db"),
        status_writes_per_second=args.writes_per_second, snapshot_merge=args.snapshot_merge,
        store_latest_rows_per_interval=args.store_latest_rows_per_interval or 10**9,
    )
    client = KubeClient(api_url, max_connections=8)
    runtime = ControllerRuntime(settings, client)
    if not args.no_store:
        from gpuwm.store import open_store

        runtime.store = open_store(settings.store, latest_rows_per_interval=settings.store_latest_rows_per_interval)
    tune_garbage_collector()  # as the controller's startup does, before the pods watch delivers the pods
    restarted = runtime.state_path.exists()  # an earlier run's state (--state-dir): a restart
    if restarted:
        args.history_minutes = 0.0  # the restored engine has the earlier run's hour
    if args.existing_crs or restarted:
        restore_cpu = time.process_time()
        source = await runtime.restore()
        segments = sum(len(workload.windows) for workload in runtime.engine.workload_records.values())
        print(f"restored from: {source} ({len(runtime.writer.existing)} CRs adopted) in "
              f"{time.process_time() - restore_cpu:.1f} CPU-s; {segments} window segments; "
              f"RSS {rss_mib():.0f} MiB, peak {rss_mib('VmHWM'):.0f} MiB")
    # with a history, the pods started before it, and the controller knows their devices from earlier pulls
    started = args.pods_started
    if args.history_minutes:
        runtime.state.holders_by_node.update(agent_holders(plan))
        runtime.state.holders_by_pod = index_holders(runtime.state.holders_by_node)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    sent_before = dict(runtime.state.sent)
    for namespace, name, node, _ in finished_layout(args.finished):
        await runtime.on_pod(finished_pod_body(namespace, name, node, jobs[name], args.origin), None)
    for namespace, name, node, gpus in plan:
        await runtime.on_pod(pod_body(namespace, name, node, len(gpus), jobs[name], started), None)
    print(f"cluster: {args.nodes} nodes, {args.nodes * args.gpus_per_node} GPUs, {len(plan)} running workloads, "
          f"{args.finished} finished ones; "
          f"status interval {args.status_interval:g}s, agent poll {args.interval:g}s, merge {args.snapshot_merge:g}s, "
          f"write limit {args.writes_per_second:g}/s")
    # a restarted controller knows each pod's last event: the watch's pods, unchanged, send the engine nothing
    pod_events = sum(key != sent_before.get(uid) for uid, key in runtime.state.sent.items())
    print(f"pod intake (owner walk + engine): {time.process_time() - cpu0:.2f} CPU-s, "
          f"{time.perf_counter() - wall0:.2f} s wall, {runtime.resolver.fetches} owner GETs, "
          f"{pod_events} pod events to the engine")
    if args.history_minutes:
        rows, cpu = warm_up(runtime, plan, args.history_minutes, args.interval, args.jitter_percent,
                            chase=not args.memory_report, store_history=args.store_history and runtime.store is not None)
        segments = sum(len(workload.windows) for workload in runtime.engine.workload_records.values())
        print(f"history: {args.history_minutes:g} minutes, {rows} samples into the engine in {cpu:.1f} CPU-s; "
              f"{segments} window segments; RSS {rss_mib():.0f} MiB")
    compacted_before = getattr(runtime.store, "compacted_blocks", 0)
    freshness = Freshness(runtime, [name for _, name, _, _ in plan])
    ages_steady: list[float] = []
    control = aiohttp.ClientSession()
    writer = asyncio.create_task(runtime.writer.run())
    cycle_cpu: list[float] = []
    cycle_system: list[float] = []  # the kernel's share of each interval (sends and receives on loopback)
    cycle_rss: list[float] = []  # RSS at the end of each interval, MiB (what the memory budget reads)
    writes_before = 0
    t_writes = time.perf_counter()
    profiler = None
    phases: list[dict[str, float]] = []
    phase_peaks = track_phase_peaks() if args.phase_peaks else None
    collections = track_collections()
    saves: list[float] = []  # the save phase's CPU of each cycle that saved the engine state
    for cycle in range(args.cycles):
        if args.profile and cycle == 1:  # the first cycle creates every CR: profile the steady ones
            import cProfile

            # the event loop thread's CPU time: wall time charges a call that releases the GIL
            # (a socket send) with the store thread's time until the loop gets the GIL back
            profiler = cProfile.Profile(time.thread_time)
            profiler.enable()
        start_wall, start_cpu, start_system = time.perf_counter(), time.process_time(), os.times().system
        if phase_peaks is not None:
            phase_peaks["between"] = rss_mib("VmHWM")  # the writer's work since the last cycle
            reset_peak_rss()
        if cycle + 1 == args.change_cycle and args.state_changes:
            await change_states(args, runtime, plan, jobs, freshness, control, agents_url)
        saved_before = runtime._last_save
        await runtime.cycle()
        if runtime._last_save != saved_before:  # this cycle saved the engine state
            saves.append(runtime.cycle_cpu_seconds["save"])
        cpu_cycle = time.process_time() - start_cpu
        wall_cycle = time.perf_counter() - start_wall
        await asyncio.sleep(max(0.0, args.status_interval - (time.perf_counter() - start_wall)))
        total_cpu = time.process_time() - start_cpu  # the cycle plus the writer's work until the next one
        cycle_cpu.append(total_cpu)
        cycle_system.append(os.times().system - start_system)
        cycle_rss.append(rss_mib())
        now = time.perf_counter()
        writes = runtime.writer.stats.writes
        rate = (writes - writes_before) / (now - t_writes)
        writes_before, t_writes = writes, now
        segments = sum(len(workload.windows) for workload in runtime.engine.workload_records.values())
        print(f"cycle {cycle + 1} ({segments} window segments): cycle {cpu_cycle:.2f} CPU-s ({wall_cycle:.2f} s wall), with writes "
              f"{total_cpu:.2f} CPU-s per interval; RSS {rss_mib():.0f} MiB (peak {rss_mib('VmHWM'):.0f}); writes {rate:.1f}/s; "
              f"queued {runtime.writer.pending}")
        ages, unwritten = freshness.ages(time.time())  # at the end of the interval: the oldest they get
        if cycle >= (STARTUP_CYCLES if args.cycles > STARTUP_CYCLES else 1):
            ages_steady.extend(ages)
        print(f"    age of every running workload's CR figures: p50 {percentile(ages, 0.5):.0f} s, "
              f"p99 {percentile(ages, 0.99):.0f} s, max {max(ages):.0f} s ({unwritten} not written since the start); "
              f"state changes not yet shown {len(freshness.changes)}")
        writer_cpu = total_cpu - cpu_cycle  # the writer (and anything else on the loop) between cycles
        phases.append({**runtime.cycle_cpu_seconds, "writes_between_cycles": writer_cpu})
        print("    phases (CPU-s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases[-1].items()))
        print("    garbage collections (count, CPU-s): " + ", ".join(
            f"gen{generation} {len(spent)}, {sum(spent):.2f}" for generation, spent in collections.items()))
        for spent in collections.values():
            spent.clear()
        if phase_peaks is not None:
            print("    peak RSS by phase (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in phase_peaks.items()))
    writer.cancel()
    await control.close()
    if profiler is not None:
        import pstats

        profiler.disable()
        stats = pstats.Stats(profiler)
        if args.profile_file:
            stats.dump_stats(args.profile_file)
        stats.sort_stats(args.profile).print_stats(args.profile_lines)
    print("writes taken by lane: " + ", ".join(f"{lane} {count}"
                                               for lane, count in getattr(runtime.writer.stats, "taken", {}).items()))
    lags = sorted(runtime.writer.stats.lag_seconds)
    if lags:
        p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))]
        print(f"lag sample -> CR status: p50 {statistics.median(lags):.1f} s, p99 {p99:.1f} s "
              f"({p99 / args.status_interval:.2f} intervals) over {len(lags)} writes")
    if ages_steady:
        print(f"age of every running workload's CR figures at the end of each steady interval: "
              f"p50 {percentile(ages_steady, 0.5):.0f} s, p99 {percentile(ages_steady, 0.99):.0f} s, "
              f"max {max(ages_steady):.0f} s ({max(ages_steady) / args.status_interval:.1f} intervals)")
    for kind, lags_of in sorted(freshness.lags.items()):
        print(f"state change -> CR ({kind}): {len(lags_of)} shown, lag p50 {statistics.median(lags_of):.1f} s, "
              f"max {max(lags_of):.1f} s ({max(lags_of) / args.status_interval:.2f} intervals)")
    for kind in sorted({kind for _, kind, _ in freshness.changes.values()}):
        waiting = [time.time() - at for at, kind_of, _ in freshness.changes.values() if kind_of == kind]
        print(f"state change -> CR ({kind}): {len(waiting)} NOT shown by the end, waiting {max(waiting):.1f} s "
              f"({max(waiting) / args.status_interval:.2f} intervals) and more")
    # the controller's memory before the bench reads back every CR: that list is the bench's, not the controller's
    rss_end_mib, rss_peak_mib = rss_mib(), rss_mib("VmHWM")
    listed = await client.list_items("/apis/gpuwm.io/v1alpha1/gpuworkloadmetrics")
    read_now = time.time()
    stamps = [((item.get("status") or {}).get("lastUpdateTime")) for item in listed]
    read_ages = [read_now - time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) + time.timezone
                 for stamp in stamps if stamp]
    if read_ages:
        print(f"read back from the API at the end: {len(listed)} GPUWorkloadMetrics, lastUpdateTime age p50 "
              f"{percentile(read_ages, 0.5):.0f} s, p99 {percentile(read_ages, 0.99):.0f} s, max {max(read_ages):.0f} s; "
              f"{len(stamps) - len(read_ages)} with no status")
    del listed, stamps
    # steady: after the startup cycles (the first writes every CR; the first three each save the engine state,
    # later ones every stateSaveInterval, 2 minutes: cycle 11, 19, ...)
    skip = STARTUP_CYCLES if len(cycle_cpu) > STARTUP_CYCLES else 1
    steady = cycle_cpu[skip:] or cycle_cpu
    steady_system = cycle_system[skip:] or cycle_system
    steady_phases = phases[skip:] or phases
    print(f"steady cycles: {skip + 1}-{len(cycle_cpu)}; RSS at their ends {min(cycle_rss[skip:] or cycle_rss):.0f}-"
          f"{max(cycle_rss[skip:] or cycle_rss):.0f} MiB")
    print("steady phases, mean CPU-s per cycle: " + ", ".join(
        f"{name} {statistics.mean(p.get(name, 0.0) for p in steady_phases):.2f}" for name in steady_phases[0]))
    print(f"summary: CPU per {args.status_interval:g}s cycle mean {statistics.mean(steady):.2f} s, max {max(steady):.2f} s "
          f"(steady cycles; of the mean, {statistics.mean(steady_system):.2f} s in the kernel); RSS {rss_end_mib:.0f} MiB, peak {rss_peak_mib:.0f} MiB (before the read back); state file {runtime.state_path.stat().st_size / 1e6:.1f} MB; "
          f"API requests {client.requests}, retries {client.retries}")
    # the state saves in the steady cycles are as many as the run's length happens to hold (with a 2-minute
    # stateSaveInterval, none in cycles 4-8): each save's CPU spread over the cycles between two saves instead
    if saves:
        every = max(settings.state_save_interval, args.status_interval)
        unsaved = statistics.mean(cpu - p.get("save", 0.0) for cpu, p in zip(steady, steady_phases, strict=True))
        print(f"summary, the state saves spread: CPU per {args.status_interval:g}s cycle mean "
              f"{unsaved + statistics.mean(saves) * args.status_interval / every:.2f} s (steady cycles without their "
              f"saves {unsaved:.2f} s, plus a save of {statistics.mean(saves):.2f} CPU-s every {every:g} s)")
    if runtime.store is not None and hasattr(runtime.store, "_writer"):
        from tests.unit.store.pagecache import page_cache_mib

        cache = page_cache_mib(runtime.store._writer)
        if cache is not None:
            print(f"store: the writing connection's page cache {cache:.1f} MiB (part of the RSS)")
        from gpuwm.store.codec import BLOCK

        print(f"store: {runtime.store.compacted_blocks - compacted_before} blocks of {BLOCK} series compacted "
              f"during the cycles{'' if args.store_history else ' (without --store-history, only in a run that crosses an hour)'}")
    if args.memory_report:
        import tracemalloc

        snapshot = tracemalloc.take_snapshot()
        print("memory by file (tracemalloc):")
        for stat in snapshot.statistics("filename")[:12]:
            print(f"    {stat.size / 2**20:7.1f} MiB  {stat.traceback[0].filename}")
        print("memory by line (tracemalloc):")
        for stat in snapshot.statistics("lineno")[:25]:
            frame = stat.traceback[0]
            print(f"    {stat.size / 2**20:7.1f} MiB  {stat.count:9d} blocks  {frame.filename}:{frame.lineno}")
        if tracemalloc.get_traceback_limit() > 1:  # BENCH_TRACE_FRAMES=N: where the top lines were called from
            for stat in snapshot.statistics("traceback")[:8]:
                print(f"    {stat.size / 2**20:7.1f} MiB  {stat.count:9d} blocks")
                for line in stat.traceback.format()[-2 * tracemalloc.get_traceback_limit():]:
                    print(f"        {line}")
    if args.state_dir:
        await runtime.finish_saving()
        runtime.save(runtime.clock())  # for the next run's restart
    await runtime.puller.close()
    await client.close()
    if runtime.store is not None:
        runtime.store.close()
    if not args.state_dir:
        shutil.rmtree(state_dir, ignore_errors=True)  # the store and the state file: ~150 MB a run


async def change_states(args: argparse.Namespace, runtime: ControllerRuntime, plan: list[tuple[str, str, str, list[str]]],
                        jobs: dict[str, str], freshness: Freshness, control: aiohttp.ClientSession, agents_url: str) -> None:
    """`--state-changes` workloads change state now: half of them end (their pods succeed), half go idle (their
    nodes' GPUs at 0 %, every workload on those nodes); each is timed until a written status shows it."""
    count = args.state_changes // 2
    ending = plan[1::max(1, len(plan) // max(1, count))][:count]
    for namespace, name, node, gpus in ending:
        now = time.time()
        body = pod_body(namespace, name, node, len(gpus), jobs[name], args.pods_started)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        body["status"] = {"phase": "Succeeded", "startTime": args.pods_started, "containerStatuses": [
            {"name": "main", "state": {"terminated": {"startedAt": args.pods_started, "finishedAt": stamp, "exitCode": 0}}}]}
        await runtime.on_pod(body, None)
        freshness.change(name, "ended", lambda status: status.get("phase") != "Running", now)
        freshness.names.remove(name)  # its figures are final: not part of the age of what is running
    ended = {name for _, name, _, _ in ending}
    per_node = max(1, args.gpus_per_node // args.gpus_per_workload)
    idle_nodes = sorted({node for _, _, node, _ in plan})[::2][:max(1, (count + per_node - 1) // per_node)]
    for node in idle_nodes:
        now = time.time()
        async with control.post(f"{agents_url}/{node}/control", params={"sm": "0"}) as answer:
            answer.raise_for_status()
        for _, name, node_of, _ in plan:
            if node_of == node and name not in ended:
                freshness.change(name, "went idle", lambda status: (status.get("idleSeconds") or 0) > 0, now)
    print(f"state changes before this cycle: {len(ending)} workloads ended, "
          f"{sum(kind == 'went idle' for _, kind, _ in freshness.changes.values())} went idle")


def first_run(args: argparse.Namespace, api_url: str, agents_url: str, jobs: dict[str, str]) -> None:
    """`--restart`'s first controller, in a child process: history and cycles, then its state saved."""
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (the child's figures are not the ones reported)
    import tracemalloc

    tracemalloc.stop()  # --memory-report traces the measured controller; traced, this one's history takes ~10x longer
    loop_factory = event_loop_factory() if args.loop == "controller" else None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(run_bench(args, api_url, agents_url, jobs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--gpus-per-workload", type=int, default=2)
    parser.add_argument("--status-interval", type=float, default=15.0)
    parser.add_argument("--interval", type=float, default=1.0, help="the agents' poll interval")
    parser.add_argument("--history-minutes", type=float, default=60.0,
                        help="samples fed to the engine before the first cycle, ending then: a controller that has "
                             "run this long (its window segments and history at their steady size); 0: none")
    parser.add_argument("--jitter-percent", type=float, default=20.0,
                        help="each sample's SM %% is 60 +- this (whole percents): utilisation that changes from "
                             "one sample to the next, as it does on real GPUs")
    parser.add_argument("--writes-per-second", type=float, default=20.0)
    parser.add_argument("--state-changes", type=int, default=40,
                        help="workloads that change state before --change-cycle (half end, half go idle), each timed "
                             "until its CR shows it; 0: none")
    parser.add_argument("--change-cycle", type=int, default=5, help="the cycle the state changes come before")
    parser.add_argument("--snapshot-merge", type=float, default=15.0,
                        help="the controller's snapshotMerge, seconds (0: the agents send every poll)")
    parser.add_argument("--cycles", type=int, default=11,
                        help="status cycles; the steady figures leave out the first three (startup) when there are more")
    parser.add_argument("--finished", type=int, default=0,
                        help="workloads that ended before the bench (their CRs and figures are kept for the retention)")
    parser.add_argument("--existing-crs", action=argparse.BooleanOptionalAction, default=True,
                        help="the CRs exist already, as in a controller's steady state (--no-existing-crs: the "
                             "first start, every write also creates its CR)")
    parser.add_argument("--no-store", action="store_true", help="skip the embedded store (CR status only)")
    parser.add_argument("--restart", action="store_true",
                        help="measure a restarted controller: a first one runs the history and --restart-after cycles "
                             "in a child process and saves its state; this one starts from that state and store")
    parser.add_argument("--state-dir", help="the store and engine state here, kept after the run (an earlier run's "
                                            "state there is restored, as by a restarted controller; that run's pods "
                                            "started at another time, so their events go to the engine again: "
                                            "--restart hands both controllers the same pods)")
    parser.add_argument("--restart-after", type=int, default=4, help="the first controller's cycles (--restart)")
    parser.add_argument("--store-latest-rows-per-interval", type=int,
                        default=Settings.model_fields["store_latest_rows_per_interval"].default,
                        help="running workloads' latest rows the store rewrites per interval at most "
                             "(storeLatestRowsPerInterval; 0: every row, as before it)")
    parser.add_argument("--store-history", action="store_true",
                        help="also report and record the history's intervals in the store (+~1.5 CPU-minutes): "
                             "its head then holds an hour, and every steady cycle compacts a slice of the closed "
                             "hour, as a controller does in most of each hour")
    parser.add_argument("--process-modules", action=argparse.BooleanOptionalAction, default=True,
                        help="import what the controller process imports besides its runtime (kopf, its handlers, the "
                             "metrics API), so RSS is the real process's")
    parser.add_argument("--phase-peaks", action="store_true",
                        help="print each phase's peak RSS (Linux: resets VmHWM at each phase, so the summary's "
                             "peak is then the last phase's)")
    parser.add_argument("--memory-report", action="store_true", help="trace allocations (slow) and print the top files")
    parser.add_argument("--profile", choices=("cumulative", "tottime"),
                        help="cProfile the event loop's thread from cycle 2 on and print the top functions by this key")
    parser.add_argument("--profile-lines", type=int, default=60)
    parser.add_argument("--profile-file", help="also write the profile there (pstats: callers and callees)")
    parser.add_argument("--loop", choices=("controller", "asyncio"), default="controller",
                        help="the event loop: the controller's (uvloop where installed, as `gpuwm controller` runs) "
                             "or asyncio's own")
    args = parser.parse_args()
    if args.memory_report:
        import tracemalloc

        tracemalloc.start(int(os.environ.get("BENCH_TRACE_FRAMES", "1")))
    kept_state_dir = args.state_dir
    if args.restart and not args.state_dir:
        args.state_dir = tempfile.mkdtemp(prefix="gpuwm-bench-")
    # the pods' start, the same in both of --restart's controllers (the pod watch delivers the same bodies again)
    args.origin = time.time()
    args.pods_started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(args.origin - 5 - 60.0 * args.history_minutes))
    with cluster_served(args) as (api_url, agents_url, jobs):
        if args.restart:
            first = multiprocessing.Process(target=first_run, args=(
                argparse.Namespace(**{**vars(args), "cycles": args.restart_after, "profile": None,
                                      "memory_report": False, "phase_peaks": False}),
                api_url, agents_url, jobs))
            first.start()
            first.join()
            if first.exitcode != 0:
                raise SystemExit(f"the first controller of --restart failed (exit code {first.exitcode})")
            print(f"first controller: history and {args.restart_after} cycles, stopped with its state saved")
        loop_factory = event_loop_factory() if args.loop == "controller" else None
        print(f"event loop: {'asyncio' if loop_factory is None else loop_factory.__module__.split('.')[0]}; "
              f"this machine's reference work {reference_cpu_seconds():.3f} CPU-s (see reference_cpu_seconds)")
        print(f"interpreter: {interpreter_description()}")
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(run_bench(args, api_url, agents_url, jobs))
    if args.state_dir and not kept_state_dir:
        shutil.rmtree(args.state_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GPUWM_LOG_LEVEL", "warning")
    sys.exit(main())
