"""How a series' value is made of its parts, for every series of an interval at once.

A *part* is a device as held by one holder (or by nobody, or a device as a whole); a series is made
of the parts its (series, part) *pairs* name. Utilisation is the mean weighted by units held (node and
cluster: every device alike, so an idle unallocated device pulls the fleet's figure down); bytes, watts
and PCIe rates are summed, a shared device counting by share; temperature is the hottest device;
clocks are means; memory utilisation is used / total; pod stats are summed over the series' pods.
Each is a numpy reduction over the pairs, adding the terms in the order a part-by-part loop would
(tests/unit/store/reference_rows.py is that loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import repeat

import numpy as np
import numpy.typing as npt

from gpuwm.model import Aggregation, PodResources, PodStatsSample, Source
from gpuwm.store.base import METRIC_INDEX, METRIC_NAMES, METRICS

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# The catalogue's stored metrics by how a series' value is made of its parts (tests/unit/model/
# test_metric_catalogue.py checks every stored metric gets a value). Made apart, by name: utilisation
# (weighted by units held), energy (each physical GPU's counter once; the workload's own figure), idle
# seconds (the workloads' figures), GPU units held, and the ratios.
_OWN_RULE = frozenset({"gpu_utilization_percent", "gpu_energy_joules", "gpu_idle_seconds", "gpu_allocated"})
_DEVICE = [metric for metric in METRICS if metric.source is Source.GPU and metric.name not in _OWN_RULE]
#: device figures summed, a shared device counting by share (memory, power, PCIe)
_BY_SHARE = [metric for metric in _DEVICE if metric.aggregation is Aggregation.SUM]
#: device figures whose largest counts (temperature), and whose mean counts (clocks)
_DEVICE_MAX = [metric for metric in _DEVICE if metric.aggregation is Aggregation.MAX]
_DEVICE_MEAN = [metric for metric in _DEVICE if metric.aggregation is Aggregation.MEAN]
#: the device ratio (memory utilisation): (its column, the numerator's and denominator's columns)
_DEVICE_RATIOS = [
    (METRIC_INDEX[metric.name], *(METRIC_INDEX[part] for part in metric.ratio_of))
    for metric in _DEVICE if metric.ratio_of is not None
]
#: per sample, the fields read (`SampleFigures`): those summed by share, the maxima, the means, then SM %,
#: energy and device units
SAMPLE_FIELDS = (
    *(str(metric.field) for metric in (*_BY_SHARE, *_DEVICE_MAX, *_DEVICE_MEAN)),
    "sm_percent",
    "energy_joules",
    "device_units",
)
SM, ENERGY, UNITS = (SAMPLE_FIELDS.index(name) for name in ("sm_percent", "energy_joules", "device_units"))
_POD_STATS = tuple(str(metric.field) for metric in METRICS if metric.source is Source.POD and metric.field)
#: (metric, `PodResources` field) from the pod spec (`PodFigures.resources`), summed as the stats are
_POD_RESOURCES = tuple((metric.name, str(metric.field)) for metric in METRICS if metric.source is Source.POD_SPEC)
#: the metrics summed over a series' pods, in the order of `pod_host_row`'s first values
POD_SUMMED: tuple[str, ...] = (*_POD_STATS, *(metric for metric, _ in _POD_RESOURCES))
#: (metric, numerator, denominator) of the pod ratios (CPU use as percent of the request, of the limit): over
#: the pods that have a denominator, so a pod without a limit adds neither its use nor a limit
#: (`pod_host_row`'s last values are the numerator where the pod has each denominator)
_POD_RATIOS = tuple(
    (metric.name, *metric.ratio_of) for metric in METRICS if metric.source is Source.POD and metric.ratio_of
)
_RATIO_PARTS = tuple((POD_SUMMED.index(numerator), POD_SUMMED.index(denominator)) for _, numerator, denominator in _POD_RATIOS)


def pod_host_row(stat: PodStatsSample, resources: PodResources | None) -> tuple[float | None, ...]:
    """One pod's host figures: `POD_SUMMED`, then each pod ratio's numerator where the pod has its denominator."""
    summed = (
        *[getattr(stat, name) for name in _POD_STATS],
        *[None if resources is None else getattr(resources, field) for _, field in _POD_RESOURCES],
    )
    return (*summed, *(summed[numerator] if summed[denominator] else None for numerator, denominator in _RATIO_PARTS))


def as_array(rows: list[tuple[float | None, ...]], width: int) -> FloatArray:
    """Rows of `width` values (None: NaN) as one array, [len(rows), width] also when there are none."""
    return np.array(rows, dtype=np.float64).reshape(len(rows), width)


@dataclass
class Parts:
    """Per part: its sample's row (-1: none), units held, share of the device, utilisation (NaN: none)."""

    sample: IntArray
    units: FloatArray
    share: FloatArray
    util: FloatArray


@dataclass
class Pairs:
    """Every (series, part) pair of an interval: the series' row and the part, and how many pairs each series has."""

    series: IntArray
    parts: IntArray
    count: int  # series

    def sums(self, terms: FloatArray) -> tuple[FloatArray, IntArray]:
        """Per series: the sum of its pairs' non-NaN `terms`, and how many there are.

        A NaN term is added as 0.0 (x + 0.0 is x: the sums are those of the non-NaN terms, in pair order)."""
        missing = np.isnan(terms)
        total = np.bincount(self.series, weights=np.where(missing, 0.0, terms), minlength=self.count)
        seen = np.bincount(self.series, minlength=self.count) - np.bincount(self.series[missing], minlength=self.count)
        return total.astype(np.float64, copy=False), seen

    def sums_of_parts(self, part_terms: FloatArray) -> tuple[FloatArray, IntArray]:
        """`sums` of a term per part, each pair taking its part's."""
        return self.sums(part_terms[self.parts])

    def largest_of_parts(self, part_terms: FloatArray) -> FloatArray:
        """Per series the largest of its parts' terms, NaN where it has none (or only NaN ones)."""
        terms = np.nan_to_num(part_terms[self.parts], nan=-np.inf, posinf=np.inf, neginf=-np.inf)
        largest = np.full(self.count, -np.inf)
        np.maximum.at(largest, self.series, terms)
        return np.where(np.isinf(largest), np.nan, largest)


