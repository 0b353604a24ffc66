"""Translating API queries into PromQL over the agent's and the controller's `gpuwm_*` series."""

from __future__ import annotations

_AGENT_GPU = {
    "gpu_utilization_percent": "avg",
    "gpu_memory_used_bytes": "sum",
    "gpu_memory_total_bytes": "sum",
    "gpu_power_watts": "sum",
    "gpu_power_limit_watts": "sum",
    "gpu_temperature_celsius": "max",
    "gpu_sm_clock_mhz": "avg",
    "gpu_memory_clock_mhz": "avg",
    "gpu_pcie_rx_bytes_per_second": "sum",
    "gpu_pcie_tx_bytes_per_second": "sum",
    "gpu_allocated": "sum",
}
_AGENT_POD = (
    "cpu_usage_cores",
    "memory_used_bytes",
    "network_rx_bytes_per_second",
    "network_tx_bytes_per_second",
    "ephemeral_storage_used_bytes",
    "disk_read_bytes_per_second",
    "disk_write_bytes_per_second",
)
_BY_LABELS = {
    None: "",
    "gpu": "node, uuid, gpu, namespace, pod",
    "pod": "namespace, pod, node",
    "node": "node",
}
_INFO_LABELS = "namespace, pod, workload, workload_uid, project"


def quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _scoped(series: str, scope: str, key: str, narrow: str = "") -> str | None:
    """`series` restricted to the scope: joined to workloads through gpuwm_workload_pod_info where needed.

    `narrow` (label matchers such as `namespace=~"a|b"`) pre-filters the agent's series so that
    Prometheus does not load every GPU's series before the join throws most away.
    """
    if scope == "node":
        return f"{series}{{node={quote(key)}}}"
    if scope == "cluster":
        return series
    label = "workload_uid" if scope == "workload" else "project"
    info = f"max by ({_INFO_LABELS}) (gpuwm_workload_pod_info{{{label}={quote(key)}}})"
    left = f"{series}{{{narrow}}}" if narrow else series
    return f"({left} * on (namespace, pod) group_left (workload, workload_uid, project) {info})"


def promql(metric: str, scope: str, key: str, by: str | None, narrow: str = "") -> str | None:
    """The PromQL for one API metric over one scope and breakdown, or None where the series do not exist."""
    grouping = f" by ({_BY_LABELS[by]})" if by else ""
    if metric in _AGENT_GPU:
        name = "gpuwm_gpu_allocated" if metric == "gpu_allocated" else f"gpuwm_{metric}"
        return f"{_AGENT_GPU[metric]}{grouping} ({_scoped(name, scope, key, narrow)})"
    if metric == "gpu_memory_utilization_percent":
        used = _scoped("gpuwm_gpu_memory_used_bytes", scope, key, narrow)
        total = _scoped("gpuwm_gpu_memory_total_bytes", scope, key, narrow)
        return f"100 * sum{grouping} ({used}) / sum{grouping} ({total})"
    if metric in _AGENT_POD:
        if by == "gpu":
            return None
        return f"sum{grouping} ({_scoped(f'gpuwm_{metric}', scope, key, narrow)})"
    if metric == "gpu_energy_joules":
        if scope in ("node", "cluster"):
            return f"sum{grouping} ({_scoped('gpuwm_gpu_energy_joules_total', scope, key, narrow)})"
        if by is not None:
            return None
        if scope == "workload":
            return f"max (gpuwm_workload_energy_joules_total{{workload_uid={quote(key)}}})"
        return f"max (gpuwm_project_energy_joules_total{{project={quote(key)}}})"
    if metric == "gpu_idle_seconds":
        if scope in ("node", "cluster"):
            return f"max{grouping} ({_scoped('gpuwm_gpu_idle_seconds', scope, key, narrow)})"
        if by is not None:
            return None
        label = "workload_uid" if scope == "workload" else "project"
        return f"max (gpuwm_workload_idle_seconds{{{label}={quote(key)}}})"
    return None


def scope_labels(scope: str, key: str) -> dict[str, str]:
    return {"workload": {"workload_uid": key}, "project": {"project": key}, "node": {"node": key}}.get(
        scope, {}
    )
