"""A pod's top-level workload, found by walking ownerReferences (DESIGN §2).

Pod -> ReplicaSet -> Deployment, Pod -> Job -> CronJob, Pod -> PyTorchJob, Pod -> JobSet's Job
-> JobSet, and any CRD owner: the walk follows each object's controller reference until an
object has none. Where the walk cannot go on (RBAC forbids the `get`, the owner is gone), the
last reference reached is the workload: its kind, name and uid are in the child's
ownerReferences, only its creation time is unknown. A bare pod is its own workload.

Resolved owners are cached by uid, so the pods of one workload cost one walk in total.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gpuwm.accounting import parse_time
from gpuwm.model import TraceWorkload

logger = logging.getLogger(__name__)

#: (apiVersion, kind, namespace, name) -> the object, or None when it is gone or not readable
OwnerFetcher = Callable[[str, str, str, str], Awaitable[Mapping[str, Any] | None]]

MAX_OWNER_DEPTH = 8


def controller_reference(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference with `controller: true`, else the first complete one, else None."""
    references = [
        ref
        for ref in metadata.get("ownerReferences") or []
        if isinstance(ref, Mapping) and ref.get("kind") and ref.get("name") and ref.get("uid") and ref.get("apiVersion")
    ]
    for ref in references:
        if ref.get("controller"):
            return ref
    return references[0] if references else None


def workload_of_object(obj: Mapping[str, Any], api_version: str, kind: str) -> TraceWorkload:
    """The object itself as a workload (kind/apiVersion given: a Pod body may lack them)."""
    metadata = obj.get("metadata") or {}
    return TraceWorkload(
        api_version=str(obj.get("apiVersion") or api_version),
        kind=str(obj.get("kind") or kind),
        name=str(metadata["name"]),
        uid=str(metadata["uid"]),
        created=parse_time(metadata.get("creationTimestamp")),
    )


def workload_of_reference(ref: Mapping[str, Any]) -> TraceWorkload:
    """A workload known only from a child's ownerReference: no creation time."""
    return TraceWorkload(
        api_version=str(ref["apiVersion"]), kind=str(ref["kind"]), name=str(ref["name"]), uid=str(ref["uid"])
    )


class OwnerResolver:
    """Walks ownerReferences through `fetch`, caching each owner's resolved top-level workload."""

    def __init__(self, fetch: OwnerFetcher, cache_size: int = 50_000) -> None:
        self._fetch = fetch
        self._cache: OrderedDict[str, TraceWorkload] = OrderedDict()
        self._cache_size = cache_size
        self.fetches = 0

    def _remember(self, uid: str, workload: TraceWorkload) -> None:
        self._cache[uid] = workload
        self._cache.move_to_end(uid)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def forget(self, uid: str) -> None:
        """Drop a cached owner (it was deleted or its owners changed)."""
        self._cache.pop(uid, None)

    async def resolve(self, pod: Mapping[str, Any]) -> TraceWorkload:
        """The top-level workload of `pod` (the pod itself when it has no owner)."""
        metadata = pod.get("metadata") or {}
        namespace = str(metadata.get("namespace") or "")
        ref = controller_reference(metadata)
        if ref is None:
            return workload_of_object(pod, "v1", "Pod")
        visited: list[str] = []
        cacheable = True
        workload = workload_of_reference(ref)
        for _depth in range(MAX_OWNER_DEPTH):
            uid = str(ref["uid"])
            cached = self._cache.get(uid)
            if cached is not None:
                workload = cached
                break
            if uid in visited:  # a reference cycle: stop at the repeated owner
                break
            visited.append(uid)
            self.fetches += 1
            try:  # None when the owner is gone or RBAC forbids reading it: both final
                owner = await self._fetch(str(ref["apiVersion"]), str(ref["kind"]), namespace,
                                          str(ref["name"]))
            except Exception as error:  # network or API trouble: use the reference now, walk again next time
                logger.warning(
                    "cannot read owner %s %s/%s (%s); using it as the workload for now",
                    ref["kind"], namespace, ref["name"], error,
                    extra={"kind": ref["kind"], "namespace": namespace, "owner": ref["name"]},
                )
                owner, cacheable = None, False
            if owner is None or str((owner.get("metadata") or {}).get("uid")) != uid:
                workload = workload_of_reference(ref)  # gone, replaced, or not readable: stop here
                break
            workload = workload_of_object(owner, str(ref["apiVersion"]), str(ref["kind"]))
            next_ref = controller_reference(owner.get("metadata") or {})
            if next_ref is None:
                break
            ref = next_ref
        if cacheable:
            for uid in visited:
                self._remember(uid, workload)
        return workload
