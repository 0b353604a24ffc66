"""The controller's status cycle, independent of kopf.

kopf handlers (gpuwm.controller.handlers) hand Pod and Namespace events to
`ControllerRuntime`; a background task runs `cycle()` every status interval: pull the
agents, feed the engine, offer CR statuses to the rate-limited writer, apply retention and
save the state for the next start. What it changes and saves is one `ControllerState`
(`state`); the runtime holds the parts that act on it (puller, writer, client, store).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from operator import attrgetter
from typing import Any

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.config import Settings
from gpuwm.controller.kube import KubeApiError, KubeClient, TokenBucket
from gpuwm.controller.offers import StatusOffers
from gpuwm.controller.policy import PolicyRoom
from gpuwm.controller.pull import (
    AgentPuller,
    PullResult,
    SampleIntake,
    StaticAgents,
    index_holders,
    parse_agents_spec,
)
from gpuwm.controller.state import (
    ControllerState,
    KeptState,
    collect_cycle_garbage,
    commit_state,
    encode_state_chunks,
    projects_with_baselines,
    release_free_memory,
    restore_saved,
    save_state,
    stage_state,
    state_path_for_store,
    with_baseline,
)
from gpuwm.controller.state import restore as recover_state
from gpuwm.controller.status import (
    WORKLOAD_PLURAL,
    IdleEvents,
    IdleWatch,
    Seen,
    StatusWriter,
    idle_condition,
    seen_now,
)
from gpuwm.controller.watch import (
    MalformedPodError,
    OwnerResolver,
    SharingSource,
    TrackedPod,
    as_of,
    device_allocations,
    pod_event,
    state_key,
    track_pod,
    whole_device_nodes,
    workload_uid_of,
)
from gpuwm.feed import MergeRequest
from gpuwm.model import (
    ClusterFigures,
    DeviceReading,
    NamespaceEvent,
    ProjectFigures,
    WorkloadFigures,
    gpu_quota,
)

logger = logging.getLogger(__name__)


def merge_request_of(settings: Settings, engine_config: EngineConfig) -> MergeRequest | None:
    """What the controller asks the agents to merge: runs its accounting cannot tell apart (`snapshotMerge`)."""
    if settings.snapshot_merge <= 0:
        return None
    return MergeRequest(settings.snapshot_merge, engine_config.idle_threshold_percent, engine_config.gap_seconds)


class _PhaseTimer:
    """CPU seconds of this thread per phase (the store's thread is timed by the caller's process total)."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._last = time.thread_time()

    def mark(self, phase: str) -> None:
        now = time.thread_time()
        self.phases[phase] = now - self._last
        self._last = now


