"""Writes GPUWorkloadMetrics / GPUProjectMetrics: create once, then status through `/status` only.

Each cycle offers the desired status of every CR; the writer keeps only what is worth
sending (news, or a refresh that is due) and drains it through a token bucket, so a cluster
with thousands of workloads never sends more than `rate` writes a second. Freshness is a
matter of order, not of rate: news (a state change: phase, GPUs, active or idle, a condition)
goes first, so it reaches its CR within a status interval or two however many CRs wait for a
refresh; then refreshes of CRs whose figures are older than `counters_refresh_seconds` (or that
this controller has not written yet), then the other refreshes, each lane in offer order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwm.controller.kube import KubeApiError, KubeClient, TokenBucket, resource_path
from gpuwm.controller.status.build import (
    CLUSTER_QUEUE_LABEL,
    LOCAL_QUEUE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    WriteReason,
    write_reason,
)
from gpuwm.model import GROUP, VERSION

logger = logging.getLogger(__name__)
#: labels that come after a CR's creation (a Kueue ClusterQueue once admitted): a CR adopted at a restart may lack them
_LATER_LABELS = frozenset({LOCAL_QUEUE_LABEL, CLUSTER_QUEUE_LABEL})

API_VERSION = f"{GROUP}/{VERSION}"
WORKLOAD_PLURAL = "gpuworkloadmetrics"
PROJECT_PLURAL = "gpuprojectmetrics"
WORKLOAD_KIND = "GPUWorkloadMetrics"
PROJECT_KIND = "GPUProjectMetrics"
#: writes whose lag `WriterStats` keeps
LAG_HISTORY = 10_000
#: how long a namespace that refused a create as terminating gets no writes (it is usually gone by then)
NAMESPACE_RETRY_SECONDS = 60.0
#: with a backlog, writes go in bursts of this many seconds' tokens (10 at 20/s): one wake-up of the
#: loop per burst instead of per write, less CPU per write; the rate stays the bucket's
WRITE_BURST_SECONDS = 0.5


@dataclass(slots=True)
class Desired:
    """One CR as it should be: where, its spec and labels (for creation), and how to build its status.

    The status is built only when it is written (`render`), so a cycle that offers thousands of
    CRs pays for the few the token bucket lets through, not for all of them. `signature` (what a
    reader acts on) and `counters` (what moves with time) are only compared for equality: the
    controller passes their hashes (see `StatusOffers.offer_workloads`).
    """

    plural: str
    namespace: str | None
    name: str
    spec: dict[str, Any]
    labels: dict[str, str]
    render: Callable[[], dict[str, Any]]
    signature: Hashable
    counters: Hashable
    reason: WriteReason = "material"
    sample_time: float | None = None  # latest sample behind these figures, for the lag figure


@dataclass(slots=True)
class Written:
    signature: Hashable
    counters: Hashable
    at: float
    uid: str | None = None  # the workload's (GPUWorkloadMetrics only)


@dataclass
class WriterStats:
    writes: int = 0
    failures: int = 0
    #: sample -> CR status lag of the latest writes (bounded: a long-running controller must not grow)
    lag_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=LAG_HISTORY))
    #: writes taken from each lane: "news" (state changes, new CRs), "stale" (figures older than the counters
    #: refresh, or adopted and not written yet), "refresh" (the routine ones)
    taken: dict[str, int] = field(default_factory=lambda: {"news": 0, "stale": 0, "refresh": 0})


#: a CR: (plural, namespace or None, name)
Key = tuple[str, str | None, str]


class ForeignObjectError(Exception):
    """A CR of the wanted name exists and was not created by gpuwm."""


class StatusWriter:
    """Rate-limited, change-driven CR writer: news first, then due refreshes, each in offer order."""

    def __init__(
        self,
        client: KubeClient,
        bucket: TokenBucket,
        interval_seconds: float,
        clock: Callable[[], float] = time.time,
        counters_refresh_seconds: float = 300.0,
    ) -> None:
        self._client = client
        self.bucket = bucket
        self._interval = interval_seconds
        self._counters_refresh = counters_refresh_seconds
        self._clock = clock
        # dicts keep insertion order: re-offering a queued CR updates it in place, keeping its turn
        self._material: dict[Key, Desired] = {}
        #: refreshes of CRs written `counters_refresh_seconds` ago or more, or adopted and not written by this
        #: controller yet (an earlier one's figures): before the routine refreshes of `_due`
        self._stale: dict[Key, Desired] = {}
        self._due: dict[Key, Desired] = {}
        self._wake = asyncio.Event()
        self.written: dict[Key, Written] = {}
        self.existing: set[Key] = set()
        self.skipped: set[Key] = set()  # names held by objects gpuwm did not create
        #: a hash of the labels each CR was created or last patched with: labels that change later (a workload's
        #: Kueue ClusterQueue, known once it is admitted) are patched onto it
        self.labels_hash: dict[Key, int] = {}
        #: metadata.generation of each CR as last answered by the API server (status.observedGeneration)
        self.generations: dict[Key, int] = {}
        #: namespaces being terminated (or gone) -> when that was seen; no writes there for a while
        self.closed_namespaces: dict[str, float] = {}
        #: CRs that went with their namespace -> their workload's uid: not written again if the
        #: namespace is re-created (a new workload of the same name is written as usual)
        self.buried: dict[Key, str] = {}
        #: GPUProjectMetrics offered since the last `retire_projects`, and adopted ones' last update
        self._offered_projects: set[str] = set()
        self.adopted_project_updates: dict[str, float] = {}
        self.stats = WriterStats()
        #: writes taken from the queues and not done yet (sending, or waiting out the client's backoff)
        self.writing = 0

    @property
    def pending(self) -> int:
        return len(self._material) + len(self._stale) + len(self._due)

    def offer(self, desired: Desired) -> WriteReason:
        """Queue `desired` if it is worth a write; returns why (or "none")."""
        key: Key = (desired.plural, desired.namespace, desired.name)
        if desired.plural == PROJECT_PLURAL:
            self._offered_projects.add(desired.name)
        if key in self.skipped or self._namespace_closed(desired.namespace):
            return "none"
        if key in self.buried:
            if self.buried[key] == _workload_uid(desired):
                return "none"  # its CR went with the namespace it was in
            del self.buried[key]
        last = self.written.get(key)
        now = self._clock()
        waiting = self._stale.get(key)
        if (last is None and key in self.existing and key not in self._material
                and (waiting is None or waiting.signature == desired.signature)):
            # adopted at start, not written since: it shows an earlier controller's figures. A refresh, oldest of
            # all; as news, every CR adopted at a restart would hold each state change back. A state that changes
            # while it waits is news, as for any CR
            reason: WriteReason = "due"
        else:
            reason = write_reason(
                (last.signature, last.counters, last.at) if last else None, desired.signature, desired.counters,
                now=now, interval_seconds=self._interval,
            )
        if reason == "none":
            self._due.pop(key, None)  # a refresh that is no longer needed
            self._stale.pop(key, None)
            if key in self._material:
                self._material[key] = desired  # news still to tell, with the latest figures
            return reason
        if reason == "material" or key in self._material:
            self._due.pop(key, None)
            self._stale.pop(key, None)
            desired.reason = "material"
            self._material[key] = desired
        else:
            desired.reason = "due"
            if last is None or now - last.at >= self._counters_refresh or key in self._stale:
                self._due.pop(key, None)
                self._stale[key] = desired
            else:
                self._due[key] = desired
        self._wake.set()
        return desired.reason

    def forget(self, plural: str, namespace: str | None, name: str) -> None:
        key: Key = (plural, namespace, name)
        self._material.pop(key, None)
        self._stale.pop(key, None)
        self._due.pop(key, None)
        self.written.pop(key, None)
        self.existing.discard(key)
        self.generations.pop(key, None)
        self.buried.pop(key, None)
        self.labels_hash.pop(key, None)

    def _namespace_closed(self, namespace: str | None) -> bool:
        """Whether `namespace` was being terminated lately (creates there fail with 403 until it is gone)."""
        if namespace is None or namespace not in self.closed_namespaces:
            return False
        if self._clock() - self.closed_namespaces[namespace] < NAMESPACE_RETRY_SECONDS:
            return True
        del self.closed_namespaces[namespace]  # maybe recreated since: try again
        return False

    def namespace_reopened(self, namespace: str) -> None:
        """The namespace exists and is active again (a namespace watch event): write there at once."""
        self.closed_namespaces.pop(namespace, None)

    def remember_generation(self, key: Key, obj: Mapping[str, Any] | None) -> int | None:
        """Keep `obj`'s metadata.generation as the CR's (adopted, created or patched); returns it, if any."""
        generation = ((obj or {}).get("metadata") or {}).get("generation")
        if isinstance(generation, int):
            self.generations[key] = generation
            return generation
        return None

    def _next(self) -> Desired | None:
        for lane, queue in (("news", self._material), ("stale", self._stale), ("refresh", self._due)):
            if queue:
                self.stats.taken[lane] += 1
                return queue.pop(next(iter(queue)))
        return None

    def _burst(self) -> int:
        """How many writes to send in one go: what is queued, at most WRITE_BURST_SECONDS of the rate and the burst."""
        bucket = self.bucket
        most = max(1, min(int(bucket.burst), int(bucket.rate_per_second * WRITE_BURST_SECONDS)))
        return min(self.pending, most)

    async def run(self) -> None:
        """Drain the queues forever at the bucket's rate, a burst of writes per wake-up.

        One write alone goes as soon as there is a token. With a backlog the writer waits for the tokens
        of a burst (WRITE_BURST_SECONDS) and sends them one after the other: the same rate, news first in
        offer order, each write at most a burst later, and the event loop wakes once per burst.
        """
        while True:
            count = self._burst()
            if count == 0:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self.bucket.acquire(count)
            for _ in range(count):
                desired = self._next()  # taken now: news offered while waiting goes first
                if desired is None:
                    break
                await self._write_logged(desired)

    async def _write_logged(self, desired: Desired) -> None:
        """`write`, with failures counted and logged: one bad object must not stop every other write."""
        self.writing += 1
        try:
            await self.write(desired)
        except KubeApiError as error:
            self.stats.failures += 1
            if error.namespace_gone and desired.namespace is not None:
                self._close_namespace(desired.namespace, error)
                return
            hint = (" (are the gpuwm CRDs installed? kubectl apply -f crds/)"
                    if error.status == 404 and error.method == "POST" else "")
            logger.warning("could not write %s %s/%s: %s%s", desired.plural, desired.namespace or "-", desired.name,
                           error, hint, extra={"resource": desired.plural, "object": desired.name})
        except asyncio.CancelledError:
            raise
        except Exception:
            self.stats.failures += 1
            logger.exception("unexpected error writing %s %s", desired.plural, desired.name)
        finally:
            self.writing -= 1

    async def write(self, desired: Desired) -> None:
        """Create the CR if needed, then merge-patch its status subresource."""
        key: Key = (desired.plural, desired.namespace, desired.name)
        if key in self.skipped:
            return
        path = resource_path(API_VERSION, desired.plural, desired.namespace, desired.name)
        if key not in self.existing:
            try:
                await self._create(desired, path)
            except ForeignObjectError:
                return
        await self._patch_labels(key, desired, path)
        status = desired.render()
        status["observedGeneration"] = self.generations.get(key)
        try:
            # NaN and the infinities go as null: JSON has no such numbers, and such a figure is unknown
            answer = await self._client.merge_patch(path + "/status", {"status": status}, nan_as_null=True)
        except KubeApiError as error:
            if error.status != 404:
                raise
            self.existing.discard(key)  # deleted behind our back: create it again, then write
            await self._create(desired, path)
            status["observedGeneration"] = self.generations.get(key)
            answer = await self._client.merge_patch(path + "/status", {"status": status}, nan_as_null=True)
        generation = self.remember_generation(key, answer)
        if generation is not None and generation != status["observedGeneration"]:
            # someone changed the spec since we last heard: say which generation this status is for
            await self._client.merge_patch(path + "/status", {"status": {"observedGeneration": generation}})
        now = self._clock()
        self.written[key] = Written(signature=desired.signature, counters=desired.counters, at=now,
                                    uid=_workload_uid(desired))
        self.stats.writes += 1
        if desired.sample_time is not None:
            self.stats.lag_seconds.append(now - desired.sample_time)

    async def _patch_labels(self, key: Key, desired: Desired, path: str) -> None:
        """Labels added since the CR was created (or, on a CR adopted at a restart, any beyond the fixed ones)."""
        labels = {**desired.labels, MANAGED_BY_LABEL: MANAGED_BY}
        labels_hash = hash(frozenset(labels.items()))
        known = self.labels_hash.get(key)
        if known == labels_hash or (known is None and not _LATER_LABELS.intersection(labels)):
            self.labels_hash[key] = labels_hash
            return
        self.remember_generation(key, await self._client.merge_patch(path, {"metadata": {"labels": labels}}))
        self.labels_hash[key] = labels_hash

    async def _create(self, desired: Desired, path: str) -> None:
        key: Key = (desired.plural, desired.namespace, desired.name)
        kind = WORKLOAD_KIND if desired.plural == WORKLOAD_PLURAL else PROJECT_KIND
        labels = {**desired.labels, MANAGED_BY_LABEL: MANAGED_BY}
        body: dict[str, Any] = {
            "apiVersion": API_VERSION, "kind": kind,
            "metadata": {"name": desired.name, "labels": labels,
                         **({"namespace": desired.namespace} if desired.namespace else {})},
            "spec": desired.spec,
        }
        collection = resource_path(API_VERSION, desired.plural, desired.namespace)
        try:
            self.remember_generation(key, await self._client.create(collection, body))
        except KubeApiError as error:
            if error.status != 409:
                raise
            if desired.plural == WORKLOAD_PLURAL and await self._foreign(collection, desired.name):
                self.skipped.add(key)
                logger.warning("GPUWorkloadMetrics %s/%s exists and is not managed by gpuwm (label %s); "
                               "leaving it alone and not writing its status", desired.namespace, desired.name,
                               MANAGED_BY_LABEL, extra={"namespace": desired.namespace, "object": desired.name})
                raise ForeignObjectError(desired.name) from None
            # ours (a restart, or a race): keep its spec in line with ours
            adopted = await self._client.merge_patch(path, {"metadata": {"labels": labels}, "spec": desired.spec})
            self.remember_generation(key, adopted)
        self.labels_hash[key] = hash(frozenset(labels.items()))
        self.existing.add(key)

    async def _foreign(self, collection: str, name: str) -> bool:
        """Whether the object of that name was made by someone else (found through `list`, which RBAC grants)."""
        items = await self._client.list_items(collection, {"fieldSelector": f"metadata.name={name}"})
        labels = ((items[0].get("metadata") or {}).get("labels") or {}) if items else {}
        return bool(items) and labels.get(MANAGED_BY_LABEL) != MANAGED_BY

    def _close_namespace(self, namespace: str, error: KubeApiError) -> None:
        if namespace not in self.closed_namespaces:
            logger.info("namespace %s is being terminated or is gone (%s); no CR writes there for %.0fs",
                        namespace, error.message, NAMESPACE_RETRY_SECONDS, extra={"namespace": namespace})
        self.closed_namespaces[namespace] = self._clock()
        for queue in (self._material, self._stale, self._due):
            for key in [key for key in queue if _namespace_of(key) == namespace]:
                del queue[key]
        for key in [key for key in self.written if _namespace_of(key) == namespace]:
            uid = self.written[key].uid
            self.forget(*key)
            if uid is not None:
                self.buried[key] = uid

    async def retire_projects(self, now: float, retention_seconds: float) -> list[str]:
        """Delete the GPUProjectMetrics of projects with no workload left; returns their names.

        A project is offered every cycle while the engine has any workload of it, so its CR goes once its
        last workload is forgotten, `retention` after it ended. A CR adopted at start whose project was not
        offered since goes once its own last update is `retention` old (its workloads ended while no
        controller ran, or were never known to this one).
        """
        offered, self._offered_projects = self._offered_projects, set()
        retired = []
        projects = sorted(name for plural, _, name in self.existing if plural == PROJECT_PLURAL and name not in offered)
        for name in projects:
            adopted_update = self.adopted_project_updates.get(name)
            if ((PROJECT_PLURAL, None, name) not in self.written and adopted_update is not None
                    and now - adopted_update < retention_seconds):
                continue
            try:
                await self.delete(PROJECT_PLURAL, None, name)
            except KubeApiError as error:
                logger.warning("cannot delete GPUProjectMetrics %s of a project without workloads: %s", name, error,
                               extra={"resource": PROJECT_PLURAL, "object": name})
                continue
            self.adopted_project_updates.pop(name, None)
            retired.append(name)
            logger.info("retention: deleted GPUProjectMetrics %s (no workloads left)", name,
                        extra={"resource": PROJECT_PLURAL, "object": name})
        return retired

    async def delete(self, plural: str, namespace: str | None, name: str) -> None:
        """Delete a CR (retention ran out); gone already is fine."""
        await self._client.delete(resource_path(API_VERSION, plural, namespace, name))
        self.forget(plural, namespace, name)


def _namespace_of(key: Key) -> str | None:
    _, namespace, _ = key
    return namespace


def _workload_uid(desired: Desired) -> str | None:
    uid = (desired.spec.get("workloadRef") or {}).get("uid")
    return str(uid) if uid else None
