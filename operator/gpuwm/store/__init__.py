"""Where figures are kept between intervals and read back by the API.

`open_store(spec)` picks the backend: a file path opens the embedded SQLite store, an
http(s):// URL the read-only Prometheus store.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuwm.store.base import (
    DEFAULT_METRICS,
    EXTREMES_METRIC_NAMES,
    MAX_POINTS_PER_SERIES,
    METRIC_INDEX,
    METRIC_NAMES,
    METRICS,
    TIME_AGGREGATIONS,
    Additive,
    Breakdown,
    GpuHourPrice,
    PeriodSums,
    QueryError,
    RangeQuery,
    ReadOnlyStoreError,
    Scope,
    Series,
    Store,
    StoreError,
    Stretch,
    TimeAggregation,
    WorkloadGroup,
    WorkloadPeriod,
    check_aggregation,
    utilized_gpu_seconds,
)


def open_store(
    spec: str,
    *,
    rollups: Sequence[str] = ("15s:2d", "5m:30d"),
    retention_seconds: float = 7 * 86400.0,
    timeout_seconds: float = 30.0,
    latest_rows_per_interval: int | None = None,
) -> Store:
    """Open the store named by `--store`: a file path (embedded) or an http(s):// Prometheus URL (read-only)."""
    if spec.startswith(("http://", "https://")):
        from gpuwm.store.prometheus import PrometheusStore

        return PrometheusStore(spec, timeout_seconds=timeout_seconds)
    if "://" in spec:
        raise StoreError(
            f"--store {spec!r}: unsupported scheme; use a file path or an http(s):// Prometheus URL"
        )
    from gpuwm.store.embedded import EmbeddedStore

    return EmbeddedStore(spec, tiers=list(rollups), retention_seconds=retention_seconds,
                         latest_rows_per_interval=latest_rows_per_interval)


__all__ = [
    "DEFAULT_METRICS", "EXTREMES_METRIC_NAMES", "MAX_POINTS_PER_SERIES", "METRICS", "METRIC_INDEX", "METRIC_NAMES",
    "TIME_AGGREGATIONS", "Additive", "Breakdown", "GpuHourPrice", "PeriodSums", "QueryError", "RangeQuery",
    "ReadOnlyStoreError", "Scope", "Series", "Store", "StoreError", "Stretch", "TimeAggregation", "WorkloadGroup",
    "WorkloadPeriod", "check_aggregation", "open_store", "utilized_gpu_seconds",
]
