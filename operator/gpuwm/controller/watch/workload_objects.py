"""Workload objects -> the engine's `WorkloadEvent`s independent of kopf.

The handlers hand every event of a watched kind here. A top-level object whose pod templates
request GPUs becomes a workload from its creation: the engine is told its state (held back or
not, requested GPU units, finished, its Kueue queues) whenever that state changes, not on every
resync, and `deleted` when it goes. A Kueue Workload changes the state of the object it belongs
to; it is never a workload of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

from gpuwm.accounting import parse_time
from gpuwm.controller.watch.workload_kinds import (
    KUEUE_GROUP,
    KUEUE_QUEUE_LABEL,
    KUEUE_WORKLOAD_KIND,
    KueueState,
    asks_for_gpus,
    failure_message,
    is_top_level,
    kueue_state,
    reader_of,
    requested_gpus,
)
from gpuwm.model import WorkloadEvent

logger = logging.getLogger(__name__)


class WorkloadSink(Protocol):
    def observe_workload(self, event: WorkloadEvent) -> None: ...


class QueuedBy(NamedTuple):
    """A Kueue Workload (its uid) and its state, for the workload object it queues."""

    uid: str
    state: KueueState


class WorkloadObjects:
    """The watched workload objects' last state sent to the engine, and the Kueue Workloads' queue states."""

    def __init__(self, engine: Callable[[], WorkloadSink], clock: Callable[[], float],
                 resource_patterns: Iterable[str], shared_replicas: int = 4) -> None:
        self._engine = engine
        self._clock = clock
        self._patterns = list(resource_patterns)
        self._shared_replicas = shared_replicas
        #: uid -> the object's body fields the engine's event is built from (kept to re-send on a Kueue change)
        self._objects: dict[str, Mapping[str, Any]] = {}
        #: uid -> what the engine was last told (the event without its time)
        self._sent: dict[str, tuple[Any, ...]] = {}
        #: owner uid -> the Kueue Workload that queues it
        self._kueue: dict[str, QueuedBy] = {}
        self._warned: set[str] = set()

    @property
    def watched(self) -> int:
        """How many workload objects the engine hears of."""
        return len(self._objects)

    def on_object(self, body: Mapping[str, Any], deleted: bool = False) -> WorkloadEvent | None:
        """An event of a watched object; returns what the engine was sent (None: nothing new, or not a workload)."""
        api_version = str(body.get("apiVersion") or "")
        kind = str(body.get("kind") or "")
        if api_version.rpartition("/")[0] == KUEUE_GROUP and kind == KUEUE_WORKLOAD_KIND:
            return self._on_kueue_workload(body, deleted)
        metadata = body.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        if not uid or not metadata.get("name") or not metadata.get("namespace"):
            return None
        # a workload once is one until it goes: an edit that drops its GPU request is sent (0 requested)
        if uid not in self._objects and (
                deleted or not is_top_level(body) or not asks_for_gpus(body, kind, self._patterns)):
            return None
        self._objects[uid] = body
        event = self._event(body, deleted)
        if deleted:
            self._objects.pop(uid, None)
            self._sent.pop(uid, None)
            self._kueue.pop(uid, None)
            self._engine().observe_workload(event)
            return event
        return self._send(event)

    def _on_kueue_workload(self, body: Mapping[str, Any], deleted: bool) -> WorkloadEvent | None:
        uid = str((body.get("metadata") or {}).get("uid") or "")
        state = kueue_state(body)
        if state is None:
            return None
        if deleted:
            held = self._kueue.get(state.owner_uid)
            if held is None or held.uid != uid:
                return None  # an older Kueue Workload of the owner; its newer one speaks for it
            if state.owner_uid not in self._objects:
                del self._kueue[state.owner_uid]
                return None
            # finished or taken off the queue: it holds nothing back now, and its queues stay the workload's
            self._kueue[state.owner_uid] = QueuedBy(uid, replace(held.state, admitted=True))
        else:
            self._kueue[state.owner_uid] = QueuedBy(uid, state)
        owner = self._objects.get(state.owner_uid)
        return None if owner is None else self._send(self._event(owner, False))

    def _send(self, event: WorkloadEvent) -> WorkloadEvent | None:
        key = _key(event)
        if self._sent.get(event.uid) == key:
            return None  # a resync, or a change of nothing the engine reads
        self._sent[event.uid] = key
        self._engine().observe_workload(event)
        return event

    def _event(self, body: Mapping[str, Any], deleted: bool) -> WorkloadEvent:
        metadata = body.get("metadata") or {}
        uid, kind = str(metadata["uid"]), str(body.get("kind") or "")
        reader = reader_of(kind)
        try:
            requested = requested_gpus(body, kind, self._patterns, self._shared_replicas)
        except ValueError as error:
            self._warn_once(uid, f"{kind} {metadata.get('namespace')}/{metadata.get('name')}: {error}; "
                                 "its requested GPUs are read as 0")
            requested = 0.0
        labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}
        held = self._kueue.get(uid)
        kueue = held.state if held is not None else None
        suspended = reader.suspended(body) or (kueue is not None and not kueue.admitted)
        local_queue = (kueue.local_queue if kueue is not None else None) or labels.get(KUEUE_QUEUE_LABEL)
        return WorkloadEvent(
            t=self._clock(), event="workload", namespace=str(metadata["namespace"]), name=str(metadata["name"]),
            uid=uid, kind=kind, api_version=str(body.get("apiVersion") or ""),
            created=parse_time(metadata.get("creationTimestamp")),
            suspended=suspended, requested_gpus=requested, finished=reader.finished(body), deleted=deleted,
            message=failure_message(body),
            labels=labels, local_queue=local_queue,
            cluster_queue=kueue.cluster_queue if kueue is not None else None,
        )

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, extra={"object": key})


def _key(event: WorkloadEvent) -> tuple[Any, ...]:
    """Everything the engine reads of the event but its time."""
    return (event.namespace, event.name, event.kind, event.api_version, event.created, event.suspended,
            event.requested_gpus, event.finished, event.deleted, tuple(sorted(event.labels.items())),
            event.local_queue, event.cluster_queue, event.message)
