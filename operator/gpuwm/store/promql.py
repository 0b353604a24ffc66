"""Translating API queries into PromQL over the agent's and the controller's `gpuwm_*` series."""

from __future__ import annotations

from gpuwm.model import STORED, Aggregation, Source

#: PromQL's operator for each of the catalogue's aggregations across devices
_OPERATOR = {Aggregation.SUM: "sum", Aggregation.MEAN: "avg", Aggregation.MAX: "max"}
#: at workload and project scope the engine's figure (the controller's series), at node and cluster scope
#: the devices' series: (how the devices' series aggregate, their series, the figure's series)
_FROM_FIGURES = {
    "gpu_energy_joules": ("sum", "gpuwm_gpu_energy_joules_total", "gpuwm_{scope}_energy_joules_total"),
    "gpu_idle_seconds": ("max", "gpuwm_gpu_idle_seconds", "gpuwm_workload_idle_seconds"),
}
#: the stored metrics read straight off the agent's per-device series, aggregated across devices
_AGENT_GPU = {
    metric.name: _OPERATOR[metric.aggregation]
    for metric in STORED
    if metric.series_help is not None and metric.source in (Source.GPU, Source.AGENT)
    and metric.aggregation in _OPERATOR and metric.name not in _FROM_FIGURES
}
#: the stored per-pod metrics, summed over pods, each from its series: the agent's `gpuwm_<name>` for the
#: kubelet's figures, the controller's `gpuwm_pod_<name>` for the pod spec's (`api/prom_metrics.py`)
_POD_SERIES = {
    metric.name: f"gpuwm_pod_{metric.name}" if metric.source is Source.POD_SPEC else f"gpuwm_{metric.name}"
    for metric in STORED
    if metric.field is not None and metric.source in (Source.POD, Source.POD_SPEC)
}
#: the engine's cumulative figures, which the controller exports as `gpuwm_workload_<name>_total` and
#: `gpuwm_project_<name>_total` (`api/prom_metrics.py`)
_FIGURES = frozenset(metric.name for metric in STORED if metric.source is Source.FIGURES)
#: the stored ratios: (numerator, denominator) of the device ratios and of the pod ratios
_DEVICE_RATIOS = {metric.name: metric.ratio_of for metric in STORED if metric.ratio_of and metric.source is Source.GPU}
_POD_RATIOS = {metric.name: metric.ratio_of for metric in STORED if metric.ratio_of and metric.source is Source.POD}
_BY_LABELS = {
    None: "",
    "gpu": "node, uuid, gpu, namespace, pod",
    "pod": "namespace, pod, node",
    "node": "node",
}
_INFO_LABELS = "namespace, pod, workload, workload_uid, project"
#: the label that holds a scope's key
KEY_LABEL = {"workload": "workload_uid", "project": "project", "node": "node"}


def quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _scoped(series: str, scope: str, key: str, narrow: str = "") -> str:
    """`series` restricted to the scope: joined to workloads through gpuwm_workload_pod_info where needed.

    `narrow` (label matchers such as `namespace=~"a|b"`) pre-filters the agent's series so that
    Prometheus does not load every GPU's series before the join throws most away.
    """
    if scope == "node":
        return f"{series}{{node={quote(key)}}}"
    if scope == "cluster":
        return series
    info = f"max by ({_INFO_LABELS}) (gpuwm_workload_pod_info{{{KEY_LABEL[scope]}={quote(key)}}})"
    left = f"{series}{{{narrow}}}" if narrow else series
    return f"({left} * on (namespace, pod) group_left (workload, workload_uid, project) {info})"


def promql(metric: str, scope: str, key: str, by: str | None, narrow: str = "") -> str | None:
    """The PromQL for one API metric over one scope and breakdown, or None where the series do not exist."""
    grouping = f" by ({_BY_LABELS[by]})" if by else ""
    if metric in _AGENT_GPU:
        return f"{_AGENT_GPU[metric]}{grouping} ({_scoped(f'gpuwm_{metric}', scope, key, narrow)})"
    if metric in _DEVICE_RATIOS:
        numerator, denominator = _DEVICE_RATIOS[metric]
        used = _scoped(f"gpuwm_{numerator}", scope, key, narrow)
        total = _scoped(f"gpuwm_{denominator}", scope, key, narrow)
        return f"100 * sum{grouping} ({used}) / sum{grouping} ({total})"
    if by == "gpu" and (metric in _POD_SERIES or metric in _POD_RATIOS):
        return None  # a pod's figures are not split among its devices
    if metric in _POD_SERIES:
        return f"sum{grouping} ({_scoped(_POD_SERIES[metric], scope, key, narrow)})"
    if metric in _POD_RATIOS:
        numerator, denominator = (_POD_SERIES[part] for part in _POD_RATIOS[metric])
        # both over the pods that have the two, matched pod by pod (as the embedded store counts)
        used = f"({_scoped(numerator, scope, key, narrow)} and on (namespace, pod) {denominator})"
        given = f"({_scoped(denominator, scope, key, narrow)} and on (namespace, pod) {numerator})"
        return f"100 * sum{grouping} ({used}) / (sum{grouping} ({given}) > 0)"
    if metric in _FIGURES:
        return _figure(metric, scope, key, by)
    if metric in _FROM_FIGURES:
        operator, device_series, figure_series = _FROM_FIGURES[metric]
        if scope in ("node", "cluster"):
            return f"{operator}{grouping} ({_scoped(device_series, scope, key, narrow)})"
        if by is not None:
            return None
        return f"max ({figure_series.format(scope=scope)}{{{KEY_LABEL[scope]}={quote(key)}}})"
    return None


def _figure(metric: str, scope: str, key: str, by: str | None) -> str | None:
    """The engine's cumulative figure of a workload or project (the controller's counter), or the cluster's
    (its projects' sum); a node, and any breakdown, has none."""
    if by is not None or scope == "node":
        return None
    if scope == "cluster":
        return f"sum (gpuwm_project_{metric}_total)"
    return f"max (gpuwm_{scope}_{metric}_total{{{KEY_LABEL[scope]}={quote(key)}}})"


def scope_labels(scope: str, key: str) -> dict[str, str]:
    return {KEY_LABEL[scope]: key} if scope in KEY_LABEL else {}
