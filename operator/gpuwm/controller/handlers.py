"""Every kopf handler of the controller, in one module (handlers thin, decisions elsewhere).

Pods are watched with `@kopf.on.event` and `@kopf.index` only: change-detecting handlers
(`on.create/update/resume`) would store progress and a diff-base in annotations on every
user's Pod, a write per pod and a mutation of objects gpuwm does not own (DESIGN §2). The
`when=` filters keep non-GPU pods to the cost of the watch itself.

What the handlers share lives in kopf's `memo` (`kopf.Memo`, given to every handler and filter),
not in module globals: `memo.settings` (set by `configure` before kopf starts), then from the
startup handler on `memo.runtime` (the status cycle and its `ControllerState`),
`memo.workloads` and `memo.tasks`; and `memo.insights`, kopf's own record of what it watches, where
`gpuwm controller` hands one to `kopf.run` (see `look_for_absent_kinds`). kopf gives each watched
object a shallow copy of the memo made after startup, so those copies share the one runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import socket
import tempfile
import time
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any

import kopf

from gpuwm.config import Settings
from gpuwm.controller.kube import (
    KubeClient,
    Peering,
    Replica,
    hold_leadership,
    kube_login,
    label_own_pod,
    this_replica,
    wait_to_lead,
)
from gpuwm.controller.policy import POLICY_PLURALS, PolicyCollector, PolicyRoom
from gpuwm.controller.pull import PodAgents, agent_url_of_pod, parse_agents_spec
from gpuwm.controller.runtime import ControllerRuntime
from gpuwm.controller.state import KeptState, tune_garbage_collector
from gpuwm.controller.status import COMPONENT
from gpuwm.controller.watch import WorkloadKind, WorkloadObjects, parse_workload_kinds, requests_gpu

logger = logging.getLogger("gpuwm.controller")

#: the controller's handlers. A plain registry, not kopf's default: that one probes for the official
#: client (importing it costs resident memory: see kopf_import) to add its own login handlers; `login` below
#: is the only one
REGISTRY = kopf.OperatorRegistry()


def configure(settings: Settings) -> kopf.Memo:
    """The memo kopf runs with (`kopf.run(memo=...)`), holding `settings`; registers the workload kinds' handlers."""
    register_workload_kinds(parse_workload_kinds(settings.workload_kinds))
    if settings.idle_policies.enabled:
        register_idle_policies()
    replica = this_replica(settings.peering_priority, settings.status_interval)
    return kopf.Memo(settings=settings, runtime=None, workloads=None, tasks=[], replica=replica, peering=None)


def register_idle_policies() -> None:
    """One `@kopf.on.event` per idle-policy kind (idlePolicies.enabled): read only, no finalizers, no annotations."""
    for kind, plural in POLICY_PLURALS.items():
        handler_id = f"idle-policy:{plural}"
        if handler_id in _REGISTERED_POLICY_HANDLERS:
            continue
        _REGISTERED_POLICY_HANDLERS.add(handler_id)
        kopf.on.event("gpuwm.io", "v1alpha1", plural, id=handler_id, registry=REGISTRY)(
            functools.partial(idle_policy_event, kind=kind))


_REGISTERED_POLICY_HANDLERS: set[str] = set()


async def idle_policy_event(event: Mapping[str, Any], body: kopf.Body, memo: kopf.Memo, kind: str, **_: Any) -> None:
    """A GPUIdlePolicy or ClusterGPUIdlePolicy changed: the room reads it again."""
    runtime = _runtime(memo)
    if runtime is not None and runtime.policies is not None:
        runtime.policies.on_policy(kind, body, deleted=event.get("type") == "DELETED")


#: the kinds whose handler is registered (configure may run more than once in one process: tests)
_REGISTERED_KINDS: set[WorkloadKind] = set()


def register_workload_kinds(kinds: list[WorkloadKind]) -> None:
    """One `@kopf.on.event` per configured workload kind, and one log line per kind not installed.

    kopf watches a kind once its CRD exists, and picks up CRDs created later; for every kind it cannot
    resolve it logs one warning listing them all, again on each CRD change: `AbsentKinds` turns that into
    one line per absent kind.
    """
    for kind in kinds:
        if kind in _REGISTERED_KINDS:
            continue
        _REGISTERED_KINDS.add(kind)
        kopf.on.event(group=kind.group, version=kind.version, kind=kind.kind, id=f"workload:{kind.text}",
                      registry=REGISTRY)(workload_object_event)
    # the logger kopf's resource observation warns through; kopf names it after its private module, and no other
    observation = logging.getLogger("kopf._core.reactor.observation")
    if not any(isinstance(existing, AbsentKinds) for existing in observation.filters):
        observation.addFilter(AbsentKinds())


