"""The simulated cluster: workloads arrive, queue, run and end on a fleet that is sampled every interval.

Everything is drawn from one `random.Random(seed)` in a fixed order, so a seed gives the
same run, event for event. Each `step()` is one poll interval ending at `t`:

1. every device that can be read is sampled for (t - interval, t], with the utilisation
   of the pods that held it then (the ground truth ledger is told the true figures);
2. then the cluster changes at t: workloads end, are preempted, arrive (Pending, or
   Queued: a Kueue job created suspended, with no pods) and are placed (Running; a Kueue
   job admitted), each as a `PodEvent` describing the pod from t on and, for the kinds
   gpuwm watches, a `WorkloadEvent` describing the workload object from t on.

Faults: an agent outage (no samples from a node, the engine must count the time as
unmonitored) and a lost GPU (healthy=false, no utilisation, error "GPU is lost").
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gpuwm.model import (
    DeviceAllocation,
    GpuSample,
    NamespaceEvent,
    PodEvent,
    PodPhase,
    PodStatsSample,
    TraceWorkload,
    WorkloadEvent,
)
from gpuwm.sim.fleet import Device, Gpu, Node, NodeKind, build_fleet, node_names, random_uuid
from gpuwm.sim.scenario import AgentOutage, GpuLoss, SimConfig, default_faults
from gpuwm.sim.truth import GroundTruth, TruthFigures
from gpuwm.sim.workloads import ALL_NAMESPACES, SimWorkload, new_workload, pick_kind

__all__ = ["AgentOutage", "GpuLoss", "SimConfig", "Simulator", "Step", "default_faults", "faulted_simulator"]

#: how often queued workloads are offered to the scheduler (simulated seconds)
PLACEMENT_EVERY_SECONDS = 5.0
#: mean lifetime (capped at this) used to set the arrival rate for the occupancy target
_HORIZON_SECONDS = 2 * 3600.0
#: a running Kueue job is preempted about once in this much run time (a higher-priority job took its GPUs)
PREEMPT_EVERY_SECONDS = 4 * 3600.0
#: a job that Kueue never admits is deleted by its user this long after its creation
GIVE_UP_SECONDS = 90 * 60.0
#: a preempted job is not admitted again before this much later (Kueue's requeue backoff)
REQUEUE_BACKOFF_SECONDS = 60.0

_sample = GpuSample.model_validate  # validating a dict is faster than model_construct in pydantic 2


@dataclass
class Step:
    """One poll interval: the samples at `t`, then the cluster's changes at `t`."""

    t: float
    samples: list[GpuSample] = field(default_factory=list)
    events: list[NamespaceEvent | PodEvent | WorkloadEvent] = field(default_factory=list)
    pod_stats: list[PodStatsSample] = field(default_factory=list)


