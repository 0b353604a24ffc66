"""The store interface: what the controller writes each interval and what the API reads.

Two backends implement it: `EmbeddedStore` (SQLite, read-write) and `PrometheusStore`
(read-only PromQL over the agent's and controller's `gpuwm_*` series).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Literal, Self

from gpuwm.model import (
    STORED,
    ClusterFigures,
    LatestSample,
    Metric,
    PodStatsSample,
    ProjectFigures,
    WorkloadFigures,
)
from gpuwm.model import Rollup as Rollup

#: at most this many points per series, like Prometheus' query_range limit
MAX_POINTS_PER_SERIES = 11_000
#: a breakdown that would return more series than this is refused (narrow it down instead)
MAX_SERIES_PER_QUERY = 2_000


class StoreError(RuntimeError):
    """The store cannot be opened or used; the message names the file or URL and what would fix it."""


class ReadOnlyStoreError(StoreError):
    """A write to a read-only backend (Prometheus)."""


class QueryError(ValueError):
    """A query the store cannot answer; `parameter` names the API parameter at fault (HTTP 400)."""

    def __init__(self, parameter: str, message: str) -> None:
        self.parameter = parameter
        super().__init__(f"{parameter}: {message}")


Scope = Literal["workload", "project", "node", "cluster"]
Breakdown = Literal["gpu", "pod", "node"]
#: what a range answer's cell holds of the values in [t, t + step): their mean, or the least or largest of
#: them (a roll-up bucket's own min and max where a coarse tier answers). A counter's, a peak's or an engine
#: figure's cells hold its largest (latest) value with `mean` and `max` alike; `min` applies to gauges only
TimeAggregation = Literal["mean", "min", "max"]
TIME_AGGREGATIONS: tuple[str, ...] = ("mean", "min", "max")


#: DESIGN §5 metric names, in the embedded store's column order: the catalogue's stored metrics
METRICS: tuple[Metric, ...] = STORED
METRIC_NAMES: tuple[str, ...] = tuple(metric.name for metric in METRICS)
METRIC_INDEX: dict[str, int] = {name: index for index, name in enumerate(METRIC_NAMES)}
DEFAULT_METRICS: tuple[str, ...] = (
    "gpu_utilization_percent",
    "gpu_memory_used_bytes",
    "gpu_power_watts",
    "gpu_allocated",
)


@dataclass
class Series:
    """One metric of one series: `points` are `(t, value or None)` on the query's grid."""

    metric: str
    labels: dict[str, str]
    points: list[tuple[float, float | None]] = field(default_factory=list)


@dataclass(frozen=True)
class Stretch:
    """A part of a range's grid, [start, end), whose values really have `step_seconds` between them: the
    query's step where the store keeps points that fine, the coarser tier's step where only it covers;
    `tier` names the tier read there (`STEP:KEEP`; None where the backend has no tiers or nothing is kept)."""

    start: float
    end: float
    step_seconds: float
    tier: str | None = None


