"""`/metrics`: one Collector that renders the agent's cached state (no NVML or gRPC call per scrape).

Labels are fixed and few: node, gpu, uuid, model, mig_profile, and namespace, pod, container of
the pod that holds the device (empty when none, or when several pods share it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwm.agent.core import Agent
from gpuwm.model import AgentDevice, GpuSample

GPU_LABELS = ["node", "gpu", "uuid", "model", "mig_profile", "namespace", "pod", "container"]
POD_LABELS = ["node", "namespace", "pod"]

#: (metric name without prefix, help, GpuSample attribute)
_GPU_GAUGES = [
    ("gpu_utilization_percent", "SM utilisation over the last poll interval.", "sm_percent"),
    ("gpu_memory_used_bytes", "Device memory used.", "memory_used_bytes"),
    ("gpu_memory_total_bytes", "Device memory total.", "memory_total_bytes"),
    ("gpu_memory_utilization_percent", "Device memory used as a percent of total.", "memory_percent"),
    ("gpu_memory_activity_percent", "Memory controller busy percent over the last interval.", "memory_activity_percent"),
    ("gpu_power_watts", "Power draw.", "power_watts"),
    ("gpu_power_limit_watts", "Enforced power limit.", "power_limit_watts"),
    ("gpu_temperature_celsius", "GPU temperature.", "temperature_celsius"),
    ("gpu_sm_clock_mhz", "SM clock.", "sm_clock_mhz"),
    ("gpu_memory_clock_mhz", "Memory clock.", "memory_clock_mhz"),
    ("gpu_pcie_rx_bytes_per_second", "PCIe receive throughput.", "pcie_rx_bytes_per_second"),
    ("gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput.", "pcie_tx_bytes_per_second"),
]
_POD_GAUGES = [
    ("cpu_usage_cores", "Pod CPU use, cores.", "cpu_usage_cores"),
    ("memory_used_bytes", "Pod working-set memory.", "memory_used_bytes"),
    ("network_rx_bytes_per_second", "Pod network receive rate.", "network_rx_bytes_per_second"),
    ("network_tx_bytes_per_second", "Pod network transmit rate.", "network_tx_bytes_per_second"),
    ("ephemeral_storage_used_bytes", "Pod ephemeral storage used.", "ephemeral_storage_used_bytes"),
]


def _holder(devices: list[AgentDevice]) -> tuple[str, str, str]:
    pods = {(d.namespace or "", d.pod or "", d.container or "") for d in devices if d.pod}
    return pods.pop() if len(pods) == 1 else ("", "", "")


def _gpu_labels(node: str, sample: GpuSample, holder: tuple[str, str, str]) -> list[str]:
    index = "" if sample.index is None else str(sample.index)
    return [node, index, sample.uuid, sample.model or "", sample.mig_profile or "", *holder]


class AgentCollector(Collector):
    """Renders the latest poll of an `Agent` as `gpuwm_*` families."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        agent = self.agent
        with agent.lock:
            samples = list(agent.state.samples)
            devices = list(agent.state.devices)
            pod_stats = list(agent.state.pod_stats)
            counters = {uuid: (c.active_seconds_total, c.last_active_t, c.first_seen_t)
                        for uuid, c in agent.state.counters.items()}
            poll_seconds, polls_total = agent.state.last_poll_seconds, agent.state.polls_total
        node = agent.node
        now = time.time()
        by_uuid: dict[str, list[AgentDevice]] = {}
        for device in devices:
            by_uuid.setdefault(device.uuid, []).append(device)

        gauges = {name: GaugeMetricFamily(f"gpuwm_{name}", text, labels=GPU_LABELS) for name, text, _ in _GPU_GAUGES}
        healthy = GaugeMetricFamily("gpuwm_gpu_healthy", "1 when NVML reads the device without error.", labels=GPU_LABELS)
        idle = GaugeMetricFamily(
            "gpuwm_gpu_idle_seconds", "Seconds since the device was last at or above the idle threshold.",
            labels=GPU_LABELS,
        )
        energy = CounterMetricFamily(
            "gpuwm_gpu_energy_joules", "The GPU's energy counter since the driver loaded.", labels=GPU_LABELS
        )
        active = CounterMetricFamily(
            "gpuwm_gpu_active_seconds", "Seconds the device was at or above the idle threshold.", labels=GPU_LABELS
        )
        allocated = GaugeMetricFamily(
            "gpuwm_gpu_allocated", "GPU units a container holds on the device.", labels=GPU_LABELS
        )
        for sample in samples:
            labels = _gpu_labels(node, sample, _holder(by_uuid.get(sample.uuid, [])))
            for name, _, attribute in _GPU_GAUGES:
                value = getattr(sample, attribute)
                if value is not None:
                    gauges[name].add_metric(labels, float(value))
            healthy.add_metric(labels, 1.0 if sample.healthy else 0.0)
            if sample.energy_joules is not None and sample.parent_uuid is None:
                energy.add_metric(labels, sample.energy_joules)
            active_seconds, last_active_t, first_seen_t = counters.get(sample.uuid, (0.0, None, now))
            active.add_metric(labels, active_seconds)
            idle.add_metric(labels, max(0.0, now - (last_active_t if last_active_t is not None else first_seen_t)))
            for device in by_uuid.get(sample.uuid, []):
                if device.pod:
                    holder_labels = _gpu_labels(node, sample, (device.namespace or "", device.pod, device.container or ""))
                    allocated.add_metric(holder_labels, device.units)
        yield from gauges.values()
        yield from (healthy, idle, energy, active, allocated)

        pod_families = {name: GaugeMetricFamily(f"gpuwm_{name}", text, labels=POD_LABELS) for name, text, _ in _POD_GAUGES}
        for stats in pod_stats:
            for name, _, attribute in _POD_GAUGES:
                value = getattr(stats, attribute)
                if value is not None:
                    pod_families[name].add_metric([node, stats.namespace, stats.pod], float(value))
        yield from pod_families.values()

        ready = GaugeMetricFamily("gpuwm_agent_nvml_up", "1 when NVML is initialised.", labels=["node"])
        ready.add_metric([node], 1.0 if agent.nvml_ready else 0.0)
        pod_resources = GaugeMetricFamily(
            "gpuwm_agent_pod_resources_up", "1 when the last pod-resources List succeeded.", labels=["node"]
        )
        pod_resources.add_metric([node], 1.0 if agent.pod_resources.healthy else 0.0)
        poll = GaugeMetricFamily("gpuwm_agent_poll_seconds", "Duration of the last poll.", labels=["node"])
        poll.add_metric([node], poll_seconds)
        polls = CounterMetricFamily("gpuwm_agent_polls", "Polls completed.", labels=["node"])
        polls.add_metric([node], float(polls_total))
        yield from (ready, pod_resources, poll, polls)


def build_registry(agent: Agent) -> CollectorRegistry:
    """A registry with the agent's collector and its own CPU/RSS (`gpuwm_agent_process_*`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent))
    ProcessCollector(namespace="gpuwm_agent", registry=registry)
    return registry
