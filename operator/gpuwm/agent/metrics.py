"""`/metrics`: the agent's cached state as Prometheus families (no NVML or gRPC call per scrape).

`AgentCollector` is a prometheus-client `Collector`: on each scrape it copies the latest poll under the
agent's lock and yields `gpuwm_*` families built from it; `MetricsRenderer` registers it, with
prometheus-client's `ProcessCollector` for the agent process's own `gpuwm_agent_process_*` figures, in a
registry of its own and renders that with `generate_latest` (the text format, as the agent always served).

Labels are fixed and few: node, gpu, uuid, model, mig_profile, and namespace, pod, container of the pod
that holds the device (empty when none, or when several pods share it). The per-GPU and per-pod families,
their help and type come from the metric catalogue (`gpuwm.model.metrics`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from gpuwm.agent.core import Agent
from gpuwm.feed import AgentDevice
from gpuwm.model import BY_NAME, EXPORTED, GpuSample, Metric, PodStatsSample, Source

GPU_LABELS = ["node", "gpu", "uuid", "model", "mig_profile", "namespace", "pod", "container"]
POD_LABELS = ["node", "namespace", "pod"]

#: the per-GPU families written from the agent's counters and holders rather than read off a sample's
#: field (energy too: a MIG instance carries its parent's counter, written once, for the parent), in order
_COMPUTED = ("gpu_healthy", "gpu_idle_seconds", "gpu_energy_joules", "gpu_active_seconds", "gpu_allocated",
             "agent_unattributed_samples")


def _help(metric: Metric) -> str:
    return metric.series_help or ""  # EXPORTED holds only metrics with one


#: (metric name without prefix, help, GpuSample attribute) of the per-GPU gauges read off a sample
GPU_GAUGES = [(metric.name, _help(metric), str(metric.field)) for metric in EXPORTED
              if metric.source is Source.GPU and metric.name not in _COMPUTED]
#: (metric name without prefix, help, type) of the per-GPU families after the gauges, in order
GPU_FAMILIES = [(name, _help(BY_NAME[name]), BY_NAME[name].kind) for name in _COMPUTED]
#: (metric name without prefix, help, PodStatsSample attribute) of the per-pod gauges
POD_GAUGES = [(metric.name, _help(metric), str(metric.field)) for metric in EXPORTED if metric.source is Source.POD]
#: (metric name without prefix, help, type) of the agent's own node-labelled families, in order
AGENT_FAMILIES = [
    ("agent_nvml_up", "1 when NVML is initialised.", "gauge"),
    ("agent_pod_resources_up", "1 when the last pod-resources List succeeded.", "gauge"),
    ("agent_poll_seconds", "Duration of the last poll.", "gauge"),
    ("agent_polls", "Polls completed.", "counter"),
]

Family = GaugeMetricFamily | CounterMetricFamily


def _family(name: str, help_text: str, kind: str, labels: list[str]) -> Family:
    """`gpuwm_<name>`: a counter family (exposed with `_total`) or a gauge family."""
    kind_class = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    return kind_class(f"gpuwm_{name}", help_text, labels=labels)


def _holder(devices: list[AgentDevice]) -> tuple[str, str, str]:
    """(namespace, pod, container) of the one pod holding a device; empty when none or several share it."""
    pods = {(d.namespace or "", d.pod or "", d.container or "") for d in devices if d.pod}
    return pods.pop() if len(pods) == 1 else ("", "", "")


class AgentCollector(Collector):
    """The latest poll of an `Agent` as `gpuwm_*` families; `clock` (epoch seconds) dates the idle figure."""

    def __init__(self, agent: Agent, clock: Callable[[], float] = time.time) -> None:
        self.agent = agent
        self.clock = clock

    def collect(self) -> Iterator[Family]:
        agent = self.agent
        with agent.lock:  # a copy, so a poll that lands mid-scrape is not waited on while families are built
            samples = list(agent.state.samples)
            devices = list(agent.state.devices)
            pod_stats = list(agent.state.pod_stats)
            counters = {uuid: (c.active_seconds_total, c.last_active_t, c.first_seen_t, c.unattributed_samples_total)
                        for uuid, c in agent.state.counters.items()}
            poll_seconds, polls_total = agent.state.last_poll_seconds, agent.state.polls_total
        node = agent.node
        yield from _gpu_families(node, samples, devices, counters, self.clock())
        yield from _pod_families(node, pod_stats)
        values = (1.0 if agent.nvml_ready else 0.0, 1.0 if agent.pod_resources.healthy else 0.0,
                  poll_seconds, float(polls_total))
        for (name, help_text, kind), value in zip(AGENT_FAMILIES, values, strict=True):
            family = _family(name, help_text, kind, ["node"])
            family.add_metric([node], value)
            yield family


def _gpu_families(
    node: str,
    samples: list[GpuSample],
    devices: list[AgentDevice],
    counters: dict[str, tuple[float, float | None, float, int]],
    now: float,
) -> list[Family]:
    by_uuid: dict[str, list[AgentDevice]] = {}
    for device in devices:
        by_uuid.setdefault(device.uuid, []).append(device)
    gauges = [_family(name, help_text, "gauge", GPU_LABELS) for name, help_text, _ in GPU_GAUGES]
    computed = [_family(name, help_text, kind, GPU_LABELS) for name, help_text, kind in GPU_FAMILIES]
    healthy, idle, energy, active, allocated, unattributed = computed
    for sample in samples:
        held = by_uuid.get(sample.uuid, [])
        device_labels = [node, "" if sample.index is None else str(sample.index), sample.uuid, sample.model or "",
                         sample.mig_profile or ""]
        labels = [*device_labels, *_holder(held)]
        for family, (_, _, attribute) in zip(gauges, GPU_GAUGES, strict=True):
            value = getattr(sample, attribute)
            if value is not None:
                family.add_metric(labels, value)
        healthy.add_metric(labels, 1.0 if sample.healthy else 0.0)
        active_seconds, last_active_t, first_seen_t, unattributed_samples = counters.get(
            sample.uuid, (0.0, None, now, 0))
        since = last_active_t if last_active_t is not None else first_seen_t
        idle.add_metric(labels, max(0.0, now - since))
        if sample.energy_joules is not None and sample.parent_uuid is None:
            energy.add_metric(labels, sample.energy_joules)
        active.add_metric(labels, active_seconds)
        unattributed.add_metric(labels, unattributed_samples)
        for device in held:
            if device.pod:
                allocated.add_metric([*device_labels, device.namespace or "", device.pod, device.container or ""],
                                     device.units)
    return [*gauges, *computed]


def _pod_families(node: str, pod_stats: list[PodStatsSample]) -> list[Family]:
    families = [_family(name, help_text, "gauge", POD_LABELS) for name, help_text, _ in POD_GAUGES]
    for stats in pod_stats:
        labels = [node, stats.namespace, stats.pod]
        for family, (_, _, attribute) in zip(families, POD_GAUGES, strict=True):
            value = getattr(stats, attribute)
            if value is not None:
                family.add_metric(labels, value)
    return families


class MetricsRenderer:
    """The `/metrics` body: an `AgentCollector` and, with `process_metrics`, a `ProcessCollector` reading
    `proc` (the /proc of the host or a test's tree), in a registry of their own rendered by `generate_latest`."""

    def __init__(self, agent: Agent, process_metrics: bool = True, proc: str = "/proc",
                 clock: Callable[[], float] = time.time) -> None:
        # auto_describe off: registering would otherwise collect once, reading the agent's state and /proc
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(AgentCollector(agent, clock))
        if process_metrics:
            ProcessCollector(namespace="gpuwm_agent", proc=proc, registry=self.registry)

    def render(self) -> bytes:
        """The whole `/metrics` body in the Prometheus text format."""
        return generate_latest(self.registry)
