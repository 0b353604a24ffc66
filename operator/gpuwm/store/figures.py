"""The engine's cumulative figures in the store: which columns they are and how a figures object fills them.

Allocated, active, idle, unmonitored and utilized GPU-seconds and energy (the catalogue's
`Source.FIGURES` metrics) of a workload, project or cluster, as its figures say at each interval. Kept
exactly in every tier (`Rollup.LAST`), they are what period reports difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from gpuwm.model import ClusterFigures, ProjectFigures, Source, WorkloadFigures
from gpuwm.store.base import METRIC_INDEX, METRICS
from gpuwm.store.codec import RESOLUTION

Figures = WorkloadFigures | ProjectFigures | ClusterFigures

#: the metric names, their store columns, and the field each is read from (None: `utilized_gpu_seconds`)
FIGURE_NAMES: tuple[str, ...] = tuple(metric.name for metric in METRICS if metric.source is Source.FIGURES)
FIGURE_COLUMNS: npt.NDArray[np.intp] = np.array([METRIC_INDEX[name] for name in FIGURE_NAMES], dtype=np.intp)
FIGURE_FIELDS: tuple[str | None, ...] = tuple(
    metric.field for metric in METRICS if metric.source is Source.FIGURES
)
#: each figure's resolution: stored integers per unit
FIGURE_RESOLUTION: npt.NDArray[np.float64] = RESOLUTION[FIGURE_COLUMNS]


#: the fields read of each figures object, the last one the lifetime utilisation (what `utilized` is made of)
_READ = attrgetter(*(name for name in FIGURE_FIELDS if name is not None), "utilization")
_ACTIVE, _IDLE = (FIGURE_NAMES.index(name) for name in ("active_gpu_seconds", "idle_gpu_seconds"))
_UTILIZED = FIGURE_FIELDS.index(None)


def figure_values(figures: Sequence[Figures]) -> npt.NDArray[np.float64]:
    """[len(figures), FIGURE_NAMES]: each one's cumulative values (`utilized_gpu_seconds` made of its
    active, idle and lifetime utilisation, for all of them at once: the store does this every interval)."""
    read = [_READ(each) for each in figures]
    fields = np.array([row[:-1] for row in read], dtype=np.float64).reshape(len(read), len(FIGURE_NAMES) - 1)
    lifetime = np.array([row[-1].lifetime for row in read], dtype=np.float64)  # None: NaN
    values = np.insert(fields, _UTILIZED, 0.0, axis=1)
    monitored = values[:, _ACTIVE] + values[:, _IDLE]
    values[:, _UTILIZED] = np.where(np.isnan(lifetime), 0.0, monitored * lifetime / 100.0)
    return values


def stored_values(values: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """`figure_values` as the store keeps them: integers in each figure's resolution (what `quantize` makes)."""
    return np.rint(values * FIGURE_RESOLUTION).astype(np.int64)
