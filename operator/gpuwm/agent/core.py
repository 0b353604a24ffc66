"""The agent's poll loop and state: NVML samples, attribution, the snapshot buffer and counters.

One thread polls; HTTP handlers only read the state under a lock, so a scrape or a pull never
calls NVML, the kubelet or gRPC.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid as uuid_module
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, TypeAdapter

from gpuwm.agent.attribution import attribute
from gpuwm.agent.buffer import POD_STATS, SAMPLE, RecordBuffer
from gpuwm.agent.cgroup import CgroupReader
from gpuwm.agent.kubelet import KubeletStatsClient
from gpuwm.agent.nvml import NvmlSampler, NvmlUnavailable
from gpuwm.agent.podresources import PodResourcesClient
from gpuwm.agent.readings import Device, Reading
from gpuwm.config import Settings
from gpuwm.feed import AgentDevice, MergeRequest, answer_json
from gpuwm.model import GpuSample, PodStatsSample

log = logging.getLogger(__name__)

#: how often the agent tries NVML again after it found no driver
NVML_RETRY_SECONDS = 60.0
#: the kubelet computes stats every 10-15 s; reading it faster only costs CPU
KUBELET_STATS_PERIOD_SECONDS = 10.0
#: records per pull; a controller that was away longer pulls again while `more` is true
SNAPSHOT_LIMIT_RECORDS = 20_000
_DEVICES = TypeAdapter(list[AgentDevice])


@dataclass
class DeviceCounters:
    """Cumulative figures per device for the Prometheus counters."""

    active_seconds_total: float = 0.0
    #: samples of the busy device whose activity its holders' processes did not explain (DESIGN §3)
    unattributed_samples_total: int = 0
    last_sample_t: float | None = None
    last_active_t: float | None = None
    first_seen_t: float = 0.0


@dataclass
class AgentState:
    """What the HTTP side reads: the latest poll and the cumulative counters."""

    samples: list[GpuSample] = field(default_factory=list)
    devices: list[AgentDevice] = field(default_factory=list)
    pod_stats: list[PodStatsSample] = field(default_factory=list)
    counters: dict[str, DeviceCounters] = field(default_factory=dict)
    last_poll_seconds: float = 0.0
    last_poll_t: float | None = None
    polls_total: int = 0


class Agent:
    """Samples the node's GPUs every `settings.interval` seconds and keeps what the HTTP side serves."""

    def __init__(self, settings: Settings, node: str) -> None:
        self.settings = settings
        self.node = node
        self.agent_id = uuid_module.uuid4().hex
        self.sampler = NvmlSampler(node, settings.interval, buffer_read_seconds=settings.nvml_buffer_read_seconds)
        self.pod_resources = PodResourcesClient(settings.pod_resources_socket, list(settings.resource_names))
        self.cgroups = CgroupReader(settings.proc_root)
        self.kubelet = (
            KubeletStatsClient(settings.kubelet_url, node, settings.kubelet_token_file, settings.kubelet_insecure_tls)
            if settings.kubelet_url
            else None
        )
        self.nvml_ready = False
        self.nvml_error: str | None = "not started"
        self.state = AgentState()
        self.lock = threading.Lock()
        self._records = RecordBuffer(settings.snapshot_buffer_samples)
        self._nvml_tried_at = -float("inf")
        self._kubelet_read_at = -float("inf")
        self._known_uids: dict[tuple[str, str], str] = {}
        self._device_cache: dict[tuple[Any, ...], list[AgentDevice]] = {}
        self._last_sets: tuple[frozenset[str], frozenset[int]] = (frozenset(), frozenset())
        self._sets_changed = True
        self._holders_by_uuid: dict[str, frozenset[Any]] = {}

    # --- NVML lifecycle -------------------------------------------------------------------------

    def start_nvml(self) -> bool:
        """Initialise NVML; on failure log one clear line (not a traceback) and report not ready."""
        self._nvml_tried_at = time.monotonic()
        try:
            version = self.sampler.start()
        except NvmlUnavailable as error:
            if self.nvml_error != str(error):
                log.error("%s", error)
            self.nvml_ready, self.nvml_error = False, str(error)
            return False
        self.nvml_ready, self.nvml_error = True, None
        log.info(
            "NVML ready",
            extra={"driver_version": version, "devices": [d.uuid for d in self.sampler.devices], "node": self.node},
        )
        return True

    def stop(self) -> None:
        self.sampler.stop()
        self.pod_resources.close()

    # --- polling ----------------------------------------------------------------------------------

    def poll_once(self, read_buffers: bool = False) -> None:
        """One poll: NVML, attribution (pod-resources, cgroups), kubelet stats when due.

        The polls the sampler hands over at a read of the driver's buffers (`NvmlSampler.poll`) are
        attributed one at a time and recorded; `read_buffers` (`--once`) reads the buffers now.
        """
        retry_due = time.monotonic() - self._nvml_tried_at >= NVML_RETRY_SECONDS
        if not self.nvml_ready and not (retry_due and self.start_nvml()):
            return
        started = time.perf_counter()
        # before the poll, so that it knows each device's holders (a change the last poll saw lists again)
        self.pod_resources.refresh(self._sets_changed)
        self._holders_by_uuid = self._assigned_holders()
        result = self.sampler.poll(self._holders_of, read_buffers)
        device_set = frozenset(device.uuid for device in self.sampler.devices)
        self._sets_changed = (device_set, result.pids) != self._last_sets
        self._last_sets = (device_set, result.pids)
        pod_stats = self._read_kubelet()
        base_seq = self._records.latest_seq  # only this thread appends, so the numbers stay consecutive
        samples: list[GpuSample] = []
        unexplained: list[bool] = []
        devices: list[AgentDevice] | None = None
        for offset, reading in enumerate(result.samples, start=1):
            reading.fields["seq"] = base_seq + offset
        for poll in _polls(result.samples):
            attributed = attribute(
                poll,
                self.pod_resources.assignments,
                self.pod_resources.replicas,
                self.settings.time_sliced_replicas,
                self.cgroups.pod_of,
                self._known_uids,
                self.settings.idle_threshold_percent,
                self._device_cache,
            )
            samples.extend(attributed.samples)
            unexplained.extend(sample.uuid in attributed.unexplained for sample in attributed.samples)
            devices = attributed.devices
        if result.read_buffers:
            self.cgroups.retain(set(result.pids))  # PIDs no longer on a GPU: every reading naming them has left
        next_seq = base_seq + len(samples) + 1
        pod_stats = [stats.model_copy(update={"seq": next_seq + offset}) for offset, stats in enumerate(pod_stats)]
        records: list[tuple[bytes, BaseModel]] = [(SAMPLE, sample) for sample in samples]
        records += [(POD_STATS, stats) for stats in pod_stats]
        with self.lock:
            self._records.append(records)
            for sample, flag in zip(samples, unexplained, strict=True):
                self._count(sample, flag)
            if samples:
                latest = {sample.uuid: sample for sample in samples}
                self.state.samples = [latest[uuid] for uuid in dict.fromkeys(s.uuid for s in samples)]
            if devices is not None:
                self.state.devices = devices
            if pod_stats:
                self.state.pod_stats = pod_stats
            self.state.polls_total += 1
            self.state.last_poll_t = time.time()
            self.state.last_poll_seconds = time.perf_counter() - started

    def _assigned_holders(self) -> dict[str, frozenset[Any]]:
        """The pods pod-resources names on each device, by UUID (a device plugin may name GPUs by index)."""
        holders: dict[str, set[Any]] = {}
        by_index = {str(d.index): d.uuid for d in self.sampler.devices if d.parent_uuid is None and d.index is not None}
        for assignment in self.pod_resources.assignments:
            uuid = by_index.get(assignment.uuid, assignment.uuid)
            holders.setdefault(uuid, set()).add((assignment.namespace, assignment.pod))
        return {uuid: frozenset(pods) for uuid, pods in holders.items()}

    def _holders_of(self, device: Device, pids: frozenset[int]) -> frozenset[Any]:
        """The pods holding `device` at this poll: pod-resources' assignments, else the pods its processes run in.

        Looking the PIDs up now also keeps their pods while they run: a poll's reading may leave the
        sampler after its processes ended (`CgroupReader` caches until `retain`).
        """
        pods = [self.cgroups.pod_of(pid) for pid in pids]
        assigned = self._holders_by_uuid.get(device.uuid)
        if assigned is not None:
            return assigned
        return frozenset(pod.pod_uid for pod in pods if pod is not None)

    def _read_kubelet(self) -> list[PodStatsSample]:
        if self.kubelet is None:
            return []
        if time.monotonic() - self._kubelet_read_at < max(KUBELET_STATS_PERIOD_SECONDS, self.settings.interval):
            return []
        self._kubelet_read_at = time.monotonic()
        stats = self.kubelet.read(time.time())
        for pod in stats:
            self._known_uids[(pod.namespace, pod.pod)] = pod.pod_uid
        return stats

    def _count(self, sample: GpuSample, unexplained: bool) -> None:
        counters = self.state.counters.get(sample.uuid)
        if counters is None:
            counters = self.state.counters[sample.uuid] = DeviceCounters(first_seen_t=sample.t)
        if unexplained:
            counters.unattributed_samples_total += 1
        previous = counters.last_sample_t
        counters.last_sample_t = sample.t
        if sample.sm_percent is None or sample.sm_percent < self.settings.idle_threshold_percent:
            return
        if previous is not None and sample.t - previous <= 3 * self.settings.interval:
            counters.active_seconds_total += sample.t - previous
        counters.last_active_t = sample.t

    def run(self, stop: threading.Event, after_first_poll: Callable[[], None] | None = None) -> None:
        """Poll at a fixed rate until `stop` is set; a poll that fails is logged and the loop goes on.
        `after_first_poll` runs once, when everything a poll loads lazily has been loaded."""
        interval = self.settings.interval
        next_t = time.monotonic()
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception:
                log.exception("poll failed; retrying next interval")
            if after_first_poll is not None:
                after_first_poll()
                after_first_poll = None
            next_t += interval
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (a slow kubelet or NVML call): skip, do not burst
                next_t = time.monotonic()
                delay = 0.0
            stop.wait(delay)

    # --- reads for HTTP -----------------------------------------------------------------------------

    def snapshot_json(self, since: int, limit: int = SNAPSHOT_LIMIT_RECORDS, columns: bool = False,
                      merge: MergeRequest | None = None, devices_tag: str | None = None) -> bytes:
        """`/v1/snapshot?since=SEQ` as JSON: records after `since` (at most `limit`) and the devices now.

        The records are read here; the answer is the feed's encoding (`gpuwm.feed.encode.answer_json`:
        rows by default, `columns` for the controller, `merge` and `devices_tag` as it says).
        """
        with self.lock:
            records = self._records.since(since, limit)
            devices = list(self.state.devices)
        head = {"node": self.node, "seq": records.last_seq, "agent_id": self.agent_id,
                "truncated": records.truncated, "more": records.more}
        return answer_json(head, records.samples, records.pod_stats, _DEVICES.dump_json(devices), columns=columns,
                           merge=merge, devices_tag=devices_tag)

    def readiness(self) -> tuple[bool, str]:
        """Ready once NVML works and a poll has completed."""
        if not self.nvml_ready:
            return False, self.nvml_error or "NVML not initialised"
        if self.state.last_poll_t is None:
            return False, "no poll completed yet"
        return True, "ok"

    def liveness(self) -> tuple[bool, str]:
        """Alive while the poll loop turns (without a driver it still turns, retrying NVML)."""
        last = self.state.last_poll_t
        if self.nvml_ready and last is not None and time.time() - last > max(30.0, 10 * self.settings.interval):
            return False, f"no poll for {time.time() - last:.0f}s"
        return True, "ok"


def _polls(readings: list[Reading]) -> list[list[Reading]]:
    """Readings in time order, grouped by poll (the same `t`)."""
    return [list(poll) for _, poll in itertools.groupby(readings, key=lambda reading: reading.fields["t"])]
