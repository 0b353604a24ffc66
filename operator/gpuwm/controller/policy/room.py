"""The idle-policy room: policies in, steps decided each status cycle, carried out, recorded; cost on the CRs.

Each status cycle hands the room the engine's figures (`observe`): the pure evaluator
(`gpuwm.accounting.PolicyEvaluator`) says which steps are due, the cost meter prices every workload and
project. A task of its own (`run`) carries the steps out one at a time through the status writes'
token bucket: it fetches the workload object afresh (a person may have exempted or changed it since),
does the step (or, in a dry run, only says it would), and records it everywhere a person looks: an
Event on the workload and on its GPUWorkloadMetrics, the CR's `status.policyActions` and IdlePolicy
condition, the policy's status, and a counter. A failed step is reported on the policy and tried again
with backoff (the evaluator's). At start the controller asks the API server which rights it holds
(`AccessCheck`) and each policy's status names those its actions lack.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, NamedTuple

import aiohttp

from gpuwm.accounting import (
    CostMeter,
    Policy,
    PolicyError,
    PolicyEvaluator,
    PolicyOutlook,
    ProjectCost,
    Result,
    Step,
    Subject,
    WorkloadCost,
    exempt,
    project_costs,
    selects,
)
from gpuwm.config import Settings
from gpuwm.controller.kube import KubeApiError, KubeClient, TokenBucket, resource_path
from gpuwm.controller.policy.access import BASE_RULES, Access, AccessCheck, accesses, rules_for
from gpuwm.controller.policy.actions import Actuator, NotApplicable
from gpuwm.controller.policy.report import (
    EVENT_REASONS,
    FAILED_REASON,
    PolicyState,
    action_record,
    cost_fields,
    idle_policy_condition,
    newest_first,
    policy_status,
    trail,
)
from gpuwm.controller.status import API_VERSION, Seen, event_body
from gpuwm.model import MAX_POLICY_LISTED, ProjectFigures, WorkloadFigures
from gpuwm.store import GpuHourPrice

logger = logging.getLogger(__name__)

POLICY_PLURALS = {"GPUIdlePolicy": "gpuidlepolicies", "ClusterGPUIdlePolicy": "clustergpuidlepolicies"}
#: how long a workload object's labels and annotations (or a node's labels) are trusted before read again
METADATA_SECONDS = 300.0
#: a policy's status is written again at least this often (its planned times move with the clock)
STATUS_REFRESH_SECONDS = 60.0
WEBHOOK_TIMEOUT_SECONDS = 10.0
PolicyId = tuple[str, str | None, str]  # (kind, namespace, name)


class ObjectMetadata(NamedTuple):
    """A workload object's labels and annotations, and when they were read."""

    labels: dict[str, str]
    annotations: dict[str, str]
    read_at: float


def _object_metadata(obj: Mapping[str, Any], read_at: float) -> ObjectMetadata:
    """`obj`'s labels and annotations, as strings."""
    metadata = obj.get("metadata") or {}
    return ObjectMetadata({str(k): str(v) for k, v in (metadata.get("labels") or {}).items()},
                          {str(k): str(v) for k, v in (metadata.get("annotations") or {}).items()}, read_at)


class NodeLabels(NamedTuple):
    """A node's labels, and when they were read."""

    labels: dict[str, str]
    read_at: float


class WrittenStatus(NamedTuple):
    """A policy's status as last written: a hash of its content, and when."""

    content: int
    at: float


