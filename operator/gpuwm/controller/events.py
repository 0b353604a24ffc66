"""Kubernetes Events on a workload when it turns Idle (DESIGN §4, issue 4 item 5).

Posted from a queue through the status writes' token bucket, so thousands of workloads going
idle at once (a cluster-wide outage of jobs' input data, say) cannot flood the API server.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from collections.abc import Callable

from gpuwm.controller.kube import KubeApiError, KubeClient, resource_path
from gpuwm.controller.ratelimit import TokenBucket
from gpuwm.controller.status import rfc3339
from gpuwm.model.figures import WorkloadFigures

logger = logging.getLogger(__name__)

COMPONENT = "gpuwm-controller"


def idle_event_body(figures: WorkloadFigures, message: str, now: float) -> dict[str, object]:
    """A core/v1 Event on the workload (legacy form: no eventTime, namespace = the object's)."""
    stamp = rfc3339(now)
    return {
        "metadata": {"generateName": f"{figures.name}.", "namespace": figures.namespace},
        "involvedObject": {"apiVersion": figures.api_version, "kind": figures.kind, "name": figures.name,
                           "namespace": figures.namespace, "uid": figures.uid},
        "reason": "GpuIdle", "message": message, "type": "Warning", "count": 1,
        "firstTimestamp": stamp, "lastTimestamp": stamp,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT, "reportingInstance": socket.gethostname(),
    }


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
        self.posted = 0

    def announce(self, workloads: list[WorkloadFigures]) -> None:
        """Queue an Event for each workload idle longer than the threshold that was not idle before."""
        for figures in workloads:
            idle = (figures.phase == "Running" and figures.allocated_gpus > 0
                    and figures.idle_seconds >= self._idle_after)
            if not idle:
                self.announced.discard(figures.uid)
                continue
            if figures.uid in self.announced:
                continue
            self.announced.add(figures.uid)
            self._queue.append((figures, f"{figures.allocated_gpus:g} GPU(s) idle for {figures.idle_seconds:.0f}s "
                                         f"(threshold {self._idle_after:.0f}s)"))
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
                self.posted += 1
            except KubeApiError as error:
                logger.warning("cannot post the GpuIdle event on %s %s/%s: %s", figures.kind, figures.namespace,
                               figures.name, error)
