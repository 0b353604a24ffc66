"""Kubernetes Events on a workload when it turns Idle (DESIGN §4).

Posted from a queue through the status writes' token bucket, so thousands of workloads going
idle at once (a cluster-wide outage of jobs' input data, say) cannot flood the API server.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpuwm.controller.kube import KubeApiError, KubeClient, TokenBucket, resource_path
from gpuwm.controller.status.build import rfc3339
from gpuwm.model import WorkloadFigures

logger = logging.getLogger(__name__)

COMPONENT = "gpuwm-controller"
#: the API server's limits on an Event with eventTime: message (note) 1 KiB; names are made from
#: at most 58 characters of generateName anyway
MAX_MESSAGE = 1024
MAX_NAME_PREFIX = 57


def micro_time(epoch_seconds: float) -> str:
    """A MicroTime as the API server decodes it: exactly six fractional digits (`...05.000000Z`)."""
    return datetime.fromtimestamp(epoch_seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(involved: Mapping[str, Any], reason: str, message: str, now: float,
               action: str) -> dict[str, Any]:
    """A core/v1 Warning Event about `involved`, in the form with eventTime; one about a cluster-scoped
    object (a ClusterGPUIdlePolicy) goes to the namespace `default`, where kubectl looks for it.

    With eventTime set the API server requires reportingComponent (a qualified name),
    reportingInstance and action (<= 128 characters) and a message of at most 1 KiB; the
    Event then reads the same through events.k8s.io/v1, whose clients need eventTime. The
    legacy first/lastTimestamp and count stay for older tools (`kubectl get events`).
    """
    stamp = rfc3339(now)
    name = str(involved.get("name") or "gpuwm")
    return {
        "metadata": {"generateName": f"{name[:MAX_NAME_PREFIX]}.",
                     "namespace": involved.get("namespace") or "default"},
        "involvedObject": dict(involved), "reason": reason, "message": message[:MAX_MESSAGE],
        "type": "Warning", "action": action, "eventTime": micro_time(now),
        "count": 1, "firstTimestamp": stamp, "lastTimestamp": stamp, "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT, "reportingInstance": (socket.gethostname() or COMPONENT)[:128],
    }


def idle_event_body(figures: WorkloadFigures, message: str, now: float) -> dict[str, Any]:
    """The GpuIdle Event on the workload."""
    involved = {"apiVersion": figures.api_version, "kind": figures.kind, "name": figures.name,
                "namespace": figures.namespace, "uid": figures.uid}
    return event_body(involved, "GpuIdle", message, now, "Observe")


class IdleEvents:
    """Decides which workloads just turned Idle and posts one Event for each idle spell."""

    def __init__(self, client: KubeClient, bucket: TokenBucket, idle_after_seconds: float,
                 clock: Callable[[], float]) -> None:
        self._client = client
        self._bucket = bucket
        self._idle_after = idle_after_seconds
        self._clock = clock
        self._queue: collections.deque[tuple[WorkloadFigures, str]] = collections.deque()
        self._waiting = asyncio.Event()
        self.announced: set[str] = set()

    def announce(self, workloads: list[WorkloadFigures], idle: Mapping[str, str]) -> None:
        """Queue an Event for each workload whose Idle condition turned True (`idle`: uid -> its status).

        The Idle condition (`idleness.idle_condition`: observed idle time only) is the one judge of
        idleness, so an Event never says more than the CR does. While it is Unknown (its agent not
        reporting) a spell already announced stays announced: an outage makes no second Event.
        """
        for figures in workloads:
            status = idle.get(figures.uid, "False")
            if status == "False":
                self.announced.discard(figures.uid)
                continue
            if status != "True" or figures.uid in self.announced:
                continue
            self.announced.add(figures.uid)
            self._queue.append((figures, f"{figures.allocated_gpus:g} GPU(s) idle for {figures.idle_seconds:.0f}s, "
                                         f"observed idle for at least the {self._idle_after:.0f}s timeout"))
            self._waiting.set()

    async def run(self) -> None:
        """Post queued Events forever, one token each."""
        while True:
            if not self._queue:
                self._waiting.clear()
                await self._waiting.wait()
                continue
            figures, message = self._queue.popleft()
            await self._bucket.acquire()
            try:
                await self._client.create(resource_path("v1", "events", figures.namespace),
                                          idle_event_body(figures, message, self._clock()))
            except KubeApiError as error:
                logger.warning("cannot post the GpuIdle event on %s %s/%s: %s", figures.kind, figures.namespace,
                               figures.name, error)
