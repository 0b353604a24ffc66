"""PromQL translation (pure): scopes, breakdowns, label escaping; runs without Prometheus."""

from __future__ import annotations

from gpuwm.store.promql import promql, quote


def test_quote_escapes_promql_strings() -> None:
    assert quote('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'


def test_workload_scope_joins_pod_info_and_narrows_the_agent_series() -> None:
    query = promql("gpu_utilization_percent", "workload", "uid-1", None, 'namespace=~"ns"')
    assert query == (
        'avg ((gpuwm_gpu_utilization_percent{namespace=~"ns"} * on (namespace, pod) group_left (workload, '
        "workload_uid, project) max by (namespace, pod, workload, workload_uid, project) "
        '(gpuwm_workload_pod_info{workload_uid="uid-1"})))'
    )


def test_node_and_cluster_scopes_and_breakdowns() -> None:
    assert promql("gpu_memory_used_bytes", "node", 'n"1', "gpu") == (
        'sum by (node, uuid, gpu, namespace, pod) (gpuwm_gpu_memory_used_bytes{node="n\\"1"})'
    )
    assert promql("gpu_allocated", "cluster", "", "node") == "sum by (node) (gpuwm_gpu_allocated)"
    assert promql("gpu_energy_joules", "cluster", "", None) == "sum (gpuwm_gpu_energy_joules_total)"
    assert (
        promql("gpu_idle_seconds", "project", "p", None) == 'max (gpuwm_workload_idle_seconds{project="p"})'
    )


def test_series_that_do_not_exist_translate_to_none() -> None:
    assert promql("cpu_usage_cores", "workload", "uid-1", "gpu") is None
    assert promql("gpu_energy_joules", "workload", "uid-1", "pod") is None
