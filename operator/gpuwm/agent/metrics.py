"""`/metrics`: the agent's cached state in the Prometheus text format (no NVML or gRPC call per scrape).

Labels are fixed and few: node, gpu, uuid, model, mig_profile, and namespace, pod, container of
the pod that holds the device (empty when none, or when several pods share it). The per-GPU and
per-pod families, their help and type come from the metric catalogue (`gpuwm.model.metrics`).

The GPU and pod families are written here rather than through prometheus-client's `generate_latest`,
which escapes and sorts every label of every sample on each scrape, while a device's label set changes
only when its holder does, so it is escaped once and cached (bench/README.md has the figures). The output
is byte for byte what `generate_latest` writes for the same families (tests/unit/agent/test_metrics.py
checks it against a prometheus-client collector). The agent process's own `gpuwm_agent_process_*`
figures come from prometheus-client's `ProcessCollector` itself.
"""

from __future__ import annotations

import math
import time

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import generate_latest

from gpuwm.agent.core import Agent
from gpuwm.feed import AgentDevice
from gpuwm.model import GpuSample, PodStatsSample
from gpuwm.model.metrics import BY_NAME, EXPORTED, Metric, Source

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
#: label strings kept per device and holder; past this many the cache starts again (pods come and go)
_LABEL_CACHE_ENTRIES = 4096


