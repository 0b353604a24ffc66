"""The metric catalogue: every per-GPU and per-pod metric gpuwm measures, exports or stores, written once.

Each entry says what a metric is (name, unit, help), where its value comes from (a sample field, the
pod spec, or the agent's own counting), how a scope's value is made from its devices or pods, how it
rolls up over time, whether the embedded store keeps it, how the agent's `/metrics` exposes it and its
Run:ai counterpart. The agent's exposition (`agent/metrics.py`), the store's columns and rows
(`store/base.py`, `store/aggregate.py`), the PromQL translation (`store/promql.py`) and the real-Prometheus
tests' OpenMetrics backfill derive their lists from here, and tests/unit/model/test_metric_catalogue.py
checks that each covers every entry: adding a metric is one entry here plus the code that measures it.

The agent's own health series (`gpuwm_agent_nvml_up`, polls, the process figures) are not here: they
describe the agent, not a GPU or a pod, and only `agent/metrics.py` writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal


class Rollup(Enum):
    """How values combine over time (roll-ups, coarse steps) within one series."""

    MEAN = "mean"  # gauges
    MAX = "max"  # cumulative counters and growing durations: the latest value is the largest
    LAST = "last"  # the engine's cumulative figures: the latest value, kept exactly (a period is a difference)


class Source(Enum):
    """What a metric's value is read from."""

    GPU = "gpu"  # a `GpuSample` field: one value per device and poll
    POD = "pod"  # a `PodStatsSample` field: the kubelet's figures of one pod
    POD_SPEC = "pod_spec"  # a `PodResources` field: the requests and limits of the pod spec (the controller)
    AGENT = "agent"  # counted by the agent per device (holders, active time), not a field of a sample
    FIGURES = "figures"  # the engine's cumulative figure of a workload, project or cluster (`WorkloadFigures`)


class Aggregation(Enum):
    """How a scope's value (workload, project, node, cluster) is made from its devices' or pods' values."""

    SUM = "sum"  # summed; a device shared by several holders counts by each holder's share
    MEAN = "mean"  # the mean (SM utilisation: weighted by the GPU units held)
    MAX = "max"  # the largest: the hottest device, the longest idle
    RATIO = "ratio"  # 100 x the sum of `ratio_of[0]` / the sum of `ratio_of[1]`


@dataclass(frozen=True, slots=True)
class Metric:
    """One catalogue entry (see the module docstring)."""

    #: the API's and store's name; the agent's series is `gpuwm_<name>` (`_total` added to a counter)
    name: str
    #: the unit of every value, also the key of the store's resolution (`store/codec.py`)
    unit: str
    #: what a scope's value means: the API's description of the metric
    help: str
    source: Source
    #: the attribute of the source's model it reads (None: computed, e.g. a ratio or the agent's counting)
    field: str | None
    #: how a scope's value combines its devices or pods (None: per device only, never combined)
    aggregation: Aggregation | None
    rollup: Rollup = Rollup.MEAN
    #: the embedded store keeps a column of it (the store's column order is the catalogue's order)
    stored: bool = True
    #: HELP of the agent's per-device or per-pod series (None: the agent does not export it)
    series_help: str | None = None
    #: the agent series' type
    kind: Literal["gauge", "counter"] = "gauge"
    #: for `Aggregation.RATIO`: the (numerator, denominator) metrics
    ratio_of: tuple[str, str] | None = None
    #: the name of Run:ai's series with the same meaning, where `runaiCompatibleMetrics` exports one: the
    #: per-GPU series of a device figure (in Run:ai's unit: MiB for memory), the per-workload one of a pod figure
    runai: str | None = None
    #: a gauge (`Rollup.MEAN`) whose roll-ups keep each bucket's min and max besides its mean: the gauges where
    #: the mean hides what a reader judges (a busy spike in an idle hour). Each costs bytes in every coarse
    #: tier (bench/README.md, "The store's choices"), and the set is the roll-ups' layout: changing it is a
    #: schema step of the store
    rollup_extremes: bool = False