async def workload_object_event(event: Mapping[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A watched workload object (or a Kueue Workload) changed: its state goes to the engine when it changed."""
    workloads: WorkloadObjects | None = memo.get("workloads")
    if workloads is not None:
        workloads.on_object(body, deleted=event.get("type") == "DELETED")


_SELECTOR = re.compile(r"Selector\(([^)]*)\)")
_SELECTOR_FIELD = re.compile(r"(\w+)='([^']*)'")


class AbsentKinds(logging.Filter):
    """kopf's "Unresolved resources cannot be served" warning for workload kinds -> one info line per kind, once.

    A cluster without Ray or KServe is the common case, not a fault: the kind is skipped until its
    CRD appears. Selectors of other handlers (pods, nodes, namespaces) keep kopf's warning.
    """

    def __init__(self) -> None:
        super().__init__()
        self.reported: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("Unresolved resources cannot be served"):
            return True
        selectors = [dict(_SELECTOR_FIELD.findall(found)) for found in _SELECTOR.findall(message)]
        ours = [selector for selector in selectors if str(selector.get("id", "")).startswith("workload:")
                or any(selector.get("kind") == kind.kind and selector.get("group", "") == kind.group
                       for kind in _REGISTERED_KINDS)]
        if not selectors or len(ours) != len(selectors):
            return True
        for selector in ours:
            text = "/".join(part for part in (selector.get("group"), selector.get("version"), selector.get("kind"))
                            if part)
            if text not in self.reported:
                self.reported.add(text)
                logger.info("workload kind %s is not installed: skipped until its CRD appears", text,
                            extra={"kind": text})
        return False


def _settings(memo: kopf.Memo) -> Settings:
    settings: Settings | None = memo.get("settings")
    if settings is None:
        raise RuntimeError("kopf must run with the memo of gpuwm.controller.handlers.configure(settings)")
    return settings


def _runtime(memo: kopf.Memo) -> ControllerRuntime | None:
    """The runtime once startup made it, else None (events before it are not expected: startup runs first)."""
    runtime: ControllerRuntime | None = memo.get("runtime")
    return runtime


def _is_gpu_pod(spec: kopf.Spec, memo: kopf.Memo, **_: Any) -> bool:
    return requests_gpu(spec, _settings(memo).resource_names)


def _is_agent_pod(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> bool:
    agents = parse_agents_spec(_settings(memo).agents)
    return isinstance(agents, PodAgents) and agents.matches(namespace, labels)


@kopf.index("pods", when=_is_agent_pod, registry=REGISTRY)
def agent_pods(body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[str, str] | None:
    """node -> URL of the agent pod on it (`--agents pods:NAMESPACE/SELECTOR`)."""
    agents = parse_agents_spec(_settings(memo).agents)
    found = agent_url_of_pod(body, agents.port if isinstance(agents, PodAgents) else 9400)
    if found is None:
        return None
    node, url = found
    return {node: url}


@kopf.on.event("pods", when=_is_gpu_pod, registry=REGISTRY)
async def gpu_pod_event(event: Mapping[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Every change of a GPU pod goes to the engine (the runtime drops repeats)."""
    runtime = _runtime(memo)
    if runtime is not None:
        await runtime.on_pod(body, event.get("type"))


def _node_sharing_changed(body: kopf.Body, event: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> bool:
    runtime = _runtime(memo)
    return runtime is not None and (event.get("type") == "DELETED" or runtime.sharing.changes(body))


@kopf.on.event("nodes", when=_node_sharing_changed, registry=REGISTRY)
def node_event(event: Mapping[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Node labels that say how its GPUs are shared (time-slicing replicas, device plugin config key)."""
    runtime = _runtime(memo)
    if runtime is not None:
        runtime.sharing.on_node(body, deleted=event.get("type") == "DELETED")


@kopf.on.event("namespaces", registry=REGISTRY)
def namespace_event(event: Mapping[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Namespace labels and annotations: the project label and the GPU quota."""
    runtime = _runtime(memo)
    if runtime is not None and event.get("type") != "DELETED":
        runtime.on_namespace(body)
        metadata = body.get("metadata") or {}
        if not metadata.get("deletionTimestamp") and metadata.get("name"):
            runtime.writer.namespace_reopened(str(metadata["name"]))  # (re)created: write there again


@kopf.on.login(registry=REGISTRY)
def login(settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> kopf.ConnectionInfo | None:
    """The service account in a pod, else the kubeconfig (as `kopf run` logs in: `gpuwm.controller.kube.login`)."""
    return kube_login(settings, logger)


def tune_kopf(settings: kopf.OperatorSettings, gpuwm_settings: Settings, replica: Replica | None = None) -> None:
    """kopf settings that let the controller ride out 429/5xx and dropped watches; `replica`: its peering
    priority and record lifetime (see `gpuwm.controller.kube.peering`)."""
    settings.posting.level = logging.WARNING  # no Event per handler log line on users' pods
    # kopf's Events carry eventTime, so the API server requires a qualified-name component and an
    # instance of at most 128 characters (its defaults are `kopf` and `dev`)
    settings.posting.reporting_component = COMPONENT
    settings.posting.reporting_instance = socket.gethostname()[:128] or "gpuwm"
    settings.watching.server_timeout = 300  # ask the API server to end idle watches itself
    settings.watching.client_timeout = 330  # ... and give up on a watch that hangs past that
    settings.watching.connect_timeout = 30
    settings.watching.reconnect_backoff = 1.0
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 30
    settings.networking.error_backoffs = [1, 2, 4, 8, 16, 30, 60]  # 429/5xx on kopf's own calls
    queueing = getattr(settings, "queueing", None) or settings.batching  # renamed in kopf 1.38
    queueing.error_delays = [1, 2, 5, 10, 30, 60]  # a watch stream that keeps failing
    settings.peering.name = gpuwm_settings.peering_name
    settings.peering.mandatory = False  # no peering CRD installed: run alone, with a warning
    settings.peering.standalone = gpuwm_settings.standalone
    settings.peering.clusterwide = gpuwm_settings.namespace is None
    if replica is not None:
        settings.peering.priority = replica.priority
        settings.peering.lifetime = replica.lifetime_seconds
        settings.peering.stealth = True  # a keep-alive every few seconds is not worth a log line


@kopf.on.startup(errors=kopf.ErrorsMode.TEMPORARY, backoff=2.0, registry=REGISTRY)
async def startup(settings: kopf.OperatorSettings, logger: kopf.Logger, memo: kopf.Memo, **kwargs: Any) -> None:
    """Log in and serve the API, wait to lead, restore the state, then start the status loop and the writer.

    A standby replica waits here (`wait_to_lead`): kopf starts no watch before its startup handlers are
    done, so a standby holds no pods and writes nothing; its API answers the probes. Once it leads, the
    state is restored before kopf's watches deliver the first pod.
    """
    gpuwm_settings = _settings(memo)
    runtime: ControllerRuntime | None = memo.get("starting")
    if runtime is None:  # kopf retries a failed startup: the API started by an earlier try goes on serving
        memo.starting = runtime = _serving_runtime(settings, logger, memo, kwargs.get("agent_pods"))
    memo.peering = await _wait_to_lead(runtime, memo)
    source = await runtime.restore()
    tune_garbage_collector()
    workloads = WorkloadObjects(lambda: runtime.engine, runtime.clock, gpuwm_settings.resource_names,
                                gpuwm_settings.time_sliced_replicas)
    kinds = parse_workload_kinds(gpuwm_settings.workload_kinds)
    await end_vanished_workloads(runtime, kinds)
    room = _policy_room(runtime)
    memo.runtime = runtime
    memo.workloads = workloads
    tasks: list[asyncio.Task[None]] = memo.tasks
    tasks.append(asyncio.create_task(_delayed_cycles(runtime), name="gpuwm status cycles"))
    tasks.append(asyncio.create_task(runtime.writer.run(), name="gpuwm status writer"))
    tasks.append(asyncio.create_task(runtime.idle_events.run(), name="gpuwm events"))
    if room is not None:
        tasks.append(asyncio.create_task(room.run(gpuwm_settings.status_interval), name="gpuwm idle policies"))
    insights = memo.get("insights")
    if insights is not None:
        looking = look_for_absent_kinds(kinds, insights, settings, runtime.client)
        tasks.append(asyncio.create_task(looking, name="gpuwm workload kinds"))
    if memo.peering is not None:
        tasks.append(asyncio.create_task(_step_down_when_outranked(memo.peering, runtime, memo),
                                         name="gpuwm leadership"))
    await _label_leader(runtime, leading=True)
    logger.info("gpuwm controller started (state from %s, agents %s)", source, gpuwm_settings.agents)


def _serving_runtime(settings: kopf.OperatorSettings, logger: kopf.Logger, memo: kopf.Memo,
                     index: Any) -> ControllerRuntime:
    """The runtime, logged in, its store open and its API serving (the probes answer from here on)."""
    info = kube_login(settings, logger)
    if info is None:
        raise kopf.PermanentError("no Kubernetes credentials: need in-cluster service account or a kubeconfig")

    def relogin() -> dict[str, str]:
        fresh = kube_login(settings, logger)
        return KubeClient.auth_headers(fresh) if fresh is not None else {}

    runtime = ControllerRuntime(_settings(memo), KubeClient.from_connection_info(info, relogin=relogin))
    namespace = own_namespace()
    if runtime.settings.state_secret and namespace:
        runtime.kept = KeptState(runtime.client, namespace, runtime.settings.state_secret)
    if index is not None:
        runtime.agent_pod_urls = lambda: {str(node): str(next(iter(urls))) for node, urls in index.items() if urls}
    runtime.store = _open_store(runtime.settings)
    api = _start_api(runtime)
    if api is not None:
        memo.tasks.append(api)
    return runtime


async def _wait_to_lead(runtime: ControllerRuntime, memo: kopf.Memo) -> Peering | None:
    """Return once this replica leads (at once when standalone); the peering it holds, None when standalone."""
    settings = runtime.settings
    await _label_leader(runtime, leading=False)  # a restarted container may have led before
    replica: Replica | None = memo.get("replica")
    if settings.standalone or replica is None:
        return None
    peering = Peering(runtime.client, name=settings.peering_name, namespace=settings.namespace, replica=replica)
    await wait_to_lead(peering, poll_seconds=min(2.0, settings.status_interval))
    logger.info("this replica (%s, priority %d) leads", replica.identity, replica.priority)
    return peering


async def _step_down_when_outranked(peering: Peering, runtime: ControllerRuntime, memo: kopf.Memo) -> None:
    """Stop the operator once another replica outranks this one (kopf pauses its watches already)."""
    outranking = await hold_leadership(peering, check_seconds=min(runtime.settings.status_interval,
                                                                  peering.lifetime_seconds / 2))
    logger.warning("replica %s outranks this one (priority %d): stepping down; the container restarts as a standby",
                   ", ".join(f"{record.identity} (priority {record.priority})" for record in outranking),
                   peering.priority)
    runtime.leading = False
    await _label_leader(runtime, leading=False)
    stop: asyncio.Event | None = memo.get("stop_flag")
    if stop is not None:
        stop.set()


async def _label_leader(runtime: ControllerRuntime, leading: bool) -> None:
    """The leader label on this replica's pod (POD_NAME; none outside a pod): the API's Service routes by it."""
    pod, namespace = os.environ.get("POD_NAME", "").strip(), own_namespace()
    if pod and namespace:
        await label_own_pod(runtime.client, namespace, pod, leading)


#: how often the API's discovery is read again for a configured workload kind kopf does not watch yet
ABSENT_KINDS_RESCAN_SECONDS = 30.0


async def look_for_absent_kinds(
    kinds: list[WorkloadKind], insights: Any, settings: kopf.OperatorSettings, client: KubeClient,
    interval: float = ABSENT_KINDS_RESCAN_SECONDS,
) -> None:
    """While a configured workload kind is not watched, look for its group in discovery every `interval`.

    kopf reads a group's discovery again only on an event of one of its CRDs: a group listed a moment
    after its CRD's last event (Established), or no CRD events at all (a role without list/watch on CRDs),
    would leave a kind installed while the controller runs (Kubeflow's training operator, KubeRay)
    unwatched until a restart. Each round reads the served groups once (`/apis`) and, for a served group of
    a kind kopf does not watch, runs kopf's own rescan (the one its CRD events run); a round with every
    kind watched reads nothing. kopf has no public name for that rescan or for `insights` (a `kopf.run`
    argument): kopf is pinned below 2.
    """
    from kopf._core.reactor.observation import process_discovered_resource_event

    failing = False
    while True:
        await asyncio.sleep(interval)
        watched = {(resource.group, resource.kind) for resource in insights.watched_resources}
        absent = {kind.group for kind in kinds if (kind.group, kind.kind) not in watched}
        if not absent:
            continue
        try:
            listed = await client.get("/apis") or {}
            served = {group.get("name") for group in listed.get("groups", [])}
            for group in sorted(absent & served):
                await process_discovered_resource_event(
                    raw_event={"type": "MODIFIED", "object": {"spec": {"group": group}}},
                    settings=settings, registry=REGISTRY, insights=insights,
                )
        except Exception as error:  # the next round asks again; said once an outage
            if not failing:
                logger.warning("reading the API's discovery for workload kinds not yet watched failed: %s", error)
            failing = True
        else:
            failing = False


async def end_vanished_workloads(runtime: ControllerRuntime, kinds: list[WorkloadKind]) -> None:
    """Restored workloads still queued or pending whose object went while the controller was down end now.

    Their delete event is gone with the controller; the watch lists only the objects that exist.
    """
    from gpuwm.model import WorkloadEvent

    watched = {kind.kind for kind in kinds}
    now = runtime.clock()
    for figures in runtime.engine.workloads(now):
        if figures.requested_gpus is None or figures.kind not in watched or figures.phase not in ("Queued", "Pending"):
            continue
        try:
            found = await runtime.client.get_object(figures.api_version, figures.kind, figures.namespace, figures.name)
        except Exception as error:  # unknown now: its next event (or none) says
            logger.warning("cannot read %s %s/%s (%s)", figures.kind, figures.namespace, figures.name, error)
            continue
        if found is None or str((found.get("metadata") or {}).get("uid")) != figures.uid:
            runtime.engine.observe_workload(WorkloadEvent(
                t=now, event="workload", namespace=figures.namespace, name=figures.name, uid=figures.uid,
                kind=figures.kind, api_version=figures.api_version, created=figures.created_time, deleted=True,
                requested_gpus=figures.requested_gpus or 0.0))


def _policy_room(runtime: ControllerRuntime) -> PolicyRoom | None:
    """The idle-policy and cost room, where idle policies or pricing are enabled; its memory from the state."""
    settings = runtime.settings
    if not settings.idle_policies.enabled and not settings.pricing.enabled:
        return None
    room = PolicyRoom(settings, runtime.client, runtime.writer.bucket, runtime.state.cr_names.get, own_namespace(),
                      runtime.clock)
    room.restore(runtime.state.policies)
    runtime.policies = room
    return room


async def _delayed_cycles(runtime: ControllerRuntime) -> None:
    # the pods watch starts right after startup: give its initial listing a moment first
    await asyncio.sleep(min(2.0, runtime.settings.status_interval))
    await runtime.run_cycles()


def _open_store(settings: Settings) -> Any:
    """The store (embedded SQLite or Prometheus); CR status works without it."""
    try:
        from gpuwm.store import open_store
    except ImportError:
        return None
    open_at = functools.partial(open_store, rollups=settings.store_rollups, retention_seconds=settings.retention,
                                latest_rows_per_interval=settings.store_latest_rows_per_interval)
    try:
        return open_at(settings.store)
    except Exception as error:
        if settings.store.startswith(("http://", "https://")):
            logger.warning("store %s not available (%s); writing CR status only", settings.store, error)
            return None
        fallback = str(Path(tempfile.gettempdir()) / "gpuwm" / "gpuwm.db")
        logger.warning("cannot open --store %s (%s); using %s (set --store to a writable path)",
                       settings.store, error, fallback)
    try:
        return open_at(fallback)
    except Exception as error:
        logger.warning("store %s not available (%s); writing CR status only", fallback, error)
        return None


def _start_api(runtime: ControllerRuntime) -> asyncio.Task[None] | None:
    """The metrics API on the store, served in kopf's loop (`--api-listen`)."""
    if runtime.store is None:
        return None
    try:
        from gpuwm.api import ApiServer, create_app, tls_files
        from gpuwm.config import parse_listen
    except ImportError:
        return None
    from gpuwm.controller.pull import EngineCollector, IntakeCollector
    settings = runtime.settings
    # no certificate files given: the one kept in --api-tls-secret (read or made once the task runs)
    kept = settings.api_tls and not settings.api_tls_cert_file and bool(settings.api_tls_secret)
    try:
        host, port = parse_listen(settings.api_listen, "--api-listen", 8080)
        tls = None if kept else tls_files(settings.api_tls, settings.api_tls_cert_file, settings.api_tls_key_file, host)
        app = create_app(runtime.store, settings, extra_collectors=(
            IntakeCollector(lambda: runtime.puller), EngineCollector(lambda: runtime.engine),
            PolicyCollector(lambda: runtime.policies),
        ))
    except Exception as error:  # e.g. --auth=kubernetes without credentials: CR status goes on
        logger.warning("metrics API not started: %s", error)
        return None

    async def server() -> Any:
        files = await _kept_certificate(runtime, host) if kept else tls
        return ApiServer(app, host, port, tls=files)

    task = asyncio.create_task(_serve_api(server(), host), name="gpuwm api")
    task.add_done_callback(_report_api_exit)
    return task


def own_namespace() -> str | None:
    """The controller pod's namespace: POD_NAMESPACE (the chart's downward API), else its service account's."""
    found = os.environ.get("POD_NAMESPACE", "").strip()
    if not found:
        with contextlib.suppress(OSError):
            found = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip()
    return found or None


async def _kept_certificate(runtime: ControllerRuntime, host: str) -> Any:
    """The API's certificate from the Secret --api-tls-secret in the controller's namespace (made there when
    missing or due); one made in memory, with a warning naming the cause, when that Secret cannot be used."""
    from gpuwm.api import kept_in_secret, self_signed

    settings = runtime.settings
    namespace = own_namespace()
    if namespace is None:
        logger.warning("metrics API: --api-tls-secret %s needs the controller's namespace (env POD_NAMESPACE); "
                       "serving a certificate made in memory", settings.api_tls_secret)
        return self_signed(host)
    try:
        files, _ = await kept_in_secret(runtime.client, namespace, settings.api_tls_secret, settings.api_tls_dns_names)
    except Exception as error:
        logger.warning("metrics API: cannot keep the certificate in Secret %s/%s (%s); serving one made in memory "
                       "(the controller needs get, create and patch on that Secret: the chart's Role)",
                       namespace, settings.api_tls_secret, error)
        return self_signed(host)
    return files


async def _serve_api(making: Awaitable[Any], host: str) -> None:
    server = await making
    await server.start()
    logger.info("metrics API listening on %s://%s:%d", server.scheme, host, server.port)
    try:
        await server.wait()
    finally:
        await server.stop()


def _report_api_exit(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("metrics API stopped: %s", task.exception())


@kopf.on.probe(id="statusCycles", registry=REGISTRY)
def status_cycles(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Liveness detail: how many status cycles ran and how many writes are queued."""
    runtime = _runtime(memo)
    if runtime is None:
        return {"started": False}
    return {"cycles": runtime.cycles, "pendingWrites": runtime.writer.pending, "writes": runtime.writer.stats.writes}


@kopf.on.cleanup(registry=REGISTRY)
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the loops, save the state one last time, close connections."""
    tasks: list[asyncio.Task[None]] = memo.get("tasks") or []
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    tasks.clear()
    runtime = _runtime(memo)
    if runtime is not None:
        await runtime.finish_saving()  # a save the cancelled cycle left renaming, before the last one
        runtime.save(time.time())
        if runtime.kept is not None and runtime.leading:  # for the standby taking over
            await runtime.kept.keep_now(runtime.state_path)
        if runtime.leading:
            await _label_leader(runtime, leading=False)
    runtime = runtime or memo.get("starting")  # a standby's: its client, API and store
    if runtime is not None:
        await runtime.puller.close()
        await runtime.client.close()
        if runtime.store is not None:
            with contextlib.suppress(Exception):
                runtime.store.close()