def _escape(value: str) -> str:
    """A label value as the text format writes it (prometheus-client's escaping)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _value(number: float) -> str:
    """A sample value as prometheus-client's `floatToGoString` writes it (Go's exponent rules)."""
    value = float(number)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _header(name: str, help_text: str, kind: str) -> tuple[str, str]:
    """(`# HELP` and `# TYPE` lines, sample name) as generate_latest writes them; counters end in _total."""
    full = f"gpuwm_{name}_total" if kind == "counter" else f"gpuwm_{name}"
    documentation = help_text.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {full} {documentation}\n# TYPE {full} {kind}\n", full


def _labels(names: list[str], values: list[str]) -> str:
    """`{a="x",b="y"}` with names sorted, as generate_latest writes them."""
    pairs = sorted(zip(names, values, strict=True))
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in pairs) + "}"


_GPU_HEADERS = [_header(name, text, "gauge") for name, text, _ in GPU_GAUGES]
_GPU_ATTRIBUTES = [attribute for _, _, attribute in GPU_GAUGES]
_HEALTHY, _IDLE, _ENERGY, _ACTIVE, _ALLOCATED, _UNATTRIBUTED = (_header(*family) for family in GPU_FAMILIES)
_POD_HEADERS = [_header(name, text, "gauge") for name, text, _ in POD_GAUGES]
_POD_ATTRIBUTES = [attribute for _, _, attribute in POD_GAUGES]
_AGENT_HEADERS = [_header(*family) for family in AGENT_FAMILIES]


def _holder(devices: list[AgentDevice]) -> tuple[str, str, str]:
    pods = {(d.namespace or "", d.pod or "", d.container or "") for d in devices if d.pod}
    return pods.pop() if len(pods) == 1 else ("", "", "")


class MetricsRenderer:
    """Renders the latest poll of an `Agent` as `gpuwm_*` families, plus the agent process's own figures
    (`ProcessCollector` reading `proc`, the /proc of the host or a test's tree)."""

    def __init__(self, agent: Agent, process_metrics: bool = True, proc: str = "/proc") -> None:
        self.agent = agent
        self._process: CollectorRegistry | None = None
        if process_metrics:
            self._process = CollectorRegistry(auto_describe=False)
            ProcessCollector(namespace="gpuwm_agent", proc=proc, registry=self._process)
        self._gpu_labels: dict[tuple[str | int | None, ...], str] = {}
        self._node_labels = ""
        self._node_labels_for: str | None = None

    def _gpu_label_text(self, node: str, sample: GpuSample, holder: tuple[str, str, str]) -> str:
        key = (node, sample.index, sample.uuid, sample.model, sample.mig_profile, *holder)
        text = self._gpu_labels.get(key)
        if text is None:
            if len(self._gpu_labels) >= _LABEL_CACHE_ENTRIES:
                self._gpu_labels.clear()
            index = "" if sample.index is None else str(sample.index)
            values = [node, index, sample.uuid, sample.model or "", sample.mig_profile or "", *holder]
            text = self._gpu_labels[key] = _labels(GPU_LABELS, values)
        return text

    def render(self, now: float | None = None) -> bytes:
        """The whole `/metrics` body; `now` (epoch seconds) is for the idle-seconds figure."""
        agent = self.agent
        with agent.lock:
            samples = list(agent.state.samples)
            devices = list(agent.state.devices)
            pod_stats = list(agent.state.pod_stats)
            counters = {uuid: (c.active_seconds_total, c.last_active_t, c.first_seen_t, c.unattributed_samples_total)
                        for uuid, c in agent.state.counters.items()}
            poll_seconds, polls_total = agent.state.last_poll_seconds, agent.state.polls_total
        node = agent.node
        now = time.time() if now is None else now
        by_uuid: dict[str, list[AgentDevice]] = {}
        for device in devices:
            by_uuid.setdefault(device.uuid, []).append(device)

        gauges: list[list[str]] = [[header] for header, _ in _GPU_HEADERS]
        healthy, idle, energy, active, allocated, unattributed = (
            [header] for header, _ in (_HEALTHY, _IDLE, _ENERGY, _ACTIVE, _ALLOCATED, _UNATTRIBUTED))
        for sample in samples:
            held = by_uuid.get(sample.uuid, [])
            labels = self._gpu_label_text(node, sample, _holder(held))
            for lines, (_, name), attribute in zip(gauges, _GPU_HEADERS, _GPU_ATTRIBUTES, strict=True):
                value = getattr(sample, attribute)
                if value is not None:
                    lines.append(f"{name}{labels} {_value(value)}\n")
            healthy.append(f"{_HEALTHY[1]}{labels} {'1.0' if sample.healthy else '0.0'}\n")
            active_seconds, last_active_t, first_seen_t, unattributed_samples = counters.get(
                sample.uuid, (0.0, None, now, 0))
            since = last_active_t if last_active_t is not None else first_seen_t
            idle.append(f"{_IDLE[1]}{labels} {_value(max(0.0, now - since))}\n")
            if sample.energy_joules is not None and sample.parent_uuid is None:
                energy.append(f"{_ENERGY[1]}{labels} {_value(sample.energy_joules)}\n")
            active.append(f"{_ACTIVE[1]}{labels} {_value(active_seconds)}\n")
            unattributed.append(f"{_UNATTRIBUTED[1]}{labels} {_value(unattributed_samples)}\n")
            for device in held:
                if device.pod:
                    holder = (device.namespace or "", device.pod, device.container or "")
                    allocated.append(
                        f"{_ALLOCATED[1]}{self._gpu_label_text(node, sample, holder)} {_value(device.units)}\n"
                    )
        output = [line for lines in gauges for line in lines]
        for lines in (healthy, idle, energy, active, allocated, unattributed):
            output.extend(lines)
        output.extend(_pod_lines(node, pod_stats))
        output.extend(self._agent_lines(node, polls_total, poll_seconds))
        text = "".join(output).encode()
        return text if self._process is None else text + generate_latest(self._process)

    def _agent_lines(self, node: str, polls_total: int, poll_seconds: float) -> list[str]:
        if self._node_labels_for != node:
            self._node_labels, self._node_labels_for = _labels(["node"], [node]), node
        labels = self._node_labels
        agent = self.agent
        values = (
            1.0 if agent.nvml_ready else 0.0, 1.0 if agent.pod_resources.healthy else 0.0,
            poll_seconds, float(polls_total),
        )
        return [f"{header}{name}{labels} {_value(value)}\n"
                for (header, name), value in zip(_AGENT_HEADERS, values, strict=True)]


def _pod_lines(node: str, pod_stats: list[PodStatsSample]) -> list[str]:
    families: list[list[str]] = [[header] for header, _ in _POD_HEADERS]
    for stats in pod_stats:
        labels = _labels(POD_LABELS, [node, stats.namespace, stats.pod])
        for lines, (_, name), attribute in zip(families, _POD_HEADERS, _POD_ATTRIBUTES, strict=True):
            value = getattr(stats, attribute)
            if value is not None:
                lines.append(f"{name}{labels} {_value(value)}\n")
    return [line for lines in families for line in lines]
