"""`/metrics` rendering: the agent's collector yields the families a plain reference collector builds from the
agent's state (the series the hand-written exposition served before it), text and parsed samples."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gpuwm.agent.core import Agent, DeviceCounters
from gpuwm.agent.metrics import (
    AGENT_FAMILIES,
    GPU_FAMILIES,
    GPU_GAUGES,
    GPU_LABELS,
    POD_GAUGES,
    POD_LABELS,
    MetricsRenderer,
)
from gpuwm.config import Settings
from gpuwm.feed import AgentDevice
from gpuwm.model import GpuSample, PodStatsSample

NOW = 1_700_000_100.0


class _Reference(Collector):
    """The families the agent has served, spelt out again from the catalogue's lists and the agent's state."""

    def __init__(self, agent: Agent, now: float) -> None:
        self.agent, self.now = agent, now

    def collect(self) -> Iterator[Metric]:
        agent, now, node = self.agent, self.now, self.agent.node
        state = agent.state
        by_uuid: dict[str, list[AgentDevice]] = {}
        for device in state.devices:
            by_uuid.setdefault(device.uuid, []).append(device)
        gauges = [GaugeMetricFamily(f"gpuwm_{name}", text, labels=GPU_LABELS) for name, text, _ in GPU_GAUGES]
        others: list[GaugeMetricFamily | CounterMetricFamily] = [
            (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(f"gpuwm_{name}", text, labels=GPU_LABELS)
            for name, text, kind in GPU_FAMILIES
        ]
        healthy, idle, energy, active, allocated, unattributed = others
        for sample in state.samples:
            held = by_uuid.get(sample.uuid, [])
            pods = {(d.namespace or "", d.pod or "", d.container or "") for d in held if d.pod}
            holder = pods.pop() if len(pods) == 1 else ("", "", "")
            base = [node, "" if sample.index is None else str(sample.index), sample.uuid, sample.model or "",
                    sample.mig_profile or ""]
            labels = [*base, *holder]
            for family, (_, _, attribute) in zip(gauges, GPU_GAUGES, strict=True):
                value = getattr(sample, attribute)
                if value is not None:
                    family.add_metric(labels, float(value))
            healthy.add_metric(labels, 1.0 if sample.healthy else 0.0)
            counters = state.counters.get(sample.uuid)
            if sample.energy_joules is not None and sample.parent_uuid is None:
                energy.add_metric(labels, sample.energy_joules)
            active.add_metric(labels, counters.active_seconds_total if counters else 0.0)
            unattributed.add_metric(labels, counters.unattributed_samples_total if counters else 0.0)
            since = now if counters is None else (
                counters.last_active_t if counters.last_active_t is not None else counters.first_seen_t
            )
            idle.add_metric(labels, max(0.0, now - since))
            for device in held:
                if device.pod:
                    allocated.add_metric([*base, device.namespace or "", device.pod, device.container or ""], device.units)
        yield from gauges
        yield from others
        for name, text, attribute in POD_GAUGES:
            family = GaugeMetricFamily(f"gpuwm_{name}", text, labels=POD_LABELS)
            for stats in state.pod_stats:
                value = getattr(stats, attribute)
                if value is not None:
                    family.add_metric([node, stats.namespace, stats.pod], float(value))
            yield family
        values = [1.0 if agent.nvml_ready else 0.0, 1.0 if agent.pod_resources.healthy else 0.0,
                  state.last_poll_seconds, float(state.polls_total)]
        for (name, text, kind), value in zip(AGENT_FAMILIES, values, strict=True):
            agent_family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                f"gpuwm_{name}", text, labels=["node"]
            )
            agent_family.add_metric([node], value)
            yield agent_family


def _agent(tmp_path: object, node: str = "node-1") -> Agent:
    settings = Settings(pod_resources_socket="/nonexistent/pod-resources.sock", proc_root="/nonexistent")
    return Agent(settings, node)


def _reference_text(agent: Agent) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Reference(agent, NOW))
    return generate_latest(registry)


def _sample(uuid: str, index: int | None, **fields: object) -> GpuSample:
    return GpuSample.model_validate({"t": NOW - 1, "node": "node-1", "uuid": uuid, "index": index, **fields})


def _device(uuid: str, units: float = 1.0, **fields: object) -> AgentDevice:
    return AgentDevice.model_validate({"uuid": uuid, "device_id": uuid, "units": units, "state": "active", **fields})


def _fill(agent: Agent) -> None:
    agent.nvml_ready = True
    agent.state.samples = [
        _sample("GPU-a", 0, model="NVIDIA H100 80GB HBM3", sm_percent=37.5, memory_used_bytes=1.5e9,
                memory_total_bytes=8.5e10, power_watts=350.25, power_limit_watts=700.0, energy_joules=123456789.5,
                temperature_celsius=61.0, sm_clock_mhz=1980.0, memory_clock_mhz=2619.0, memory_activity_percent=12.0,
                pcie_rx_bytes_per_second=1024.0, pcie_tx_bytes_per_second=2048.0),
        _sample("GPU-b", 1, model='odd "name"\\ with\nnewline', sm_percent=0.0, healthy=True),
        _sample("MIG-b1", 1, parent_uuid="GPU-b", mig_profile="1g.10gb", device_units=1 / 7, sm_percent=20.0,
                energy_joules=5.0),
        _sample("GPU-c", None, healthy=False, error="GPU is lost"),
        _sample("GPU-d", 3, sm_percent=1e-7, memory_used_bytes=12345678901234.0),
    ]
    agent.state.devices = [
        _device("GPU-a", namespace="team-a", pod="train-0", container="main"),
        _device("GPU-b", 0.5, device_id="GPU-b::0", namespace="team-b", pod="a", container="c"),
        _device("GPU-b", 0.5, device_id="GPU-b::1", namespace="team-b", pod="b", container="c"),
        _device("MIG-b1", 1 / 7, namespace="team-c", pod='p"q', container=None),
        _device("GPU-c"),
    ]
    agent.state.counters = {
        "GPU-a": DeviceCounters(active_seconds_total=42.0, last_sample_t=NOW - 1, last_active_t=NOW - 1,
                                first_seen_t=NOW - 100, unattributed_samples_total=7),
        "GPU-b": DeviceCounters(first_seen_t=NOW - 30.5),
    }
    agent.state.pod_stats = [
        PodStatsSample(t=NOW - 5, node="node-1", namespace="team-a", pod="train-0", pod_uid="u1",
                       cpu_usage_cores=2.5, memory_used_bytes=1e9),
        PodStatsSample(t=NOW - 5, node="node-1", namespace="team-b", pod="a", pod_uid="u2"),
    ]
    agent.state.polls_total, agent.state.last_poll_seconds = 12, 0.0031


def test_families_equal_a_plain_reference_collectors(tmp_path: object) -> None:
    agent = _agent(tmp_path)
    _fill(agent)
    renderer = MetricsRenderer(agent, process_metrics=False, clock=lambda: NOW)
    assert renderer.render() == _reference_text(agent)
    # a second scrape reads the state again: a holder change shows
    agent.state.devices = [_device("GPU-a", namespace="team-z", pod="other", container="x")]
    agent.state.polls_total = 13
    assert renderer.render() == _reference_text(agent)


def test_empty_agent_renders_every_family_header(tmp_path: object) -> None:
    agent = _agent(tmp_path, node="n")
    text = MetricsRenderer(agent, process_metrics=False, clock=lambda: NOW).render()
    assert text == _reference_text(agent)
    families = {family.name: family for family in text_string_to_metric_families(text.decode())}
    assert families["gpuwm_agent_nvml_up"].samples[0].value == 0.0
    assert families["gpuwm_agent_polls"].type == "counter"


def test_values_parse_back(tmp_path: object) -> None:
    agent = _agent(tmp_path)
    _fill(agent)
    text = MetricsRenderer(agent, clock=lambda: NOW).render().decode()
    samples = {(s.name, s.labels.get("uuid"), s.labels.get("pod")): s for f in text_string_to_metric_families(text)
               for s in f.samples}
    power = samples[("gpuwm_gpu_power_watts", "GPU-a", "train-0")]
    assert power.value == 350.25 and power.labels["namespace"] == "team-a"
    assert samples[("gpuwm_gpu_idle_seconds", "GPU-b", "")].value == pytest.approx(30.5)
    assert samples[("gpuwm_gpu_allocated", "MIG-b1", 'p"q')].value == pytest.approx(1 / 7)
    assert samples[("gpuwm_gpu_memory_used_bytes", "GPU-d", "")].value == 12345678901234.0
    assert samples[("gpuwm_gpu_healthy", "GPU-c", "")].value == 0.0
    assert samples[("gpuwm_agent_unattributed_samples_total", "GPU-a", "train-0")].value == 7.0
    assert samples[("gpuwm_agent_unattributed_samples_total", "GPU-b", "")].value == 0.0
    assert any(name == "gpuwm_agent_process_resident_memory_bytes" for name, _, _ in samples)


def test_process_figures_are_process_collectors(tmp_path: Path) -> None:
    """The `gpuwm_agent_process_*` text is prometheus-client's ProcessCollector's, on the /proc it is given."""
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1763770000\nprocesses 9\n")
    pid = tmp_path / "self"
    (pid / "fd").mkdir(parents=True)
    for fd in range(7):
        (pid / "fd" / str(fd)).write_text("")
    fields = ["S", "1", "2", "3", "4", "5", "6", "7", "8", "9", "1234", "567", "1", "2", "20", "0", "3", "0",
              "98765", "663932928", "16138"]
    (pid / "stat").write_text("4242 (python (gpuwm)) " + " ".join(fields) + " 0 0\n")
    (pid / "limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units\n"
        "Max cpu time              unlimited            unlimited            seconds\n"
        "Max open files            20000                20000                files\n"
    )
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(namespace="gpuwm_agent", pid=lambda: "self", proc=str(tmp_path), registry=registry)
    expected = generate_latest(registry).decode()
    assert "gpuwm_agent_process_open_fds 7.0" in expected
    agent = _agent(tmp_path)
    without = MetricsRenderer(agent, process_metrics=False, clock=lambda: NOW).render().decode()
    assert MetricsRenderer(agent, proc=str(tmp_path), clock=lambda: NOW).render().decode() == without + expected

    absent = MetricsRenderer(agent, proc=str(tmp_path / "absent"), clock=lambda: NOW).render().decode()
    assert absent == without  # no /proc: no figures


def test_idle_seconds_are_read_off_the_clock_at_each_scrape(tmp_path: object) -> None:
    agent = _agent(tmp_path)
    _fill(agent)
    clock = [NOW]
    renderer = MetricsRenderer(agent, process_metrics=False, clock=lambda: clock[0])

    def idle_b() -> float:
        families = text_string_to_metric_families(renderer.render().decode())
        family = next(family for family in families if family.name == "gpuwm_gpu_idle_seconds")
        return next(sample.value for sample in family.samples if sample.labels["uuid"] == "GPU-b")

    assert idle_b() == pytest.approx(30.5)
    clock[0] += 10
    assert idle_b() == pytest.approx(40.5)