def aggregate(per_device_series: npt.NDArray[np.bool_], columns: FloatArray, parts: Parts, pairs: Pairs) -> FloatArray:
    """The device figures of every series from its parts (energy, idle and pod stats are the caller's).

    `columns[field, row]`: the samples' `SAMPLE_FIELDS`, with a last column of NaN for parts without one.
    """
    values = np.full((pairs.count, len(METRIC_NAMES)), np.nan)
    units = parts.units[pairs.parts]
    values[:, METRIC_INDEX["gpu_allocated"]] = np.bincount(pairs.series, weights=units, minlength=pairs.count)
    # utilisation weighted by the units each holder holds (a whole device counts 1 where no one holds it);
    # every device alike in node and cluster series
    weight = np.where(per_device_series[pairs.series] | (units <= 0), 1.0, units)
    util = parts.util[pairs.parts]
    weighted, _ = pairs.sums(util * weight)
    weights, _ = pairs.sums(np.where(np.isnan(util), np.nan, weight))
    values[:, METRIC_INDEX["gpu_utilization_percent"]] = _mean(weighted, weights)
    sample = parts.sample  # -1 (no sample): the NaN column
    for position, metric in enumerate(_BY_SHARE):
        values[:, METRIC_INDEX[metric.name]] = _where_seen(*pairs.sums_of_parts(columns[position][sample] * parts.share))
    for column, numerator, denominator in _DEVICE_RATIOS:
        values[:, column] = _percent_of(values[:, numerator], values[:, denominator])
    for position, metric in enumerate(_DEVICE_MAX, start=len(_BY_SHARE)):
        values[:, METRIC_INDEX[metric.name]] = pairs.largest_of_parts(columns[position][sample])
    for position, metric in enumerate(_DEVICE_MEAN, start=len(_BY_SHARE) + len(_DEVICE_MAX)):
        values[:, METRIC_INDEX[metric.name]] = _mean(*pairs.sums_of_parts(columns[position][sample]))
    return values


def sum_once_per_physical(
    target: FloatArray, holders: IntArray, physical: IntArray, counters: FloatArray, physical_count: int
) -> None:
    """target[s] = the sum over s's physical GPUs of their counter (the last one seen of each),
    added in the order the GPUs were first seen (as a dict of them would)."""
    if not len(holders):
        return
    keys = holders * physical_count + physical
    unique, first = np.unique(keys, return_index=True)
    _, last_reversed = np.unique(keys[::-1], return_index=True)
    last = len(keys) - 1 - last_reversed
    order = np.argsort(first, kind="stable")
    owners = unique[order] // physical_count
    sums = np.bincount(owners, weights=counters[last[order]], minlength=len(target))
    present = np.bincount(owners, minlength=len(target)) > 0
    target[present] = sums[present]


def _where_seen(total: FloatArray, seen: IntArray) -> FloatArray:
    """A series' sum where it has a term, NaN where it has none."""
    return np.where(seen > 0, total, np.nan)


def _mean(total: FloatArray, weight: FloatArray | IntArray) -> FloatArray:
    """total / weight where the weight is above 0, NaN elsewhere."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(weight > 0, total / weight, np.nan)


def _percent_of(used: FloatArray, total: FloatArray) -> FloatArray:
    """used as percent of total, at most 100, NaN where either is NaN or total is 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.minimum(100.0, 100.0 * used / total)
    return np.where(~np.isnan(used) & ~np.isnan(total) & (total != 0), ratio, np.nan)


def sum_pod_stats(
    member_series: IntArray, member_uids: list[str], stats_by_pod: dict[str, PodStatsSample],
    resources_by_pod: Mapping[str, PodResources], values: FloatArray,
) -> None:
    """Pod stats and spec figures summed over each series' pods (gpu series have none), None where
    none of its pods has one; CPU use as percent of the requests and limits of the pods that have them."""
    pod_row = {uid: row for row, uid in enumerate(stats_by_pod)}
    width = len(POD_SUMMED) + len(_POD_RATIOS)
    stats = as_array([pod_host_row(stat, resources_by_pod.get(uid)) for uid, stat in stats_by_pod.items()], width)
    rows = np.fromiter(map(pod_row.get, member_uids, repeat(-1)), dtype=np.int64, count=len(member_uids))
    kept = rows >= 0
    if not kept.any():
        return
    pods = Pairs(series=member_series[kept], parts=rows[kept], count=len(values))

    def total(position: int) -> FloatArray:
        """Per series the sum of its pods' figure `position`, NaN where none of them has it."""
        return _where_seen(*pods.sums_of_parts(stats[:, position]))

    totals = {position: total(position) for position in range(len(POD_SUMMED))}
    for position, name in enumerate(POD_SUMMED):
        column = METRIC_INDEX[name]
        values[:, column] = np.where(np.isnan(totals[position]), values[:, column], totals[position])
    for offset, ((name, _, _), (_, denominator)) in enumerate(zip(_POD_RATIOS, _RATIO_PARTS, strict=True)):
        used, given = total(len(POD_SUMMED) + offset), totals[denominator]
        with np.errstate(invalid="ignore", divide="ignore"):
            values[:, METRIC_INDEX[name]] = np.where(given > 0, 100.0 * used / given, np.nan)
