"""Which controller replica leads: kopf's peering object, read and written the way kopf does.

kopf's peering (kopf's docs, "Peering") is the controller's high availability: every replica keeps a
record `{priority, lifetime, lastseen}` under its identity in the status of one ClusterKopfPeering
(KopfPeering with `--namespace`), and a replica pauses while a live record of another one has a
higher or the same priority. Replicas with one priority all pause, so each replica needs its own:
`replica_priority` derives it from the process's start, so the longest-running replica leads and a
new or restarted one never takes over from a leader that is still alive.

kopf decides only whether its watches run; the status cycle, the state restore and the API's
routing are gpuwm's, so the controller applies kopf's rule to the same records itself (`rivals`):
a replica waits until no live record outranks its own before it restores the state and starts
kopf's watches, and steps down when one appears. A record is live until `lastseen + lifetime`;
kopf writes its record again every `lifetime` less 5-10 s and removes it when it stops cleanly,
so a replica that dies without a word is replaced after at most one lifetime.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwm.controller.kube.client import KubeApiError, KubeClient

logger = logging.getLogger(__name__)

#: the label the leading replica puts on its own pod: the metrics API's Service selects it
LEADER_LABEL = "gpuwm.io/leader"


def replica_priority(started_at_seconds: float) -> int:
    """A priority that ranks replicas by their start, the earliest highest: minus the start in microseconds,
    so a priority given by hand (`--peering-priority 666`, kopf's `--dev`) outranks every derived one."""
    return -int(started_at_seconds * 1_000_000)


@dataclass(frozen=True)
class Replica:
    """Who this process is among the controller's replicas, in kopf's peering."""

    #: its record's key: the pod's name in a cluster (POD_NAME, the chart's downward API), else host and process
    identity: str
    priority: int
    #: how long its record stays live without being written again
    lifetime_seconds: int


def this_replica(priority: int | None, status_interval_seconds: float,
                 environ: Mapping[str, str] | None = None) -> Replica:
    """This process's identity, its priority (`priority`, else `replica_priority` of now) and its record's lifetime:
    a status interval, at least 10 s (kopf writes a record again every lifetime less 5-10 s), so a leader that
    dies without removing its record is replaced within about one status interval."""
    environ = os.environ if environ is None else environ
    identity = environ.get("POD_NAME", "").strip() or f"{socket.gethostname()}/{os.getpid()}"
    return Replica(identity=identity, priority=replica_priority(time.time()) if priority is None else priority,
                   lifetime_seconds=max(10, math.ceil(status_interval_seconds)))


@dataclass(frozen=True)
class PeerRecord:
    """One replica's record in the peering object."""

    identity: str
    priority: int
    #: epoch seconds after which the record is stale (its replica presumed dead)
    deadline: float


def peer_records(peering: Mapping[str, Any]) -> list[PeerRecord]:
    """The records in a peering object's status; malformed ones are skipped (not ours to judge)."""
    records = []
    for identity, record in (peering.get("status") or {}).items():
        if not isinstance(record, Mapping):
            continue
        try:
            seen = datetime.datetime.fromisoformat(str(record["lastseen"]))
            if seen.tzinfo is None:
                seen = seen.replace(tzinfo=datetime.UTC)
            records.append(PeerRecord(identity=str(identity), priority=int(record.get("priority", 0)),
                                      deadline=seen.timestamp() + float(record.get("lifetime", 60))))
        except (KeyError, TypeError, ValueError):
            continue
    return records


def rivals(records: list[PeerRecord], identity: str, priority: int, now: float) -> list[PeerRecord]:
    """The live records of other replicas with a priority at or above `priority`: kopf pauses for each of them."""
    return [record for record in records
            if record.identity != identity and record.deadline > now and record.priority >= priority]


class Peering:
    """This replica's view of the peering object: its own record written, the others' read."""

    def __init__(self, client: KubeClient, *, name: str, namespace: str | None, replica: Replica,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.identity = replica.identity
        self.priority = replica.priority
        self.lifetime_seconds = replica.lifetime_seconds
        self.clock = clock
        self.path = (f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/{name}" if namespace
                     else f"/apis/kopf.dev/v1/clusterkopfpeerings/{name}")

    async def announce(self, lifetime_seconds: int | None = None) -> bool:
        """Write this replica's record (lifetime 0 removes it, as kopf does at exit); False: no peering object."""
        lifetime = self.lifetime_seconds if lifetime_seconds is None else lifetime_seconds
        seen = datetime.datetime.fromtimestamp(self.clock(), datetime.UTC).isoformat()
        record = {"priority": self.priority, "lifetime": lifetime, "lastseen": seen} if lifetime > 0 else None
        try:
            await self.client.merge_patch(self.path, {"status": {self.identity: record}})
        except KubeApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def outranking(self) -> list[PeerRecord] | None:
        """The live records that outrank this replica's priority; None when there is no peering object."""
        peering = await self.client.get(self.path)
        if peering is None:
            return None
        return rivals(peer_records(peering), self.identity, self.priority, self.clock())


async def label_own_pod(client: KubeClient, namespace: str, pod: str, leading: bool) -> None:
    """Put the leader label on this replica's pod, or take it off; a failure is logged (the API is not routed)."""
    try:
        await client.merge_patch(f"/api/v1/namespaces/{namespace}/pods/{pod}",
                                 {"metadata": {"labels": {LEADER_LABEL: "true" if leading else None}}})
    except KubeApiError as error:
        logger.warning("cannot %s the label %s on pod %s/%s (%s): the metrics API's Service routes to the leading "
                       "replica by it (the chart's Role grants patch on pods)",
                       "set" if leading else "remove", LEADER_LABEL, namespace, pod, error)


async def wait_to_lead(peering: Peering, *, poll_seconds: float, announce_wait_seconds: float = 3.0) -> None:
    """Return once no live record outranks this replica's: at once without a peering object (kopf then runs alone).

    The record is written first and the others read `announce_wait_seconds` later, so two replicas that
    start together both see each other before either decides. While waiting (a standby) the record is
    written again every half lifetime, so the peering object shows every replica.
    """
    if not await _announce(peering):
        logger.info("no peering object %s: this replica leads alone", peering.path)
        return
    try:
        await _wait_for_leaders(peering, poll_seconds, announce_wait_seconds)
    except asyncio.CancelledError:  # stopped as a standby: kopf never wrote this record, so it does not remove it
        with contextlib.suppress(Exception):
            await asyncio.shield(peering.announce(lifetime_seconds=0))
        raise


async def _wait_for_leaders(peering: Peering, poll_seconds: float, announce_wait_seconds: float) -> None:
    await asyncio.sleep(announce_wait_seconds)
    announced, waiting_for = peering.clock(), frozenset[str]()
    while True:
        try:
            outranking = await peering.outranking()
        except KubeApiError as error:
            logger.warning("cannot read the peering object %s (%s); asking again", peering.path, error)
            await asyncio.sleep(poll_seconds)
            continue
        if not outranking:
            return
        leaders = frozenset(record.identity for record in outranking)
        if leaders != waiting_for:
            waiting_for = leaders
            _log_standby(peering, outranking)
        await asyncio.sleep(poll_seconds)
        if peering.clock() - announced >= peering.lifetime_seconds / 2:
            await _announce(peering)
            announced = peering.clock()


async def hold_leadership(peering: Peering, *, check_seconds: float) -> list[PeerRecord]:
    """While this replica leads, read the peering object every `check_seconds`; return the records that
    outrank it once there are some (a replica given a higher priority, or one that shares this one's)."""
    while True:
        await asyncio.sleep(check_seconds)
        try:
            outranking = await peering.outranking()
        except KubeApiError as error:  # kopf's own keep-alives fail alike: the leader goes on
            logger.warning("cannot read the peering object %s (%s); still leading", peering.path, error)
            continue
        if outranking:
            return outranking


async def _announce(peering: Peering) -> bool:
    try:
        return await peering.announce()
    except KubeApiError as error:
        logger.warning("cannot write this replica's record in the peering object %s (%s)", peering.path, error)
        return True


def _log_standby(peering: Peering, outranking: list[PeerRecord]) -> None:
    tied = [record.identity for record in outranking if record.priority == peering.priority]
    if tied:
        logger.warning("replicas %s have this replica's peering priority %d: kopf pauses them all and none leads; "
                       "give each replica its own (leave peeringPriority unset)", tied, peering.priority)
        return
    logger.info("replica %s leads (priority %d); this one (%s, priority %d) waits as a standby",
                ", ".join(record.identity for record in outranking), max(r.priority for r in outranking),
                peering.identity, peering.priority)