def _gpu(
    name: str, unit: str, field: str, aggregation: Aggregation | None, help_text: str, series_help: str, *,
    rollup: Rollup = Rollup.MEAN, stored: bool = True, kind: Literal["gauge", "counter"] = "gauge",
    ratio_of: tuple[str, str] | None = None, runai: str | None = None, rollup_extremes: bool = False,
) -> Metric:
    return Metric(name, unit, help_text, Source.GPU, field, aggregation, rollup, stored, series_help, kind, ratio_of,
                  runai, rollup_extremes)


def _pod(name: str, unit: str, help_text: str, series_help: str, runai: str | None = None) -> Metric:
    """A kubelet figure of one pod, the `PodStatsSample` field of the metric's name, summed over pods."""
    return Metric(name, unit, help_text, Source.POD, name, Aggregation.SUM, series_help=series_help, runai=runai)


def _figure(name: str, unit: str, help_text: str, *, computed: bool = False) -> Metric:
    """The engine's cumulative figure of the scope: a workload's, project's or cluster's field of this name
    (`computed`: made from its fields, `gpuwm.store.utilized_gpu_seconds`)."""
    return Metric(name, unit, help_text, Source.FIGURES, None if computed else name, Aggregation.SUM, Rollup.LAST,
                  kind="counter")


def _spec(name: str, unit: str, help_text: str, runai: str | None = None) -> Metric:
    """A pod spec's request or limit, the `PodResources` field of the metric's name, summed over pods."""
    return Metric(name, unit, help_text, Source.POD_SPEC, name, Aggregation.SUM, runai=runai)


_SUM, _MEAN, _MAX, _RATIO = Aggregation.SUM, Aggregation.MEAN, Aggregation.MAX, Aggregation.RATIO