class Simulator:
    """A seeded cluster that produces the engine's inputs and knows the true figures."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.nodes: list[Node] = build_fleet(self.rng, config.nodes, config.gpus_per_node)
        self.node_by_name = {node.name: node for node in self.nodes}
        for fault_node in [fault.node for fault in config.outages] + [fault.node for fault in config.gpu_losses]:
            if fault_node not in self.node_by_name:
                raise ValueError(f"fault on unknown node {fault_node!r}; nodes are {self.nodes[0].name}..{self.nodes[-1].name}")
        self.kinds_available: set[NodeKind] = {node.kind for node in self.nodes}
        self.truth_ledger = GroundTruth(config.interval_seconds, config.idle_threshold_percent)
        self.workloads: dict[str, SimWorkload] = {}
        self.pending: list[SimWorkload] = []
        self.running: dict[str, SimWorkload] = {}
        self._pod_workload: dict[str, str] = {}  # pod uid -> workload uid, for pods holding devices
        self._memory_fraction: dict[str, float] = {}
        self._pod_pid: dict[str, int] = {}
        self.clock = config.start_time - config.interval_seconds  # the first step is at start_time
        self._steps = 0
        self._serial = 0
        self._free: dict[tuple[NodeKind, str | None], dict[str, list[Device]]] = {}
        for node in self.nodes:
            for gpu in node.gpus:
                for device in gpu.devices:
                    self._free.setdefault((node.kind, device.mig_profile), {}).setdefault(node.name, []).append(device)
        self.capacity_units = float(sum(len(node.gpus) for node in self.nodes))
        self._arrivals_per_second = config.occupancy * self.capacity_units / self._mean_unit_seconds()
        self._next_arrival = config.start_time + self.rng.expovariate(self._arrivals_per_second)
        self._placement_due = config.start_time
        self._next_pod_stats = config.start_time

    # --------------------------------------------------------------- arrivals

    def _mean_unit_seconds(self) -> float:
        """Mean GPU unit-seconds one arrival holds (within a horizon), from draws of a side RNG."""
        side = random.Random(self.config.seed ^ 0x5EED)
        total = 0.0
        draws = 400
        for serial in range(draws):
            workload = new_workload(side, "u", ["p", "p"], serial, 0.0, pick_kind(side), self.kinds_available,
                                    self.config.gpus_per_node)
            total += self._units_of(workload) * min(workload.duration_seconds, _HORIZON_SECONDS)
        return total / draws

    def _units_of(self, workload: SimWorkload) -> float:
        request = workload.request
        if request.node_kind == "whole":
            per_device = 1.0
        elif request.node_kind == "shared":
            per_device = 0.25
        else:
            per_device = {"1g.10gb": 1 / 7, "2g.20gb": 2 / 7, "3g.40gb": 3 / 7}.get(request.mig_profile or "", 1 / 7)
        return per_device * request.count * request.pods

    def _new_workload(self, created: float) -> SimWorkload:
        kind = pick_kind(self.rng)
        uid = random_uuid(self.rng)
        pod_uids = [random_uuid(self.rng) for _ in range(2)]
        workload = new_workload(self.rng, uid, pod_uids, self._serial, created, kind, self.kinds_available,
                                self.config.gpus_per_node)
        self._serial += 1
        nodes_of_kind = sum(1 for node in self.nodes if node.kind == workload.request.node_kind)
        if workload.request.pods > nodes_of_kind:  # a gang that could never be placed
            workload.request = dataclasses.replace(workload.request, pods=1)
            del workload.pods[1:]
        self.workloads[uid] = workload
        return workload

    # --------------------------------------------------------------- placement

    def _place(self, workload: SimWorkload, t: float) -> bool:
        """Gang-place every pod of `workload`, or none; first fit from a random node."""
        request = workload.request
        free = self._free.get((request.node_kind, request.mig_profile), {})
        chosen: list[tuple[str, list[Device]]] = []
        taken: set[int] = set()
        names = list(free)
        if not names:
            return False
        offset = self.rng.randrange(len(names))
        for _pod in workload.pods:
            found: tuple[str, list[Device]] | None = None
            for position in range(len(names)):
                node = names[(offset + position) % len(names)]
                devices = []
                gpus_used: set[int] = set()
                for device in free[node]:
                    if id(device) in taken or id(device.gpu) in gpus_used:
                        continue
                    devices.append(device)
                    gpus_used.add(id(device.gpu))  # replicas of one workload on distinct GPUs
                    if len(devices) == request.count:
                        break
                if len(devices) == request.count:
                    found = (node, devices)
                    break
            if found is None:
                return False
            chosen.append(found)
            taken.update(id(device) for device in found[1])
        for pod, (node, devices) in zip(workload.pods, chosen, strict=True):
            pod.node, pod.devices = node, devices
            for device in devices:
                free[node].remove(device)
                device.holder = pod.uid
                self.truth_ledger.allocate(device.sample_uuid, workload.uid, pod.uid, device.units, t)
                self._pod_workload[pod.uid] = workload.uid
                self._memory_fraction[pod.uid] = pod.memory_fraction
                self._pod_pid[pod.uid] = pod.pid
            if not free[node]:
                del free[node]
        workload.started = t
        workload.runs += 1
        self.running[workload.uid] = workload
        return True

    def _release(self, workload: SimWorkload, t: float) -> None:
        self.running.pop(workload.uid, None)
        for pod in workload.pods:
            for mapping in (self._pod_workload, self._memory_fraction, self._pod_pid):
                mapping.pop(pod.uid, None)
            for device in pod.devices:
                device.holder = None
                self.truth_ledger.release(device.sample_uuid, pod.uid, t)
                if not device.gpu.lost:
                    self._free.setdefault((device.gpu.kind, device.mig_profile), {}).setdefault(
                        device.gpu.node.name, []).append(device)

    # --------------------------------------------------------------- events

    def _pod_events(self, workload: SimWorkload, t: float, phase: PodPhase) -> list[PodEvent]:
        """Each of the workload's pods from t on, in `phase`."""
        running = phase == "Running"
        return [PodEvent(
            t=t, event="pod", namespace=workload.namespace, name=pod.name, uid=pod.uid,
            phase=phase,
            node=pod.node if phase != "Pending" else None, labels=workload.labels,
            workload=TraceWorkload(api_version=workload.api_version, kind=workload.owner_kind, name=workload.name,
                                   uid=workload.uid, created=workload.created),
            devices=[DeviceAllocation(uuid=device.uuid, units=device.units, container="main")
                     for device in pod.devices] if running else [],
        ) for pod in workload.pods]

    def _workload_event(self, workload: SimWorkload, t: float, **state: object) -> list[WorkloadEvent]:
        """The workload object's state from t on (none for a kind gpuwm does not watch)."""
        if not workload.watched:
            return []
        return [WorkloadEvent.model_validate({
            "t": t, "event": "workload", "namespace": workload.namespace, "name": workload.name, "uid": workload.uid,
            "kind": workload.owner_kind, "apiVersion": workload.api_version, "created": workload.created,
            "suspended": workload.suspended, "requested_gpus": self._units_of(workload), "labels": workload.labels,
            "local_queue": workload.local_queue, "cluster_queue": workload.cluster_queue, **state,
        })]

    def _created(self, workload: SimWorkload) -> None:
        self.truth_ledger.created(workload.uid, workload.created,
                                  self._units_of(workload) if workload.watched else None, workload.suspended)

    def _admit(self, workload: SimWorkload, t: float, step: Step) -> bool:
        """Place it (Kueue admits a suspended job as it places it); its events at t."""
        if not workload.admissible or t < workload.requeue_at or not self._place(workload, t):
            return False
        self.truth_ledger.admitted(workload.uid, t)
        self.truth_ledger.run_started(workload.uid, t)
        if workload.suspended:
            workload.suspended = False
            step.events.extend(self._workload_event(workload, t))
        step.events.extend(self._pod_events(workload, t, "Running"))
        return True

    def _preempt(self, workload: SimWorkload, t: float, step: Step) -> None:
        """Kueue suspends a running job: its pods are deleted, it queues again with new pods to come."""
        workload.suspended = True
        workload.preemptions += 1
        step.events.extend(self._workload_event(workload, t))
        self.truth_ledger.held(workload.uid, t)
        self.truth_ledger.run_ended(workload.uid, t)
        assert workload.started is not None
        workload.ran_seconds += t - workload.started
        self._release(workload, t)
        step.events.extend(self._pod_events(workload, t, "Deleted"))
        workload.started = None
        for pod in workload.pods:  # the job's controller makes new pods once it is admitted again
            pod.uid, pod.devices, pod.node = random_uuid(self.rng), [], None
        workload.requeue_at = t + REQUEUE_BACKOFF_SECONDS
        self.pending.append(workload)
        self._placement_due = min(self._placement_due, t)

    def _lifecycle(self, t: float, step: Step) -> None:
        if self._steps == 0:
            self._fill(t, step)
        self._finish_runs(t, step)
        for workload in list(self.running.values()):
            if workload.local_queue is not None and workload.started is not None and workload.started < t and self.rng.random() < self.config.interval_seconds / PREEMPT_EVERY_SECONDS:
                self._preempt(workload, t, step)
        for workload in self.pending:
            if not workload.admissible and t >= workload.created + GIVE_UP_SECONDS:  # its user deletes it
                workload.ended = t
                self.truth_ledger.ended(workload.uid, t)
                step.events.extend(self._workload_event(workload, t, deleted=True))
        self.pending = [workload for workload in self.pending if workload.ended is None]
        self._arrivals(t, step)
        if t >= self._placement_due and self.pending:
            self.pending = [workload for workload in self.pending if not self._admit(workload, t, step)]
            self._placement_due = t + PLACEMENT_EVERY_SECONDS

    def _fill(self, t: float, step: Step) -> None:
        """The first step: the namespaces, and workloads running (or queued) since before the run, up to the occupancy."""
        quota = {"gpuwm.io/gpu-quota": str(max(1, int(self.capacity_units // 4)))}
        step.events.extend(NamespaceEvent(t=t, event="namespace", name=name,
                                          labels={"gpuwm.io/project": project} if project else {},
                                          annotations=quota if project == "research" else {})
                           for name, project in ALL_NAMESPACES)
        held, misses = 0.0, 0
        while held < self.config.occupancy * self.capacity_units and misses < 20:
            workload = self._new_workload(t - self.rng.uniform(5.0, 300.0))
            workload.duration_seconds *= self.rng.uniform(0.1, 1.0)  # already part-way through
            if not workload.admissible:  # queued since before the run: it stays so
                self._created(workload)
                self.pending.append(workload)
                step.events.extend(self._workload_event(workload, t))
                continue
            workload.suspended = False  # admitted before the run began
            if not self._place(workload, t):
                del self.workloads[workload.uid]
                misses += 1
                continue
            self._created(workload)
            self.truth_ledger.run_started(workload.uid, t)
            held += self._units_of(workload)
            step.events.extend(self._workload_event(workload, t))
            step.events.extend(self._pod_events(workload, t, "Running"))

    def _finish_runs(self, t: float, step: Step) -> None:
        """Running workloads whose run is over end: training and batch pods succeed or fail, the others' go."""
        for workload in list(self.running.values()):
            if workload.started is not None and t >= workload.started + workload.duration_seconds - workload.ran_seconds:
                workload.ended = t
                self._release(workload, t)
                self.truth_ledger.ended(workload.uid, t)
                phase: PodPhase = "Deleted"  # a Deployment's or Notebook's pods go away
                if workload.kind in ("training", "batch"):
                    phase = "Failed" if workload.fails else "Succeeded"
                step.events.extend(self._pod_events(workload, t, phase))
                if phase == "Deleted":
                    step.events.extend(self._workload_event(workload, t, deleted=True))
                else:
                    step.events.extend(self._workload_event(workload, t, finished=phase))
                self._placement_due = min(self._placement_due, t)

    def _arrivals(self, t: float, step: Step) -> None:
        """New workloads up to `t`, at the arrival rate, while the queue is not too long."""
        while self._next_arrival <= t:
            if len(self.pending) >= max(20, 2 * len(self.nodes)):  # a queue this long: users submit elsewhere
                self._next_arrival += self.rng.expovariate(self._arrivals_per_second)
                continue
            workload = self._new_workload(t)
            self.pending.append(workload)
            self._created(workload)
            step.events.extend(self._workload_event(workload, t))
            if not workload.suspended:  # a suspended job has no pods until Kueue admits it
                step.events.extend(self._pod_events(workload, t, "Pending"))
            self._next_arrival += self.rng.expovariate(self._arrivals_per_second)
            self._placement_due = min(self._placement_due, t)

    # --------------------------------------------------------------- samples

    def _agent_down(self, node: Node, t: float) -> bool:
        return any(outage.node == node.name and outage.start <= t < outage.end for outage in self.config.outages)

    def _apply_losses(self, t: float) -> None:
        for loss in self.config.gpu_losses:
            node = self.node_by_name[loss.node]
            if loss.at <= t and loss.gpu_index < len(node.gpus) and not node.gpus[loss.gpu_index].lost:
                gpu = node.gpus[loss.gpu_index]
                gpu.lost = True
                for key, by_node in self._free.items():
                    if key[0] == node.kind and node.name in by_node:
                        by_node[node.name] = [d for d in by_node[node.name] if d.gpu is not gpu]
                        if not by_node[node.name]:
                            del by_node[node.name]

    def _sample_gpu(self, gpu: Gpu, t: float, readable: bool, step: Step) -> None:
        """Sample one physical GPU (and its MIG instances) for (t - dt, t]; advance its energy counter."""
        rng, product = self.rng, gpu.product
        holders: list[tuple[Device, SimWorkload, float]] = []  # device, workload, its utilisation of the device
        for device in gpu.devices:
            if device.holder is not None:
                workload = self.workloads[self._pod_workload[device.holder]]
                percent = workload.device_percent(rng) if gpu.kind != "shared" else workload.demand_percent
                holders.append((device, workload, percent))
        busy = sum(percent * device.units for device, _, percent in holders)
        if gpu.kind == "shared":
            busy = min(100.0, busy)
        memory_used = sum(device.memory_total_bytes * self._memory_fraction[device.holder or ""] for device, _, _ in holders)
        if gpu.kind == "shared":
            memory_used = min(memory_used / len(gpu.devices), product.memory_total_bytes)
        power = self._draw_power(gpu, holders, busy)
        if not readable:
            return
        identity: dict[str, Any] = {"t": t, "node": gpu.node.name, "index": gpu.index, "model": product.model}
        if gpu.lost:  # the GPU and, on a MIG GPU, each of its instances
            sampled: list[tuple[str, str | None, str | None, float]] = [(gpu.uuid, None, None, 1.0)]
            if gpu.kind == "mig":
                sampled += [(d.uuid, gpu.uuid, d.mig_profile, d.units) for d in gpu.devices]
            for uuid, parent_uuid, profile, units in sampled:
                step.samples.append(_sample({
                    **identity, "uuid": uuid, "parent_uuid": parent_uuid, "mig_profile": profile,
                    "device_units": units, "healthy": False, "error": "GPU is lost"}))
                self.truth_ledger.sample(uuid, t, None)
            return
        # chip-wide figures; a MIG instance carries its parent's energy counter (NVML has none per instance)
        chip: dict[str, Any] = {
            "energy_joules": gpu.energy_joules,
            "temperature_celsius": round(28.0 + 52.0 * power / product.power_limit_watts, 1),
        }
        processes: list[dict[str, Any]] | None = None
        if gpu.kind == "mig":
            self._sample_instances(gpu, holders, {**identity, **chip}, step)
        elif gpu.kind == "shared":
            processes = self._shared_processes(holders)
        seen_by_pod = None if processes is None else {process["pod_uid"]: process["sm_percent"] for process in processes}
        if gpu.node.hides_processes:
            processes, seen_by_pod = [], {}
        step.samples.append(_sample({
            **identity, **chip, "uuid": gpu.uuid, "device_units": 1.0, "healthy": True, "sm_percent": round(busy, 2),
            "memory_used_bytes": float(int(memory_used)), "memory_total_bytes": product.memory_total_bytes,
            "memory_activity_percent": round(0.6 * busy, 1), "power_watts": power,
            "power_limit_watts": product.power_limit_watts,
            "sm_clock_mhz": product.max_sm_clock_mhz if busy > 0.0 else product.idle_sm_clock_mhz,
            "memory_clock_mhz": product.memory_clock_mhz,
            "pcie_rx_bytes_per_second": float(int(busy * 4.0e7)), "pcie_tx_bytes_per_second": float(int(busy * 1.0e7)),
            "processes": processes}))
        if gpu.kind != "mig":
            self.truth_ledger.sample(gpu.uuid, t, round(busy, 2), 1.0, seen_by_pod)

    def _draw_power(self, gpu: Gpu, holders: list[tuple[Device, SimWorkload, float]], busy: float) -> float:
        """The GPU's power over the step (0 once lost), added to its energy counter and to its holders' truth."""
        if gpu.lost:
            return 0.0
        product, dt = gpu.product, self.config.interval_seconds
        held = 1.0 if holders else 0.0
        power = product.idle_power_watts + (product.power_limit_watts - product.idle_power_watts) * (
            0.08 * held + 0.85 * busy / 100.0)
        power = round(min(product.power_limit_watts, max(0.0, power + self.rng.gauss(0.0, 0.01 * product.power_limit_watts))), 1)
        gpu.energy_joules += power * dt
        for device, workload, _ in holders:
            self.truth_ledger.add_energy(workload.uid, power * dt * device.units)
        return power

    def _sample_instances(
        self, gpu: Gpu, holders: list[tuple[Device, SimWorkload, float]], chip: dict[str, Any], step: Step,
    ) -> None:
        """A MIG GPU's instances, each with its holder's utilisation and the chip's figures."""
        for device in gpu.devices:
            percent = next((p for d, _, p in holders if d is device), 0.0)
            used = device.memory_total_bytes * self._memory_fraction[device.holder] if device.holder else 0.0
            step.samples.append(_sample({
                **chip, "uuid": device.uuid, "parent_uuid": gpu.uuid, "mig_profile": device.mig_profile,
                "device_units": device.units, "healthy": True, "sm_percent": percent,
                "memory_used_bytes": float(int(used)), "memory_total_bytes": device.memory_total_bytes,
                "memory_activity_percent": round(0.6 * percent, 1),
                **({"processes": []} if gpu.node.hides_processes else {})}))
            self.truth_ledger.sample(device.uuid, chip["t"], percent, device.units,
                                     {} if gpu.node.hides_processes else None)

    def _shared_processes(self, holders: list[tuple[Device, SimWorkload, float]]) -> list[dict[str, Any]]:
        """A time-sliced GPU's processes, one per holder, with the holder's SM % of the device."""
        processes = []
        for device, _, percent in holders:
            pod = device.holder or ""
            processes.append({
                "pid": self._pod_pid[pod], "pod_uid": pod, "container": "main",
                "sm_percent": percent * device.units,  # percent of the device; exact for 1/4 shares
                "memory_used_bytes": float(int(device.memory_total_bytes * self._memory_fraction[pod] * device.units)),
            })
        return processes

    def _pod_stats(self, t: float, step: Step) -> None:
        rng = self.rng
        for workload in self.running.values():
            for pod in workload.pods:
                load = workload.demand_percent / 100.0
                step.pod_stats.append(PodStatsSample(
                    t=t, node=pod.node or "", namespace=workload.namespace, pod=pod.name, pod_uid=pod.uid,
                    cpu_usage_cores=round(pod.cpu_cores * (0.15 + 0.85 * load) * rng.uniform(0.9, 1.1), 3),
                    memory_used_bytes=float(int(pod.cpu_cores * 4.0e9 * (0.5 + 0.5 * pod.memory_fraction))),
                    network_rx_bytes_per_second=float(int(load * 2.0e8 * rng.uniform(0.8, 1.2))),
                    network_tx_bytes_per_second=float(int(load * 5.0e7 * rng.uniform(0.8, 1.2))),
                    ephemeral_storage_used_bytes=float(int(2.0e9 + pod.memory_fraction * 1.0e10)),
                ))

    # --------------------------------------------------------------- running

    def step(self) -> Step:
        """Advance one poll interval and return what happened in it."""
        t = self.config.start_time + self._steps * self.config.interval_seconds
        step = Step(t=t)
        self._apply_losses(t)
        for workload in self.running.values():
            workload.step_demand(t, self.config.interval_seconds, self.rng)
        for node in self.nodes:
            readable = not self._agent_down(node, t)
            for gpu in node.gpus:
                self._sample_gpu(gpu, t, readable, step)
        self._lifecycle(t, step)
        if t >= self._next_pod_stats:
            self._pod_stats(t, step)
            self._next_pod_stats = t + self.config.pod_stats_interval_seconds
        self._steps += 1
        self.clock = t
        return step

    def run(self, until: float) -> Iterator[Step]:
        """Steps up to and including time `until`."""
        while self.config.start_time + self._steps * self.config.interval_seconds <= until + 1e-9:
            yield self.step()

    def truth(self) -> dict[str, TruthFigures]:
        """Per workload uid, the GPU-seconds generated up to the latest step."""
        return self.truth_ledger.finish(self.clock)


def faulted_simulator(
    seed: int, nodes: int, gpus_per_node: int, interval_seconds: float, start_time: float,
    idle_threshold_percent: float, faults_within: float | None,
) -> Simulator:
    """`gpuwm demo`'s simulator, with `default_faults` within `faults_within` seconds of the start (None: none)."""
    outages, losses = (default_faults(node_names(nodes), start_time, faults_within) if faults_within is not None
                       else ((), ()))
    return Simulator(SimConfig(
        seed=seed, nodes=nodes, gpus_per_node=gpus_per_node, interval_seconds=interval_seconds, start_time=start_time,
        idle_threshold_percent=idle_threshold_percent, outages=outages, gpu_losses=losses,
    ))
