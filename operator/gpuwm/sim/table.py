"""The demo's terminal view: a `kubectl get gpuworkloadmetrics`-like table and a cluster line."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpuwm.model import ClusterFigures, WorkloadFigures

COLUMNS = ("NAMESPACE", "NAME", "PROJECT", "GPUS", "UTIL", "MEM", "IDLE", "WASTED-GPU-H", "AGE")
NAME_COLUMNS = frozenset({"NAMESPACE", "NAME", "PROJECT"})


def short_duration(seconds: float) -> str:
    """kubectl's age style: 45s, 12m, 3h5m, 2d4h."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, _ = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def workload_row(figures: WorkloadFigures, now: float) -> tuple[str, ...]:
    """One row, with the CRD's printer columns (Util and Mem are the 5-minute means)."""
    created = figures.created_time if figures.created_time is not None else figures.start_time
    return (
        figures.namespace,
        figures.name,
        figures.project,
        f"{figures.allocated_gpus:.3g}",
        _percent(figures.utilization.avg5m),
        _percent(figures.memory_utilization.avg5m),
        short_duration(figures.idle_seconds),
        f"{figures.idle_gpu_seconds / 3600.0:.2f}",
        short_duration(now - created) if created is not None else "-",
    )


def visible_workloads(workloads: list[WorkloadFigures], limit: int) -> tuple[list[WorkloadFigures], int]:
    """Those holding GPUs or waiting for them, holders first; and how many were left out."""
    current = [w for w in workloads if w.allocated_gpus > 0 or w.phase in ("Queued", "Pending")]
    current.sort(key=lambda w: (w.allocated_gpus <= 0, w.namespace, w.name))
    return current[:limit], max(0, len(current) - limit)


def cluster_line(cluster: ClusterFigures | None) -> str:
    if cluster is None:
        return "no figures yet"
    return (
        f"GPUs {cluster.allocated_gpus:.1f} of {cluster.total_gpu_units:.0f} units allocated, "
        f"{cluster.idle_gpus:.1f} idle now | workloads {cluster.running_workloads} running of {cluster.workloads} | "
        f"active {cluster.active_gpu_seconds / 3600:.1f} GPU-h, idle {cluster.idle_gpu_seconds / 3600:.1f} GPU-h, "
        f"unmonitored {cluster.unmonitored_gpu_seconds / 3600:.1f} GPU-h"
    )


def truth_line(truth: Mapping[str, Any] | None, workloads: list[WorkloadFigures]) -> str:
    """What gpuwm reports against what the simulator generated, over the workloads both know: the
    simulator knows each workload's exact GPU-seconds (`gpuwm.sim.truth`), the figures shown come from the
    samples alone, and the two should agree to rounding."""
    if not truth:
        return "ground truth: not yet"
    reported = {(figures.namespace, figures.name): figures for figures in workloads}
    truth_seconds = reported_seconds = largest = 0.0
    compared = 0
    for expected in truth.get("workloads", []):
        figures = reported.get((expected["namespace"], expected["name"]))
        if figures is None:
            continue
        compared += 1
        truth_seconds += expected["allocatedGpuSeconds"]
        reported_seconds += figures.allocated_gpu_seconds
        # the largest gap in any workload's GPU-seconds of any kind, as the dashboard computes it
        for field, value in (("allocatedGpuSeconds", figures.allocated_gpu_seconds),
                             ("activeGpuSeconds", figures.active_gpu_seconds),
                             ("idleGpuSeconds", figures.idle_gpu_seconds),
                             ("unmonitoredGpuSeconds", figures.unmonitored_gpu_seconds)):
            largest = max(largest, abs(expected[field] - value))
    return (f"ground truth: {truth_seconds / 3600:.2f} GPU-h allocated in {compared} workloads, "
            f"{reported_seconds / 3600:.2f} reported; largest gap {largest:.3f} GPU-s (/demo/truth)")


def clock_text(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render(
    header: str, workloads: list[WorkloadFigures], cluster: ClusterFigures | None, now: float, max_rows: int,
    footer: str | None = None,
) -> RenderableType:
    """Header line, the workload table (at most `max_rows` rows), the cluster summary and `footer`."""
    rows, hidden = visible_workloads(workloads, max_rows)
    cells = [workload_row(figures, now) for figures in rows]
    table = Table(box=None, pad_edge=False, header_style="bold")
    for index, column in enumerate(COLUMNS):
        # on a narrow terminal only the names shrink (with an ellipsis); a figure is never cut
        widest = max([len(column), *(len(row[index]) for row in cells)])
        table.add_column(column, justify="right" if column in {"GPUS", "UTIL", "MEM", "WASTED-GPU-H"} else "left",
                         no_wrap=column not in NAME_COLUMNS, overflow="ellipsis",
                         min_width=None if column in NAME_COLUMNS else widest)
    for figures, row in zip(rows, cells, strict=True):
        style = "yellow" if figures.allocated_gpus > 0 and figures.idle_seconds >= 600 else None
        table.add_row(*row, style=style)
    parts: list[RenderableType] = [Text(header, style="bold"), table]
    if hidden:
        parts.append(Text(f"... {hidden} more (see the dashboard)", style="dim"))
    parts.append(Text(cluster_line(cluster), style="cyan"))
    if footer:
        parts.append(Text(footer, style="dim"))
    return Group(*parts)