class ControllerRuntime:
    """The status cycle and the parts it acts through, on one `ControllerState`."""

    def __init__(self, settings: Settings, client: KubeClient, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.client = client
        self.clock = clock
        self.engine_config = EngineConfig.from_settings(settings)
        self._state = ControllerState(Engine(self.engine_config))
        self.agents = parse_agents_spec(settings.agents)
        self.puller = AgentPuller(timeout_seconds=max(1.0, min(10.0, settings.status_interval)), merge=merge_request_of(settings, self.engine_config))
        self.resolver = OwnerResolver(client.get_object)
        self.writer = StatusWriter(
            client, TokenBucket(settings.status_writes_per_second), settings.status_interval, clock=clock,
            counters_refresh_seconds=settings.status_counters_refresh,
        )
        self.state_path = state_path_for_store(settings.store)
        self.agent_pod_urls: Callable[[], Mapping[str, str]] = dict
        #: how old a device's latest sample may be at a report and still count as reporting (see idleness.reporting):
        #: the engine's gap, a status interval for the pull's spread, and each cycle how late its report came after
        #: its pull began (a slow cycle must not read every agent as silent)
        self.reporting_slack_seconds = self.engine_config.gap_seconds + settings.status_interval
        self.idle_watch = IdleWatch(self.reporting_slack_seconds)  # since when each workload's idleness was observed
        self.offers = StatusOffers(settings, self.writer)
        self.cycles = 0
        #: False once another replica took over (`handlers`): what this one does on its way out must not get in its way
        self.leading = True
        #: the Secret holding a copy of the state for a replica in another pod (`--state-secret`); None: none
        self.kept: KeptState | None = None
        self.store: Any = None
        self.sharing = SharingSource(client, default_shared_replicas=settings.time_sliced_replicas,
                                     device_plugin_config=settings.device_plugin_config, clock=clock)
        self._warned: set[str] = set()
        self._last_save: float | None = None
        self._committing: asyncio.Future[None] | None = None  # the latest background save's fsync and rename
        self.cycle_cpu_seconds: dict[str, float] = {}
        self.store_cpu_seconds = 0.0  # CPU of the latest store write, in its worker thread
        #: the store's writes and compaction slices, one after the other on one thread: a slice starts only
        #: once the thread has let go of the write before it, and of the report's figures that write held
        self._store_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuwm-store")
        self.idle_events = IdleEvents(client, self.writer.bucket, settings.idle_condition_after, clock)
        self.idle_events.announced = self._state.idle_announced
        #: idle policies and cost (`gpuwm.controller.policy`), where enabled: set by the startup handler
        self.policies: PolicyRoom | None = None

    @property
    def state(self) -> ControllerState:
        """What the cycle changes and a restart gets back (see `ControllerState`)."""
        return self._state

    @state.setter
    def state(self, state: ControllerState) -> None:
        self._state = state
        self.idle_events.announced = state.idle_announced  # the Events' memory is the state's

    @property
    def engine(self) -> Engine:
        """The state's engine: what the handlers, the `/metrics` collectors and the tests read of the runtime."""
        return self._state.engine

    # ------------------------------------------------------------------ start

    async def restore(self) -> str:
        """Put the state back where the last controller stopped (see `recovery`); returns which source was used.

        The copy kept in the API server replaces this pod's state file first where it is newer (`KeptState`).
        """
        if self.kept is not None:
            await self.kept.download_newer(self.state_path)
        restored = await recover_state(
            self.state, state_path=self.state_path, config=self.engine_config, client=self.client,
            writer=self.writer, puller=self.puller, namespace=self.settings.namespace,
            retention_seconds=self.settings.retention, clock=self.clock,
        )
        self.state = state = restored.state
        for pod in restored.vanished:  # deleted while the controller was down: ended now
            pod.phase = "Deleted"
            self._send(pod)
            state.forget_pod(pod.uid)
        logger.info("controller state restored from %s (%d workloads, %d pods)", restored.source,
                    len(state.engine.workloads(self.clock())), len(state.pods))
        return restored.source

    def restore_saved(self, saved: dict[str, Any]) -> None:
        """The state `snapshot` gave, whole or not at all (a damaged section raises and changes nothing)."""
        self.state = restore_saved(saved, self.state, self.puller, self.engine_config)

    def snapshot(self, now: float, lazy: bool = False, raw: bool = False) -> dict[str, Any]:
        """The state file's content: the state, the agents' positions and which cluster (see `ControllerState.save`)."""
        if self.policies is not None:
            self._state.policies = self.policies.save()
        return self.state.save(now, agents=self.puller.positions(), cluster=self.client.cluster_identity,
                               lazy=lazy, raw=raw)

    # ------------------------------------------------------------------ kopf events

    async def on_pod(self, body: Mapping[str, Any], event_type: str | None) -> None:
        """A GPU pod was added, changed or deleted: tell the engine if its state changed."""
        metadata = body.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        try:
            workload = await self.resolver.resolve(body)
            node = (body.get("spec") or {}).get("nodeName")
            replicas = await self.sharing.of_node(str(node)) if node else 1
            pod = track_pod(
                body, workload, self.settings.resource_names, deleted=event_type == "DELETED",
                replicas=replicas, shared_replicas=self.settings.time_sliced_replicas,
                labels_kept=tuple(filter(None, (self.settings.project_label, self.settings.runai_user_label))),
            )
        except (MalformedPodError, KeyError, TypeError, ValueError) as error:
            self._warn_once(uid or repr(metadata.get("name")), f"skipping a malformed pod: {error}")
            return
        self._state.pods[pod.uid] = pod
        self._send(pod)
        if pod.phase == "Deleted":
            self.state.forget_pod(pod.uid)

    def on_namespace(self, body: Mapping[str, Any]) -> None:
        """Namespace labels name the project; its annotation gives the GPU quota."""
        metadata = body.get("metadata") or {}
        if not metadata.get("name"):
            self._warn_once("namespace:" + repr(metadata), "skipping a namespace without metadata.name")
            return
        annotations = {str(k): str(v) for k, v in (metadata.get("annotations") or {}).items()}
        quota_key = self.engine_config.quota_annotation
        if quota_key in annotations:
            try:
                gpu_quota(annotations[quota_key])
            except ValueError as error:  # "NaN" or "inf" would be read as a quota: the project's figures NaN
                self._warn_once(f"quota:{metadata['name']}:{annotations[quota_key]}",
                                f"namespace {metadata['name']}: annotation {quota_key} {error}; no quota used")
                del annotations[quota_key]
        self._state.engine.observe_namespace(NamespaceEvent(
            t=self.clock(), event="namespace", name=str(metadata["name"]),
            labels={str(k): str(v) for k, v in (metadata.get("labels") or {}).items()},
            annotations=annotations,
        ))

    def _send(self, pod: TrackedPod) -> None:
        """The pod's event to the engine, where it says something the engine was not told yet."""
        now = self.clock()
        pod, at = as_of(pod, now)
        state = self._state
        holders = state.holders_by_pod.get(pod.uid, []) + state.holders_by_pod.get(f"{pod.namespace}/{pod.name}", [])
        devices = device_allocations(pod, holders, state.pods)
        key = state_key(pod, devices)
        previous = state.sent.get(pod.uid)
        if previous == key:
            return
        if previous is not None and workload_uid_of(previous) != pod.workload.uid:
            # its owner changed (`kubectl delete job --cascade=orphan`: the garbage collector stripped its
            # ownerReferences): the move is news of now, not of the pod's start, or the old workload's time would
            # move with it; and no later event takes the new workload back before the move
            state.moved_at[pod.uid] = now
        at = max(at, state.moved_at.get(pod.uid, at))
        baseline = state.baselines.get(pod.workload.uid)
        if baseline is not None and state.baseline_cutoff is not None:
            # the CR's figures (the baseline) already count the time up to its last update
            at = max(at, baseline.get("counted_until", state.baseline_cutoff))
        state.engine.observe_pod(pod_event(pod, devices, min(at, now)))
        state.sent[pod.uid] = key

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, extra={"object": key})

    # ------------------------------------------------------------------ the status cycle

    def agent_urls(self) -> dict[str, str]:
        if isinstance(self.agents, StaticAgents):
            return dict(self.agents.urls)
        return dict(self.agent_pod_urls())

    async def cycle(self) -> None:
        """Pull, account, offer statuses, retention, save; CPU seconds per phase go to `cycle_cpu_seconds`."""
        timer = _PhaseTimer()
        pull_started = self.clock()
        intake, pulled = await self._pull(timer)
        now = self.clock()
        # a slow cycle must not read every agent as silent: its report came this late after its pull began
        self.reporting_slack_seconds = (self.engine_config.gap_seconds + self.settings.status_interval
                                        + max(0.0, now - pull_started))
        self.idle_watch.slack_seconds = self.reporting_slack_seconds
        if self._last_save is None or now - self._last_save >= self.settings.state_save_interval or self.cycles < 3:
            # before the report: the state's encoding and the report's figures are never in memory together
            await self.save_in_background(now)
        timer.mark("save")
        workload_count = await self._account(now, intake, pulled, timer)
        # the report's figures went with `_account`: what reference counting left of them is collected, and the
        # store's compaction slice reuses their memory instead of adding to the cycle's peak
        collect_cycle_garbage()
        await self._compact(now)
        release_free_memory()
        timer.mark("trim")
        self.cycles += 1
        self.cycle_cpu_seconds = {**timer.phases, "store_thread": self.store_cpu_seconds}
        logger.debug("status cycle %d: %d samples, %d workloads, CPU seconds %s", self.cycles, intake.samples,
                     workload_count, {k: round(v, 3) for k, v in timer.phases.items()})

    async def _pull(self, timer: _PhaseTimer) -> tuple[SampleIntake, PullResult]:
        """Every agent's samples into the engine, then the pods whose devices or lives changed meanwhile."""
        state = self._state  # restored before the first cycle, never replaced while one runs
        intake = SampleIntake(state.engine, state.holders_by_node)
        agents = self.agent_urls()
        # nodes whose devices are all held whole: their agents merge more polls (MergeRequest.exact_replicas)
        whole = whole_device_nodes(agents, self.sharing, state.pods.values(), state.holders_by_node)
        pulled = await self.puller.pull_all(agents, on_snapshot=intake.take, whole_devices=whole)
        intake.flush()  # columnar snapshots go to the engine as one batch
        timer.mark("pull")
        timer.phases["pull"] -= intake.cpu_seconds  # the engine's share of the pull, reported on its own
        if intake.changed_nodes:  # attribution changed: those nodes' pods get events with their devices
            state.holders_by_pod = index_holders(state.holders_by_node)
            for pod in list(state.pods.values()):
                if pod.node in intake.changed_nodes:
                    self._send(pod)
        terminating_now = self.clock()
        for pod in [pod for pod in state.pods.values()
                    if pod.deletion_time is not None and pod.deletion_time <= terminating_now]:
            self._send(pod)  # past its grace period: ended there, whether or not the object is gone
        timer.mark("attribution")
        timer.phases["engine_samples"] = intake.cpu_seconds
        if intake.latest_time is not None:
            state.latest_sample_time = max(state.latest_sample_time or 0.0, intake.latest_time)
        return intake, pulled

    async def _account(self, now: float, intake: SampleIntake, pulled: PullResult, timer: _PhaseTimer) -> int:
        """The engine's report as of `now` to the writer, retention and the store; how many workloads it held.

        The report's figures live as long as this call: the cycle's compaction comes after it.
        """
        state = self._state
        engine_workloads, projects, cluster = state.engine.report(now)
        # after a restart that lost the engine state, the CRs' figures before it (see recovery); most cycles none
        workloads = ([with_baseline(figures, state.baselines) for figures in engine_workloads] if state.baselines
                     else engine_workloads)
        projects = projects_with_baselines(projects, engine_workloads, state.baselines)
        timer.mark("engine_report")
        await asyncio.sleep(0)
        self._offer(workloads, projects, now)
        await self._apply_retention(workloads, now)
        await self.writer.retire_projects(now, self.settings.retention)  # projects with no workload left
        timer.mark("offer")
        samples = sorted(intake.latest.values(), key=attrgetter("t"))  # the store reads each device's latest
        await self._record(now, samples, workloads, projects, cluster, pulled)
        timer.mark("store")
        return len(workloads)

    def _offer(self, workloads: list[WorkloadFigures], projects: list[ProjectFigures], now: float) -> None:
        """Every CR to the writer, and the Idle Events; each workload's Idle condition computed once for both."""
        state, slack, policies = self._state, self.reporting_slack_seconds, self.policies
        # what each workload's samples show: the idle watch, the policies, the signatures and the Events read it
        seen = {figures.uid: seen_now(figures, now, slack) for figures in workloads}
        self._observe_idleness(workloads, now, seen)
        if policies is not None:  # before the offers: their signatures carry what the room adds
            policies.observe(workloads, projects, seen, now)
        idle = {figures.uid: idle_condition(figures, state.observed_idle.get(figures.uid),
                                            self.settings.idle_condition_after, now, slack, seen[figures.uid])
                for figures in workloads}
        self.offers.offer_workloads(state, workloads, now, slack_seconds=slack, policies=policies, idle=idle,
                                    seen=seen)
        self.offers.offer_projects(state, projects, now, policies)
        self.idle_events.announce(workloads, {uid: status for uid, (status, _reason) in idle.items()})

    def _observe_idleness(self, workloads: list[WorkloadFigures], now: float,
                          seen: Mapping[str, Seen] | None = None) -> None:
        """How long each running workload's current idle stretch has been seen through samples (`IdleWatch`);
        `seen`: each one's `seen_now` for this `now`, where the cycle has them."""
        observed: dict[str, float] = {}
        # once, not per CR
        watch, conditions, observed_before = self.idle_watch, self._state.conditions, self._state.observed_idle
        for figures in workloads:
            if figures.phase != "Running" and figures.uid not in observed_before:
                watch.forget(figures.uid)  # nothing to watch: no memory kept for ended workloads
                continue
            written_idle = any(memo.type == "Idle" and memo.status == "True" for memo in conditions.get(figures.uid, ()))
            seconds = watch.observe(figures, now, written_idle, None if seen is None else seen.get(figures.uid))
            if seconds is not None:
                observed[figures.uid] = seconds
        self._state.observed_idle = observed

    async def _apply_retention(self, workloads: list[WorkloadFigures], now: float) -> None:
        """Finished workloads keep their CR for `retention`, then it and the engine's record go."""
        state = self._state
        for figures in workloads:
            if figures.end_time is None or figures.allocated_gpus > 0:
                continue
            if now - figures.end_time < self.settings.retention:
                continue
            name = state.cr_names.get(figures.uid)
            if name:
                try:
                    await self.writer.delete(WORKLOAD_PLURAL, figures.namespace, name)
                except KubeApiError as error:
                    logger.warning("cannot delete expired %s/%s: %s", figures.namespace, name, error)
                    continue
                state.cr_owner.pop((figures.namespace, name), None)
                logger.info("retention: deleted GPUWorkloadMetrics %s/%s", figures.namespace, name)
            state.cr_names.pop(figures.uid, None)
            state.engine.forget_workload(figures.uid)
            state.conditions.pop(figures.uid, None)
            self.idle_watch.forget(figures.uid)
            self.offers.forget(figures.uid)
            state.baselines.pop(figures.uid, None)

    def save(self, now: float) -> None:
        """The engine and the controller's own positions, for a restart that loses nothing.

        Saved every `state_save_interval` (and at shutdown): after a SIGKILL the restored engine
        re-reads the agents from the saved positions, so the samples since are not lost.
        """
        try:
            # lazy: written at once, in sections as the background saves are (what a restart reads an entry at a time)
            save_state(self.state_path, self.snapshot(now, lazy=True, raw=True))
            self._last_save = now
        except OSError as error:
            logger.warning("cannot save engine state to %s: %s", self.state_path, error)

    async def save_in_background(self, now: float) -> None:
        """As `save`; the JSON streams to the state file before last on the loop (consistent, never whole in memory),
        fsync and rename in a thread."""
        try:
            # lazy: each batch of the engine's entries is built, encoded and dropped in turn (no await in between)
            # raw: window segments and GPU histories go as bytes after the JSON (no base64; see rawcolumns)
            staged = stage_state(self.state_path,
                                 encode_state_chunks(self.snapshot(now, lazy=True, raw=True)))
            # shielded: a cycle cancelled at shutdown leaves the rename to finish; `finish_saving` waits for it
            self._committing = asyncio.ensure_future(asyncio.to_thread(commit_state, staged, self.state_path))
            await asyncio.shield(self._committing)
            self._last_save = now
            if self.kept is not None and self.leading:  # for a replica in another pod
                self.kept.keep_in_background(self.state_path)
        except OSError as error:
            logger.warning("cannot save engine state to %s: %s", self.state_path, error)
        self._committing = None  # done (a cancelled cycle does not get here)

    async def finish_saving(self) -> None:
        """Wait for a background save's rename still running in its thread (a cycle cancelled at shutdown).

        The next save writes over the state file before last, which that rename is about to move:
        `save` must not start before it is done.
        """
        committing, self._committing = self._committing, None
        if committing is not None:
            try:
                await committing
            except OSError as error:
                logger.warning("cannot save engine state to %s: %s", self.state_path, error)

    async def _record(self, now: float, samples: list[DeviceReading], workloads: list[WorkloadFigures],
                      projects: list[ProjectFigures], cluster: ClusterFigures, pulled: PullResult) -> None:
        """The interval's figures (and the runs' prices) into the store, in a thread of its own."""
        if self.store is None:
            return
        store = self.store
        pod_stats = [stat for snapshot in pulled.snapshots for stat in snapshot.pod_stats]
        prices = self.policies.prices() if self.policies is not None else {}

        def record() -> None:
            if _slices(store):  # the embedded store: its compaction slice comes in `_compact`
                store.record(now, samples, workloads, projects, cluster, pod_stats, compact=False)
            else:
                store.record(now, samples, workloads, projects, cluster, pod_stats)
            if prices:  # after the figures: a run's price names a run the store holds
                store.record_prices(now, prices)

        self.store_cpu_seconds = 0.0
        try:
            # the phase timer sees this thread only: the store's own CPU is reported beside it
            self.store_cpu_seconds = await self._in_store_thread(functools.partial(_thread_cpu_seconds, record))
        except Exception as error:  # the store is an extra: CR status goes on without it
            logger.warning("store write failed: %s", error)

    async def _compact(self, now: float) -> None:
        """The embedded store's compaction slice of this interval, which `_record` left for after the figures."""
        store = self.store
        if not _slices(store):
            return
        try:
            self.store_cpu_seconds += await self._in_store_thread(
                functools.partial(_thread_cpu_seconds, functools.partial(store.compact_slice, now)))
        except Exception as error:  # the next slice tries again (the store starts the round again from its file)
            logger.warning("store compaction failed: %s", error)

    async def _in_store_thread(self, work: Callable[[], float]) -> float:
        return await asyncio.get_running_loop().run_in_executor(self._store_thread, work)

    async def run_cycles(self) -> None:
        """The status loop; one failing cycle is logged and the next one tries again."""
        interval = self.settings.status_interval
        while True:
            started = time.monotonic()
            try:
                await self.cycle()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("status cycle failed; retrying next interval")
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))


def _thread_cpu_seconds(work: Callable[[], object]) -> float:
    """Run `work`; the CPU seconds it took in the thread that ran it (the store's, not the loop's)."""
    started = time.thread_time()
    work()
    return time.thread_time() - started


def _slices(store: Any) -> bool:
    """Whether `store` takes its compaction slice apart from `record` (the embedded store)."""
    return callable(getattr(store, "compact_slice", None))

