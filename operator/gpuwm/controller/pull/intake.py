"""The intake: the samples of the agents' decoded snapshots into the engine, as the pull hands them over.

The puller (`gpuwm.controller.pull.agents`) fetches each agent's answer, the feed's decoder
(`gpuwm.feed.decode`) reads it into columns, and `SampleIntake.take` is handed each agent's
snapshot as it arrives: a sample's path through the controller visits each module once.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy

from gpuwm.accounting import Engine
from gpuwm.feed.decode import DeviceHolder, SampleColumns, Snapshot, join
from gpuwm.model import DeviceReading

__all__ = ["SampleIntake"]


class SampleIntake:
    """Feeds the agents' snapshots to the engine as they arrive (see `AgentPuller.pull_all`).

    Keeps what the rest of the cycle needs of the samples: each device's latest one (what the
    store's rows and the CR's `gpus[]` read), the newest sample time, and the nodes whose
    device holders changed. Samples of one agent go in time order; the engine places
    samples of different agents exactly whatever their order (within its late window).

    Snapshots' columns wait (as arrays, a fraction of a DeviceReading each) until `flush()` or until
    `FLUSH_ROWS` are waiting, and go to the engine as one batch: its vectorised path pays
    for its fixed cost over many agents, not per agent. The engine sees the same samples in
    the same order as one snapshot at a time. Call `flush()` once the pull is done.
    """

    #: a batch this long amortises numpy's fixed cost; a longer one raises the controller's peak memory by the
    #: engine's per-row intermediates at no saving of CPU
    FLUSH_ROWS = 5_000

    def __init__(self, engine: Engine, holders_by_node: dict[str, list[DeviceHolder]] | None = None) -> None:
        self.engine = engine
        self.holders_by_node = {} if holders_by_node is None else holders_by_node
        self.latest: dict[str, DeviceReading] = {}
        self.latest_time: float | None = None
        self.changed_nodes: set[str] = set()
        self.samples = 0
        self.cpu_seconds = 0.0
        self._waiting: list[SampleColumns] = []
        self._waiting_rows = 0

    def take(self, snapshot: Snapshot) -> None:
        started = time.thread_time()
        known_holders = self.holders_by_node.get(snapshot.node)
        if snapshot.holders is not known_holders:
            if snapshot.holders != known_holders:
                self.changed_nodes.add(snapshot.node)
            # kept even when equal: the puller hands back the same list while the agent's devices do not change,
            # so later pulls compare by identity. Restored holders (a restart) are equal, not the same: kept,
            # they cost a field-by-field comparison of every holder on every pull
            self.holders_by_node[snapshot.node] = snapshot.holders
        if snapshot.columns is not None and len(snapshot.columns):
            columns = snapshot.columns
            if not columns.in_time_order():  # an agent serves in seq order; the engine wants time order
                columns = columns.take(columns.time_order())
            self._waiting.append(columns)
            self._waiting_rows += len(columns)
            if self._waiting_rows >= self.FLUSH_ROWS:
                self._flush()
        self.cpu_seconds += time.thread_time() - started

    def flush(self) -> None:
        """Feed the engine what waits; the pull is over (or the next rows must go after these)."""
        started = time.thread_time()
        self._flush()
        self.cpu_seconds += time.thread_time() - started

    def _flush(self) -> None:
        if not self._waiting:
            return
        columns = join(self._waiting)
        self._waiting, self._waiting_rows = [], 0
        built: dict[int, DeviceReading] = {}

        def sample(row: int) -> DeviceReading:  # the engine and `latest` share one object per row
            found = built.get(row)
            if found is None:
                found = built[row] = columns.sample(row)
            return found

        identity = numpy.arange(len(columns), dtype=numpy.int64)
        uuids = [device.uuid for device in columns.devices]
        by_uuid = {uuid: position for position, uuid in enumerate(dict.fromkeys(uuids))}
        ids = numpy.array([by_uuid[uuid] for uuid in uuids], dtype=numpy.int64)[columns.gpu]
        # each device's latest: its latest time, of equal times the later row (as `t >= known.t` row by row);
        # built at once, before the engine asks for (mostly) the same rows
        ranked = numpy.lexsort((identity, columns.t, ids))
        last = ranked[numpy.flatnonzero(numpy.append(ids[ranked][1:] != ids[ranked][:-1], True))].tolist()
        built.update(zip(last, columns.samples(last), strict=True))
        batch = columns.batch(identity)
        self.engine.observe_samples(replace(batch, sample=sample))
        latest, ts = self.latest, batch.t
        for row in last:
            uuid = uuids[int(columns.gpu[row])]
            known = latest.get(uuid)
            if known is None or ts[row] >= known.t:
                latest[uuid] = sample(row)
        self.samples += len(ids)
        newest = float(columns.t.max())
        if self.latest_time is None or newest > self.latest_time:
            self.latest_time = newest