#: every metric; those with `stored` in the embedded store's column order (never reorder or insert
#: among them: the order is the file layout; a new stored metric goes last, with a schema step)
CATALOGUE: tuple[Metric, ...] = (
    _gpu("gpu_utilization_percent", "percent", "sm_percent", _MEAN,
         "SM utilisation, unit-weighted mean over the scope's devices.",
         "SM utilisation over the last poll interval.", runai="runai_gpu_utilization_per_gpu", rollup_extremes=True),
    _gpu("gpu_memory_used_bytes", "bytes", "memory_used_bytes", _SUM,
         "Device memory used, summed (a shared device counts by share).",
         "Device memory used.", runai="runai_gpu_memory_used_mebibytes_per_gpu"),
    _gpu("gpu_memory_total_bytes", "bytes", "memory_total_bytes", _SUM,
         "Device memory total, summed (a shared device counts by share).",
         "Device memory total.", runai="runai_gpu_memory_total_mebibytes_per_gpu"),
    _gpu("gpu_memory_utilization_percent", "percent", "memory_percent", _RATIO,
         "Memory used as percent of memory total.",
         "Device memory used as a percent of total.", ratio_of=("gpu_memory_used_bytes", "gpu_memory_total_bytes")),
    _gpu("gpu_memory_activity_percent", "percent", "memory_activity_percent", _MEAN,
         "Memory controller busy percent, mean over devices.",
         "Memory controller busy percent over the last interval.", stored=False),
    _gpu("gpu_power_watts", "watts", "power_watts", _SUM,
         "Power draw, summed (a shared device counts by share).", "Power draw."),
    _gpu("gpu_power_limit_watts", "watts", "power_limit_watts", _SUM,
         "Enforced power limit, summed (a shared device counts by share).", "Enforced power limit."),
    _gpu("gpu_energy_joules", "joules", "energy_joules", _SUM,
         "Cumulative energy: the workload's/project's energyJoules, or the devices' counters for GPU, node and cluster.",
         "The GPU's energy counter since the driver loaded.", rollup=Rollup.MAX, kind="counter"),
    _gpu("gpu_temperature_celsius", "celsius", "temperature_celsius", _MAX,
         "Hottest device of the scope.", "GPU temperature."),
    _gpu("gpu_sm_clock_mhz", "MHz", "sm_clock_mhz", _MEAN, "SM clock, mean over devices.", "SM clock."),
    _gpu("gpu_memory_clock_mhz", "MHz", "memory_clock_mhz", _MEAN, "Memory clock, mean over devices.", "Memory clock."),
    _gpu("gpu_pcie_rx_bytes_per_second", "bytes/s", "pcie_rx_bytes_per_second", _SUM,
         "PCIe receive, summed.", "PCIe receive throughput."),
    _gpu("gpu_pcie_tx_bytes_per_second", "bytes/s", "pcie_tx_bytes_per_second", _SUM,
         "PCIe transmit, summed.", "PCIe transmit throughput."),
    _gpu("gpu_healthy", "boolean", "healthy", None,
         "1 when NVML reads the device without error.", "1 when NVML reads the device without error.", stored=False),
    Metric("gpu_allocated", "GPU units", "GPU units held.", Source.AGENT, None, _SUM,
           series_help="GPU units a container holds on the device."),
    Metric("gpu_idle_seconds", "seconds",
           "The workload's idleSeconds; for a project, node or cluster the longest among its workloads.",
           Source.AGENT, None, _MAX, rollup=Rollup.MAX,
           series_help="Seconds since the device was last at or above the idle threshold."),
    Metric("gpu_active_seconds", "seconds", "Seconds the device was at or above the idle threshold.",
           Source.AGENT, None, _SUM, rollup=Rollup.MAX, stored=False,
           series_help="Seconds the device was at or above the idle threshold.", kind="counter"),
    Metric("agent_unattributed_samples", "samples",
           "Samples of a busy device whose activity its holders' processes did not explain.",
           Source.AGENT, None, _SUM, rollup=Rollup.MAX, stored=False, kind="counter",
           series_help="Samples of a busy device (SM at or above the idle threshold) whose activity its "
           "holders' processes did not explain (none listed, no pod or no SM figure): its holders got the device's "
           "SM %. Rising where processes are hidden from the agent, e.g. without hostPID."),
    _pod("cpu_usage_cores", "cores", "CPU of the scope's GPU pods, summed.", "Pod CPU use, cores.",
         runai="runai_job_cpu_usage"),
    _pod("memory_used_bytes", "bytes", "Working-set memory of the scope's GPU pods, summed.",
         "Pod working-set memory.", runai="runai_job_memory_used_bytes"),
    _pod("network_rx_bytes_per_second", "bytes/s", "Network receive of the scope's GPU pods, summed.",
         "Pod network receive rate."),
    _pod("network_tx_bytes_per_second", "bytes/s", "Network transmit of the scope's GPU pods, summed.",
         "Pod network transmit rate."),
    _pod("ephemeral_storage_used_bytes", "bytes", "Ephemeral storage of the scope's GPU pods, summed.",
         "Pod ephemeral storage used."),
    # schema 5: requests and limits from the pod specs, and what the pods use of them
    _spec("cpu_request_cores", "cores", "CPU requests of the scope's GPU pods (from their specs), summed.",
          runai="runai_active_job_cpu_requested_cores"),
    _spec("cpu_limit_cores", "cores", "CPU limits of the scope's GPU pods (from their specs), summed.",
          runai="runai_cpu_limits_per_active_workload"),
    Metric("cpu_usage_percent_of_request", "percent",
           "CPU used as percent of the CPU requested, over the scope's pods that request CPU.",
           Source.POD, None, _RATIO, ratio_of=("cpu_usage_cores", "cpu_request_cores")),
    Metric("cpu_usage_percent_of_limit", "percent",
           "CPU used as percent of the CPU limit, over the scope's pods that have a limit.",
           Source.POD, None, _RATIO, ratio_of=("cpu_usage_cores", "cpu_limit_cores")),
    _spec("memory_request_bytes", "bytes", "Memory requests of the scope's GPU pods (from their specs), summed.",
          runai="runai_active_job_memory_requested_bytes"),
    _spec("memory_limit_bytes", "bytes", "Memory limits of the scope's GPU pods (from their specs), summed.",
          runai="runai_memory_limits_per_active_workload"),
    _pod("disk_read_bytes_per_second", "bytes/s", "Block-device reads of the scope's GPU pods, summed.",
         "Pod block-device read rate (cAdvisor)."),
    _pod("disk_write_bytes_per_second", "bytes/s", "Block-device writes of the scope's GPU pods, summed.",
         "Pod block-device write rate (cAdvisor)."),
    _spec("ephemeral_storage_limit_bytes", "bytes",
          "Ephemeral-storage limits of the scope's GPU pods (specs), summed."),
    # the engine's cumulative figures, which period reports difference (workload, project and cluster series)
    _figure("allocated_gpu_seconds", "GPU-seconds", "The scope's allocatedGpuSeconds: units x seconds held."),
    _figure("active_gpu_seconds", "GPU-seconds", "The scope's activeGpuSeconds."),
    _figure("idle_gpu_seconds", "GPU-seconds", "The scope's idleGpuSeconds: held, monitored and idle."),
    _figure("unmonitored_gpu_seconds", "GPU-seconds", "The scope's unmonitoredGpuSeconds: held without samples."),
    _figure("utilized_gpu_seconds", "GPU-seconds",
            "Monitored GPU-seconds weighted by SM utilisation (active + idle x lifetime utilisation / 100); "
            "over a period, divided by its active + idle GPU-seconds, the period's mean utilisation.", computed=True),
    _figure("energy_joules", "joules",
            "The scope's energyJoules, kept exactly in every tier (gpu_energy_joules' roll-ups keep 100 J)."),
)
BY_NAME: dict[str, Metric] = {metric.name: metric for metric in CATALOGUE}
#: the metrics the embedded store keeps, in its column order
STORED: tuple[Metric, ...] = tuple(metric for metric in CATALOGUE if metric.stored)
#: the agent's `/metrics` series, in the catalogue's order
EXPORTED: tuple[Metric, ...] = tuple(metric for metric in CATALOGUE if metric.series_help is not None)
#: Run:ai's name of each metric that has one
RUNAI_NAMES: dict[str, str] = {metric.name: metric.runai for metric in CATALOGUE if metric.runai}