@dataclass(frozen=True)
class RangeQuery:
    """A time-series query as the API parsed it (times in epoch seconds)."""

    scope: Scope
    key: str  # workload uid, project name, node name, or "" for the cluster
    metrics: tuple[str, ...]
    start: float
    end: float
    step_seconds: float
    by: Breakdown | None = None
    #: only these pods (by name) of the workload: its `pod` (or, with by=gpu, `gpu`) series of them
    pods: tuple[str, ...] = ()
    #: the step the client asked for, where the answer's step is coarser (the stored resolution)
    requested_step_seconds: float | None = None
    #: the step each stretch of the grid really has (`Store.resolution`), once the API has asked
    resolution: tuple[Stretch, ...] = ()
    #: what each cell holds of the values in it (`TimeAggregation`)
    aggregation: TimeAggregation = "mean"

    def grid(self) -> list[float]:
        """The point times: start, start+step, ... up to end."""
        count = int((self.end - self.start) // self.step_seconds) + 1
        return [self.start + index * self.step_seconds for index in range(count)]


@dataclass(frozen=True)
class Additive:
    """Figures that add up field by field, over runs and over periods (a period's sums, what they cost)."""

    def plus(self, other: Self) -> Self:
        sums = {each.name: getattr(self, each.name) + getattr(other, each.name) for each in fields(self)}
        return replace(self, **sums)


@dataclass(frozen=True)
class PeriodSums(Additive):
    """The engine's additive figures over a period: the differences of its cumulative figures (the names of
    the catalogue's `Source.FIGURES` metrics)."""

    allocated_gpu_seconds: float = 0.0
    active_gpu_seconds: float = 0.0
    idle_gpu_seconds: float = 0.0
    unmonitored_gpu_seconds: float = 0.0
    #: active + idle GPU-seconds weighted by SM utilisation: / (active + idle) is the period's mean utilisation
    utilized_gpu_seconds: float = 0.0
    energy_joules: float = 0.0


@dataclass(frozen=True)
class WorkloadPeriod:
    """One workload over a period: what it held and accrued in it, as the store keeps it.

    `apportioned_gpu_seconds`: the part of `sums.allocated_gpu_seconds` not known at the status interval
    but apportioned by time (a period edge inside a coarse bucket, or what the workload accrued before the
    store first saw it); 0 where the figures are the engine's own, to the stored resolution."""

    uid: str
    namespace: str
    name: str
    project: str
    kind: str | None
    sums: PeriodSums
    #: the most GPU units it held at one status interval of the period
    peak_allocated_gpus: float
    apportioned_gpu_seconds: float = 0.0


@dataclass(frozen=True)
class GpuHourPrice:
    """A run's price of one GPU-hour as the controller priced it (`gpuwm.accounting.CostMeter.rate`: the
    units-weighted mean over the devices it held, by node label, GPU model or the default), in `currency`.
    A slice or a replica pays its units' share of it: its GPU-seconds are units x seconds."""

    price_per_gpu_hour: float
    currency: str


@dataclass(frozen=True)
class WorkloadGroup:
    """Workloads chosen by their labels, for a peak: of `project` (None: any), in `namespaces` (None: any).

    A report's row is such a group (a project's or a namespace's workloads, all of them), narrowed to the
    namespaces its reader may see: named by labels, a group of thousands of workloads is a short query."""

    project: str | None = None
    namespaces: frozenset[str] | None = None

    def holds(self, namespace: str, project: str) -> bool:
        return (self.project is None or project == self.project) and (
            self.namespaces is None or namespace in self.namespaces)


def check_range(query: RangeQuery) -> None:
    """Raise QueryError naming the parameter when the range or step cannot be answered."""
    if query.step_seconds <= 0:
        raise QueryError("step", "must be a positive duration such as 15s, 1m or 30")
    if query.end < query.start:
        raise QueryError("end", f"is before start ({query.end} < {query.start})")
    points = int((query.end - query.start) // query.step_seconds) + 1
    if points > MAX_POINTS_PER_SERIES:
        raise QueryError(
            "step",
            f"{points} points per series exceeds the limit of {MAX_POINTS_PER_SERIES}; use a coarser step or a shorter range",
        )
    for name in query.metrics:
        if name not in METRIC_INDEX:
            raise QueryError("metric", f"unknown metric {name!r}; known: {', '.join(METRIC_NAMES)}")
    check_aggregation(query.aggregation, query.metrics)


#: the gauges whose roll-ups keep each bucket's min and max (`Metric.rollup_extremes`): the only gauges a
#: range query may ask `aggregation=min` or `max` of
EXTREMES_METRIC_NAMES: tuple[str, ...] = tuple(metric.name for metric in METRICS if metric.rollup_extremes)


def check_aggregation(aggregation: str, metrics: Sequence[str]) -> None:
    """Raise QueryError naming `aggregation` when it is not one of TIME_AGGREGATIONS, or is `min` or `max` of a
    gauge whose roll-ups keep no extremes (their buckets hold the mean only), or `min` of a counter or peak (its
    points are its latest value: their least says nothing)."""
    if aggregation not in TIME_AGGREGATIONS:
        raise QueryError("aggregation", f"{aggregation!r} is not one of {', '.join(TIME_AGGREGATIONS)}")
    if aggregation == "mean":
        return
    for name in metrics:
        metric = METRICS[METRIC_INDEX[name]]
        if metric.rollup is Rollup.MEAN and not metric.rollup_extremes:
            raise QueryError(
                "aggregation",
                f"{aggregation} is kept for {', '.join(EXTREMES_METRIC_NAMES)} only; the store keeps {name}'s "
                "mean per interval, not its min and max (ask aggregation=mean for it, or query it apart)",
            )
        if aggregation == "min" and metric.rollup is not Rollup.MEAN:
            what = "cumulative figure" if metric.rollup is Rollup.LAST else "counter or growing duration"
            raise QueryError(
                "aggregation",
                f"min applies to gauges only; {name} is a {what}, whose cells hold its largest (latest) value "
                "(ask aggregation=max or mean for it, or query it apart)",
            )


def utilized_gpu_seconds(figures: WorkloadFigures | ProjectFigures | ClusterFigures) -> float:
    """Monitored GPU-seconds weighted by SM utilisation: (active + idle) x the lifetime utilisation / 100.

    Over a period, its difference divided by the period's active + idle GPU-seconds is the period's
    mean utilisation (what the engine's lifetime figure is over the whole life)."""
    lifetime = figures.utilization.lifetime
    monitored = figures.active_gpu_seconds + figures.idle_gpu_seconds
    return 0.0 if lifetime is None else monitored * lifetime / 100.0


def latest_value(points: Sequence[tuple[float, float | None]]) -> float | None:
    """The value of the latest non-null point, or None."""
    return next((value for _, value in reversed(points) if value is not None), None)


class Store(abc.ABC):
    """One interface over the embedded and Prometheus backends."""

    #: the finest step the backend keeps points at (None: it cannot tell); a finer step is answered at this one
    finest_step_seconds: float | None = None
    #: how many reads the API runs at once (None: as many as its worker threads). The embedded
    #: store keeps a connection, page cache and file mapping per reading thread, so a burst of 40
    #: concurrent queries would hold 40 of each; more readers than cores buys no speed there.
    concurrent_reads: int | None = None

    @abc.abstractmethod
    def record(
        self,
        at: float,
        samples: Sequence[LatestSample],
        workloads: Sequence[WorkloadFigures],
        projects: Sequence[ProjectFigures],
        cluster: ClusterFigures,
        pod_stats: Sequence[PodStatsSample] = (),
    ) -> None:
        """Keep the figures of one status interval ending at `at` (epoch seconds)."""

    @abc.abstractmethod
    def workloads(self) -> list[WorkloadFigures]:
        """The latest figures of every workload still kept."""

    @abc.abstractmethod
    def workload(self, namespace: str, name: str) -> WorkloadFigures | None:
        """The latest figures of one workload, or None if unknown."""

    @abc.abstractmethod
    def projects(self) -> list[ProjectFigures]:
        """The latest figures of every project."""

    @abc.abstractmethod
    def project(self, name: str) -> ProjectFigures | None:
        """The latest figures of one project, or None if unknown."""

    @abc.abstractmethod
    def cluster(self) -> ClusterFigures | None:
        """The latest cluster figures, or None before the first interval."""

    @abc.abstractmethod
    def nodes(self) -> list[str]:
        """Nodes with data."""

    @abc.abstractmethod
    def latest_time(self) -> float | None:
        """Time of the latest data, or None when empty."""

    @abc.abstractmethod
    def earliest_time(self) -> float | None:
        """Time of the oldest data still kept, or None when empty."""

    @abc.abstractmethod
    def query_range(self, query: RangeQuery) -> list[Series]:
        """Series for `query`, one per metric (and per breakdown label set), points on `query.grid()`."""

    def resolution(self, query: RangeQuery) -> list[Stretch]:
        """Which step each stretch of `query`'s range really has (see `Stretch`); a backend without
        tiers answers every cell at the query's step."""
        return [Stretch(query.start, query.end, query.step_seconds)]

    def workload_by_uid(self, uid: str) -> WorkloadFigures | None:
        """The latest figures of one run of a workload, by its UID (any run still kept, ended ones too)."""
        return next((w for w in self.runs() if w.uid == uid), None)

    def runs(self) -> list[WorkloadFigures]:
        """Every run kept, including earlier runs of a reused name, ordered by (namespace, name, start)."""
        return self.workloads()

    def latest_by_workload(
        self, uids: Sequence[str], metrics: tuple[str, ...], start: float, end: float, step_seconds: float
    ) -> dict[str, dict[str, float]]:
        """Each workload's latest value of each of `metrics` in [start, end] on a `step_seconds` grid (uid ->
        metric -> value; a workload or metric without a point there is left out), for readers that want
        every running workload's latest figure at once (the Run:ai names, at every scrape).

        The plain version: one range query per workload. A backend that can read them all in one query
        overrides it (`tests/unit/store/test_latest_by_workload.py` holds the two equal)."""
        found: dict[str, dict[str, float]] = {}
        for uid in uids:
            series = self.query_range(RangeQuery("workload", uid, metrics, start, end, step_seconds))
            values = {s.metric: value for s in series if (value := latest_value(s.points)) is not None}
            if values:
                found[uid] = values
        return found

    def period(self, start: float, end: float) -> list[WorkloadPeriod]:
        """The workloads that held GPUs or accrued GPU-seconds in [start, end), each with its sums there: the
        engine's cumulative figures before `end` minus those before `start`, at the status interval's
        resolution where the store keeps it (a period that ends at or after the latest time holds everything)."""
        raise StoreError(f"{type(self).__name__} keeps no period figures")

    def peak_allocated(self, start: float, end: float, groups: Mapping[str, WorkloadGroup]) -> dict[str, float]:
        """Per group: the most GPU units its workloads held together at one status interval of [start, end)."""
        raise StoreError(f"{type(self).__name__} keeps no period figures")

    def record_prices(self, at: float, prices: Mapping[str, GpuHourPrice]) -> None:  # noqa: B027 - see below
        """Keep each run's price per GPU-hour as of `at` (uid -> price), where it changed. A backend that reads
        the controller's exported series (Prometheus: `gpuwm_workload_gpu_hourly_cost`) keeps nothing here."""

    def gpu_hour_prices(self, uids: Sequence[str], start: float, end: float) -> dict[str, GpuHourPrice]:
        """The prices of the runs `uids` for the period [start, end): each one's price as recorded last by
        `end`, else the first recorded after it; a run never priced is left out."""
        return {}

    def series_count(self, query: RangeQuery) -> int | None:
        """How many label sets `query` can answer with (an upper bound, known before any point is read),
        or None where the backend cannot tell cheaply (the API then checks the size after the read)."""
        return len(query.metrics) if query.by is None else None

    def forget_workload(self, uid: str) -> None:  # noqa: B027 - read-only backends keep nothing to forget
        """Drop a workload's latest figures after its retention (its points age out with the tiers)."""

    def close(self) -> None:  # noqa: B027 - a backend without resources needs nothing here
        """Release files and connections."""
