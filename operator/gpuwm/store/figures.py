"""The engine's cumulative figures in the store: which columns they are and how a figures object fills them.

Allocated, active, idle, unmonitored and utilized GPU-seconds and energy (the catalogue's
`Source.FIGURES` metrics) of a workload, project or cluster, as its figures say at each interval. Kept
exactly in every tier (`Rollup.LAST`), they are what period reports difference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gpuwm.model import ClusterFigures, ProjectFigures, Source, WorkloadFigures
from gpuwm.store.base import METRIC_INDEX, METRICS, utilized_gpu_seconds
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


def figure_floats(figures: Figures) -> tuple[float, ...]:
    """The figures' cumulative values in FIGURE_NAMES order."""
    return tuple(utilized_gpu_seconds(figures) if name is None else float(getattr(figures, name))
                 for name in FIGURE_FIELDS)


def figure_values(figures: Sequence[Figures]) -> npt.NDArray[np.float64]:
    """[len(figures), FIGURE_NAMES]: each one's cumulative values."""
    return np.array([figure_floats(each) for each in figures], dtype=np.float64).reshape(len(figures), len(FIGURE_NAMES))


def figure_row(figures: Figures) -> tuple[int, ...]:
    """The cumulative values as the store keeps them: integers in each figure's resolution."""
    return tuple(round(value * resolution) for value, resolution in zip(figure_floats(figures), FIGURE_RESOLUTION,
                                                                           strict=True))