def _check(catalogue: tuple[Metric, ...]) -> None:
    """Refuse a catalogue whose entries contradict each other (a typo here would break a consumer quietly)."""
    names = [metric.name for metric in catalogue]
    if len(set(names)) != len(names):
        raise ValueError(f"metric catalogue: a name appears twice: {sorted(n for n in names if names.count(n) > 1)}")
    for metric in catalogue:
        if (metric.aggregation is Aggregation.RATIO) != (metric.ratio_of is not None):
            raise ValueError(f"metric catalogue: {metric.name}: ratio_of is set exactly for Aggregation.RATIO")
        if metric.ratio_of is not None and not all(part in BY_NAME for part in metric.ratio_of):
            raise ValueError(f"metric catalogue: {metric.name}: ratio_of {metric.ratio_of} names an unknown metric")
        if metric.source in (Source.POD, Source.POD_SPEC) and metric.field is None and metric.ratio_of is None:
            raise ValueError(f"metric catalogue: {metric.name}: a pod metric reads a field or is a ratio")
        if metric.rollup_extremes and (metric.rollup is not Rollup.MEAN or not metric.stored):
            raise ValueError(f"metric catalogue: {metric.name}: only a stored gauge (Rollup.MEAN) keeps roll-up extremes")


_check(CATALOGUE)