class PolicyRoom:
    """Idle policies and cost for one controller (see the module's docstring)."""

    def __init__(self, settings: Settings, client: KubeClient, bucket: TokenBucket, cr_name: Callable[[str], str | None],
                 own_namespace: str | None, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.client = client
        self.bucket = bucket
        self.cr_name = cr_name
        self.own_namespace = own_namespace
        self.clock = clock
        self.allowed_actions = set(settings.idle_policies.actions)
        self.evaluator = PolicyEvaluator()
        self.meter = CostMeter(settings.pricing, self._node_labels)
        self.actuator = Actuator(client)
        self.access = AccessCheck(client)
        self.lacking: set[Access] | None = None  # None until the access check ran
        self.policies: dict[PolicyId, PolicyState] = {}
        self.outlooks: dict[str, PolicyOutlook] = {}
        self.records: dict[str, list[dict[str, Any]]] = {}  # workload uid -> its policyActions, newest first
        self.acted: dict[tuple[str, str], float] = {}  # (policy, uid) -> last step done in its current episode
        self.warned: set[tuple[str, str]] = set()
        self.released: dict[str, float] = {}  # uid -> when its last episode with a step done ended
        self.costs: dict[str, WorkloadCost] = {}
        self.project_cost: dict[str, ProjectCost] = {}
        self.identity: dict[str, tuple[str, str, str, str]] = {}  # uid -> (namespace, name, kind, project)
        self.metadata: dict[str, ObjectMetadata] = {}
        self.nodes: dict[str, NodeLabels] = {}
        self.counters: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._queue: collections.deque[tuple[Step, WorkloadFigures]] = collections.deque()
        self._queued: set[tuple[str, str, int]] = set()
        self._wanted_metadata: dict[str, tuple[str, str, str, str]] = {}
        self._wanted_nodes: set[str] = set()
        self._written: dict[PolicyId, WrittenStatus] = {}
        self._wake = asyncio.Event()

    # ------------------------------------------------------------------ policies

    def on_policy(self, kind: str, body: Mapping[str, Any], deleted: bool) -> None:
        """A GPUIdlePolicy or ClusterGPUIdlePolicy was added, changed or deleted."""
        metadata = body.get("metadata") or {}
        namespace = metadata.get("namespace") if kind == "GPUIdlePolicy" else None
        ident: PolicyId = (kind, namespace, str(metadata.get("name")))
        if deleted:
            self.policies.pop(ident, None)
            self._written.pop(ident, None)
            return
        state = self.policies.get(ident)
        if state is None:
            state = PolicyState(kind=kind, namespace=namespace, name=ident[2])
        elif state.generation != metadata.get("generation"):
            self.evaluator.forget_policy(state.key)  # its spec changed: its episodes start again
        state.generation = metadata.get("generation")
        try:
            state.policy, state.problem = Policy.parse(state.name, namespace, body.get("spec") or {}), None
        except PolicyError as error:
            state.policy, state.problem = None, str(error)
            logger.warning("%s %s cannot be used: %s", kind, state.key, error)
        self.policies[ident] = state
        self._refresh_missing(state)
        self._written.pop(ident, None)  # written again soon: its spec changed
        self._wake.set()

    def _refresh_missing(self, state: PolicyState) -> None:
        if state.policy is None:
            state.missing = []
            return
        types = {action.type for action in state.policy.spec.actions}
        missing = [f"idlePolicies.actions does not enable {action}" for action in sorted(types - self.allowed_actions)]
        if self.lacking is not None:
            wanted = accesses([*BASE_RULES, *rules_for(types & self.allowed_actions)])
            missing += sorted({access.text for access in wanted if access in self.lacking})
        state.missing = missing

    def active_policies(self) -> list[Policy]:
        return [state.policy for state in self.policies.values() if state.policy is not None]

    # ------------------------------------------------------------------ the status cycle

    def observe(self, workloads: list[WorkloadFigures], projects: list[ProjectFigures],
                seen: Mapping[str, Seen], now: float) -> None:
        """This cycle's figures: steps due are queued, costs and each policy's outlook kept for the writes."""
        subjects = [self._subject(figures, seen.get(figures.uid)) for figures in workloads]
        steps, self.outlooks = self.evaluator.evaluate(self.active_policies(), subjects, now)
        figures_of = {figures.uid: figures for figures in workloads}
        for step in steps:
            key = (step.policy, step.uid, step.index)
            if key not in self._queued:
                self._queued.add(key)
                self._queue.append((step, figures_of[step.uid]))
        self._end_episodes(now)
        self.identity = {f.uid: (f.namespace, f.name, f.kind, f.project) for f in workloads}
        for uid in [uid for uid in self.records if uid not in figures_of]:
            del self.records[uid]  # retention forgot the workload
        if self.meter.enabled:
            self.costs = {figures.uid: self.meter.workload(figures) for figures in workloads}
            self.project_cost = project_costs(projects, ((f, self.costs[f.uid]) for f in workloads))
            self.meter.forget(figures_of)
        self._want_metadata(workloads, now)
        if steps or self._wanted_metadata or self._wanted_nodes or self.policies:
            self._wake.set()

    def _subject(self, figures: WorkloadFigures, seen: Seen | None) -> Subject:
        known = self.metadata.get(figures.uid)
        return Subject(figures=figures, reporting=seen.reporting if seen is not None else figures.sampling,
                       labels=known.labels if known is not None else {},
                       annotations=known.annotations if known is not None else {})

    def _end_episodes(self, now: float) -> None:
        for pair in [pair for pair in self.acted if pair not in self.evaluator.progress]:
            del self.acted[pair]
            self.warned.discard(pair)
            _, uid = pair
            self.released[uid] = now

    def _want_metadata(self, workloads: Iterable[WorkloadFigures], now: float) -> None:
        """Labels and annotations of the idle workloads a policy might act on (exemptions, label selectors)."""
        if not self.policies:
            return
        for figures in workloads:
            if figures.phase != "Running" or figures.idle_seconds <= 0:
                continue
            known = self.metadata.get(figures.uid)
            if known is None or now - known.read_at >= METADATA_SECONDS:
                self._wanted_metadata[figures.uid] = (figures.api_version, figures.kind, figures.namespace,
                                                      figures.name)

    def _node_labels(self, node: str) -> Mapping[str, str] | None:
        if not self.settings.pricing.node_labels:
            return None
        known = self.nodes.get(node)
        if known is None or self.clock() - known.read_at >= METADATA_SECONDS:
            self._wanted_nodes.add(node)
        return known.labels if known is not None else None

    # ------------------------------------------------------------------ what the CR writes carry

    def signature(self, uid: str) -> Hashable:
        """Changes whenever what `decorate_workload` adds (other than cost, which moves with the counters) does."""
        records = self.records.get(uid)
        return (len(records) if records else 0, records[0]["time"] if records else None, self._in_episode(uid))

    def _in_episode(self, uid: str) -> bool:
        """Whether a policy took a step on the workload in its current idle episode."""
        return any(acted_uid == uid for _, acted_uid in self.acted)

    def decorate_workload(self, figures: WorkloadFigures, status: dict[str, Any]) -> None:
        """Cost figures, the policy trail and the IdlePolicy condition, into a GPUWorkloadMetrics status body."""
        cost = self.costs.get(figures.uid)
        if cost is not None:
            status.update(cost_fields(cost, self.meter.currency))
        records = self.records.get(figures.uid, [])
        status["policyActions"] = records
        condition = idle_policy_condition(records, self._in_episode(figures.uid), self.released.get(figures.uid))
        if condition is not None:
            status.setdefault("conditions", []).append(condition)

    def prices(self) -> dict[str, GpuHourPrice]:
        """This cycle's price per GPU-hour of every priced workload, for the store: a period report prices
        the period's GPU-seconds at them."""
        currency = self.meter.currency
        return {uid: GpuHourPrice(cost.price_per_gpu_hour, currency) for uid, cost in self.costs.items()
                if cost.price_per_gpu_hour is not None}

    def decorate_project(self, name: str, status: dict[str, Any]) -> None:
        cost = self.project_cost.get(name)
        if cost is not None:
            status.update(cost_fields(cost, self.meter.currency))

    # ------------------------------------------------------------------ the task

    async def run(self, interval: float) -> None:
        """Check the controller's rights once, then carry out steps, read metadata and write policy statuses."""
        if self.settings.idle_policies.enabled:
            await self.check_access()
        while True:
            await self._drain()
            await self._read_wanted()
            await self._write_statuses()
            self._wake.clear()
            if not self._queue:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=interval)

    async def check_access(self) -> None:
        wanted = accesses([*BASE_RULES, *rules_for(self.allowed_actions)])
        self.lacking = set(await self.access.check(wanted))
        if self.lacking:
            logger.warning("idle policies: the controller lacks %s (the chart grants them with idlePolicies.enabled)",
                           ", ".join(sorted(access.text for access in self.lacking)))
        for state in self.policies.values():
            self._refresh_missing(state)

    async def _drain(self) -> None:
        while self._queue:
            step, figures = self._queue.popleft()
            await self.bucket.acquire()
            try:
                await self._carry_out(step, figures)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # one step must not stop the others: recorded as failed, tried again
                logger.exception("idle policy %s: %s on %s/%s failed", step.policy, step.action, step.namespace,
                                 step.name)
                self._record(step, "Failed", f"unexpected error: {error}", self.clock())
            finally:
                self._queued.discard((step.policy, step.uid, step.index))

    async def _carry_out(self, step: Step, figures: WorkloadFigures) -> None:
        now = self.clock()
        obj = await self.actuator.fetch(step)  # as it is now, dry run or not: a person may have exempted it since
        if obj is None:
            self._record(step, "Skipped", f"{step.kind} {step.namespace}/{step.name} is gone", now)
            return
        if not self._still_applies(step, figures, obj, now):
            return  # exempted or no longer selected since: the next evaluation sees its fresh metadata
        if step.dry_run:
            self._record(step, "DryRun", f"would {step.action} {step.kind} {step.namespace}/{step.name} "
                         f"(idle {step.idle_seconds:.0f}s)", now)
            return
        if step.action not in self.allowed_actions:
            self._record(step, "Skipped", f"idlePolicies.actions does not enable {step.action}", now)
            return
        result, message = await self._act(step, obj, now)
        self._record(step, result, message, now)
        if result == "Succeeded":
            await self._announce(step, message, now)
        elif result == "Failed":
            await self._announce_failure(step, message, now)

    def _still_applies(self, step: Step, figures: WorkloadFigures, obj: Mapping[str, Any], now: float) -> bool:
        known = self.metadata[step.uid] = _object_metadata(obj, now)
        policy = next((p for p in self.active_policies() if p.key == step.policy), None)
        subject = Subject(figures=figures, reporting=True, labels=known.labels, annotations=known.annotations)
        return policy is not None and selects(policy, subject) and not exempt(policy, subject, now)

    async def _act(self, step: Step, obj: Mapping[str, Any], now: float) -> tuple[Result, str]:
        if step.action == "warn":
            failure = await self._webhook(step) if step.webhook_secret is not None else None
            if failure is not None:
                return "Failed", failure
            return "Succeeded", (f"warned: {step.kind} {step.name} has held its GPUs idle for "
                                 f"{step.idle_seconds:.0f}s")
        try:
            change = await self.actuator.change_for(step, obj, now)
            if change is None:
                return "Succeeded", f"{step.kind} {step.name} was already at rest ({step.action})"
            await self.actuator.send(change)
        except NotApplicable as reason:
            return "Skipped", str(reason)
        except KubeApiError as error:
            hint = " (the chart grants it with idlePolicies.enabled)" if error.status == 403 else ""
            return "Failed", f"{step.action} failed: {error}{hint}"
        return "Succeeded", change.description

    async def _webhook(self, step: Step) -> str | None:
        """POST the warning to the URL the policy's Secret holds; why it failed, or None."""
        assert step.webhook_secret is not None
        name, key = step.webhook_secret
        if not self.settings.idle_policies.webhooks or not self.own_namespace:
            return "webhooks are not enabled (idlePolicies.webhooks) or the controller's namespace is unknown"
        try:
            secret = await self.client.get(resource_path("v1", "secrets", self.own_namespace, name)) or {}
            url = base64.b64decode(str((secret.get("data") or {}).get(key, ""))).decode().strip()
        except (KubeApiError, ValueError) as error:
            return f"cannot read the webhook's Secret {self.own_namespace}/{name}: {error}"
        if not url.startswith(("https://", "http://")):
            return f"Secret {self.own_namespace}/{name} key {key} holds no http(s) URL"
        payload = {"policy": step.policy, "action": step.action, "namespace": step.namespace, "name": step.name,
                   "kind": step.kind, "idleSeconds": step.idle_seconds}
        try:
            timeout = aiohttp.ClientTimeout(total=WEBHOOK_TIMEOUT_SECONDS)
            async with aiohttp.ClientSession(timeout=timeout) as session, session.post(url, json=payload) as answer:
                if answer.status >= 300:
                    return f"the webhook answered HTTP {answer.status}"
        except (aiohttp.ClientError, TimeoutError) as error:
            return f"the webhook could not be reached: {error!r}"
        return None

    def _record(self, step: Step, result: Result, message: str, now: float) -> None:
        self.evaluator.record(step, result, now)
        self.counters[(step.policy, step.action, result)] += 1
        state = next((s for s in self.policies.values() if s.key == step.policy), None)
        if state is not None:
            entry = action_record(now, step.policy, step.action, result, message, step.namespace, step.name)
            state.recent = newest_first(state.recent, entry, MAX_POLICY_LISTED)
            state.taken += result == "Succeeded"
            state.failed += result == "Failed"
        if result == "DryRun":
            return  # a dry run changes nothing, not even the workload's own trail
        self.records[step.uid] = trail(self.records.get(step.uid, []), action_record(
            now, step.policy, step.action, result, message))
        if result == "Succeeded":
            self.acted[(step.policy, step.uid)] = now
            if step.action == "warn":
                self.warned.add((step.policy, step.uid))
        log = logger.info if result == "Succeeded" else logger.warning
        log("idle policy %s: %s %s/%s %s: %s", step.policy, step.action, step.namespace, step.name, result, message)

    async def _announce(self, step: Step, message: str, now: float) -> None:
        """Events on the workload and on its GPUWorkloadMetrics saying what was done."""
        involved = [{"apiVersion": step.api_version, "kind": step.kind, "name": step.name,
                     "namespace": step.namespace, "uid": step.uid}]
        cr_name = self.cr_name(step.uid)
        if cr_name:
            involved.append({"apiVersion": API_VERSION, "kind": "GPUWorkloadMetrics", "name": cr_name,
                             "namespace": step.namespace})
        text = f"idle policy {step.policy}: {message}"
        for target in involved:
            await self._post_event(event_body(target, EVENT_REASONS[step.action], text, now, "IdlePolicy"))

    async def _announce_failure(self, step: Step, message: str, now: float) -> None:
        """An Event on the policy: its status says the same, with the failures before it."""
        state = next((s for s in self.policies.values() if s.key == step.policy), None)
        if state is None:
            return
        involved = {"apiVersion": API_VERSION, "kind": state.kind, "name": state.name}
        if state.namespace:
            involved["namespace"] = state.namespace
        text = f"{step.action} on {step.kind} {step.namespace}/{step.name}: {message}"
        await self._post_event(event_body(involved, FAILED_REASON, text, now, "IdlePolicy"))

    async def _post_event(self, body: dict[str, Any]) -> None:
        try:
            await self.client.create(resource_path("v1", "events", str(body["metadata"]["namespace"])), body)
        except KubeApiError as error:
            logger.warning("cannot post idle policy event %s: %s", body.get("reason"), error)

    async def _read_wanted(self) -> None:
        """Labels and annotations of idle workloads, labels of nodes a price rule reads (a token each)."""
        while self._wanted_metadata:
            uid, (api_version, kind, namespace, name) = self._wanted_metadata.popitem()
            await self.bucket.acquire()
            try:
                found = await self.client.get_object(api_version, kind, namespace, name)
            except KubeApiError as error:
                logger.debug("cannot read %s %s/%s: %s", kind, namespace, name, error)
                continue
            self.metadata[uid] = _object_metadata(found or {}, self.clock())
        while self._wanted_nodes:
            node = self._wanted_nodes.pop()
            await self.bucket.acquire()
            try:
                found = await self.client.get(resource_path("v1", "nodes", None, node))
            except KubeApiError:
                continue
            labels = ((found or {}).get("metadata") or {}).get("labels") or {}
            self.nodes[node] = NodeLabels({str(k): str(v) for k, v in labels.items()}, self.clock())

    async def _write_statuses(self) -> None:
        now = self.clock()
        for ident, state in list(self.policies.items()):
            body = policy_status(state, self.outlooks.get(state.key), now)
            content = hash(repr({k: v for k, v in body.items() if k not in ("lastUpdateTime", "conditions")}))
            written = self._written.get(ident)
            if written is not None and written.content == content and now - written.at < STATUS_REFRESH_SECONDS:
                continue
            await self.bucket.acquire()
            path = resource_path(API_VERSION, POLICY_PLURALS[state.kind], state.namespace, state.name) + "/status"
            try:
                await self.client.merge_patch(path, {"status": body})
            except KubeApiError as error:
                if error.status != 404:  # gone: its delete event is on the way
                    logger.warning("cannot write the status of %s %s: %s", state.kind, state.key, error)
                continue
            self._written[ident] = WrittenStatus(content, now)

    # ------------------------------------------------------------------ restart

    def save(self) -> dict[str, Any]:
        """What a restart needs: the evaluator's memory, the rates, the workloads' trails and episodes."""
        return {"evaluator": self.evaluator.save(), "meter": self.meter.save(), "records": self.records,
                "acted": [[policy, uid, at] for (policy, uid), at in self.acted.items()],
                "warned": [list(pair) for pair in self.warned]}

    def restore(self, saved: Mapping[str, Any]) -> None:
        self.evaluator = PolicyEvaluator.restore(saved.get("evaluator") or {})
        self.meter.restore(saved.get("meter") or {})
        self.records = {str(uid): list(records) for uid, records in (saved.get("records") or {}).items()}
        self.acted = {(str(policy), str(uid)): float(at) for policy, uid, at in saved.get("acted") or []}
        self.warned = {(str(policy), str(uid)) for policy, uid in saved.get("warned") or []}
