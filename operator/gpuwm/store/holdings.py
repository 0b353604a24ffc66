"""Who held how many GPU units when: the step functions behind a period's workloads and peaks.

The embedded store writes a `holdings` row (the workload's series id, the interval's bucket, the units
it held then, its allocatedGpuSeconds then) when a workload's units held change, and when it accrues
GPU-seconds while holding none at the interval (a pod that ran between two intervals): a workload that
keeps its units writes nothing. Its units at any interval are the last row's at or before it, so a
period's workloads are those with a row inside it or units held when it begins, a workload's peak is
the largest of those units, and a group's peak (a namespace, a project, the fleet, or the part of them
a reader may see) is the largest sum of its workloads' units at one interval, found by sweeping their
rows in time order: exact at the status interval, whichever tier holds the counters.

`openings` keeps what a workload had accrued before the store first saw it (its series' first point
carries that whole history): a store migrated from a schema without counters, or a new file beside a
running controller. A report apportions it over the workload's life before then (`periods.py`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuwm.model import WorkloadFigures
from gpuwm.store.codec import RESOLUTION
from gpuwm.store.figures import FIGURE_COLUMNS, FIGURE_FIELDS, figure_row

#: rows per statement where a query names series ids (well below SQLite's variable limit)
_BATCH = 500
#: the store's resolution of allocated GPU-seconds (integers), as its chunks keep them
_ALLOCATED_RESOLUTION = float(RESOLUTION[FIGURE_COLUMNS[FIGURE_FIELDS.index("allocated_gpu_seconds")]])
#: below any edge a period can have: "before everything"
FIRST = -(2**62)
#: above any edge: "after everything"
LAST = 2**62


@dataclass(frozen=True)
class Held:
    """A workload's state as its last row says: units held, and allocated GPU-seconds (store resolution)."""

    units: float
    allocated: int


@dataclass(frozen=True)
class Opening:
    """What a workload had accrued when the store first saw it at bucket `t`, since it began (`since`)."""

    t: int
    since: float
    figures: tuple[int, ...]  # in FIGURE_COLUMNS order, the store's resolution


@dataclass
class Steps:
    """One workload's units held over a period: in force when it begins, then each change inside it."""

    at_start: float = 0.0
    changes: list[tuple[int, float]] = field(default_factory=list)

    def peak(self) -> float:
        return max([self.at_start, *(units for _, units in self.changes)])


def allocated_of(figures: WorkloadFigures) -> int:
    """allocatedGpuSeconds in the store's resolution (what its chunks keep)."""
    return round(figures.allocated_gpu_seconds * _ALLOCATED_RESOLUTION)


def _batches(ids: Sequence[int]) -> Iterable[list[int]]:
    for offset in range(0, len(ids), _BATCH):
        yield list(ids[offset : offset + _BATCH])


class HoldingsWriter:
    """Writes `holdings` and `openings` rows inside the store's write transactions.

    Keeps each reported workload's last state; a workload it has not seen is looked up in the file (its
    last row), so a store reopened goes on where it stopped, and one with no row at all is new to the store.
    """

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection
        self._state: dict[int, Held] = {}
        self.reload()

    def reload(self) -> None:
        """What the file says (when opened, and after a rolled-back write): the workloads holding units."""
        rows = self._connection.execute(
            "SELECT series_id, units, allocated, max(t) FROM holdings GROUP BY series_id HAVING units > 0")
        self._state = {series_id: Held(units, allocated) for series_id, units, allocated, _ in rows}

    def _last_rows(self, series_ids: Sequence[int]) -> dict[int, Held]:
        found: dict[int, Held] = {}
        for batch in _batches(series_ids):
            rows = self._connection.execute(
                f"SELECT series_id, units, allocated, max(t) FROM holdings WHERE series_id IN ({','.join('?' * len(batch))}) "
                "GROUP BY series_id", batch)
            found.update((series_id, Held(units, allocated)) for series_id, units, allocated, _ in rows)
        return found

    def record(
        self, bucket: int, workloads: Sequence[tuple[int, WorkloadFigures]], opening_before: float | None,
    ) -> None:
        """The rows of the interval at `bucket`: `workloads` (series id, figures) are those reported now; one
        held before and not reported now holds nothing from now. A workload new to the store that began
        before `opening_before` (None: none did) brings an opening."""
        rows: list[tuple[int, int, float, int]] = []
        openings: list[tuple[object, ...]] = []
        state = self._state
        looked_up = self._last_rows([series_id for series_id, _ in workloads if series_id not in state])
        now: dict[int, Held] = {}
        for series_id, figures in workloads:
            held = Held(figures.allocated_gpus, allocated_of(figures))
            before = state.get(series_id) or looked_up.get(series_id)
            if before is None:
                rows.append((series_id, bucket, held.units, held.allocated))
                began = figures.start_time
                if held.allocated > 0 and began is not None and opening_before is not None and began < opening_before:
                    openings.append((series_id, bucket, began, *figure_row(figures)))
            elif held.units != before.units or (held.units == 0 and held.allocated != before.allocated):
                rows.append((series_id, bucket, held.units, held.allocated))
            now[series_id] = held
        rows += [(series_id, bucket, 0.0, held.allocated) for series_id, held in state.items()
                 if series_id not in now and held.units > 0]
        self._state = now
        self._connection.executemany("INSERT OR REPLACE INTO holdings VALUES (?, ?, ?, ?)", rows)
        if openings:
            placeholders = ", ".join("?" * len(openings[0]))
            self._connection.executemany(f"INSERT OR IGNORE INTO openings VALUES ({placeholders})", openings)

    def apply_retention(self, cut: int) -> None:
        """Drop the rows before `cut` that a later row at or before it replaces (each workload's units at
        `cut` stay known)."""
        self._connection.execute(
            "DELETE FROM holdings WHERE t < ? AND EXISTS (SELECT 1 FROM holdings later WHERE "
            "later.series_id = holdings.series_id AND later.t > holdings.t AND later.t <= ?)", (cut, cut))

    def forget(self, series_ids: Sequence[int]) -> None:
        """Drop the rows of series the store forgets."""
        for batch in _batches(series_ids):
            marks = ",".join("?" * len(batch))
            self._connection.execute(f"DELETE FROM holdings WHERE series_id IN ({marks})", batch)
            self._connection.execute(f"DELETE FROM openings WHERE series_id IN ({marks})", batch)
        for series_id in series_ids:
            self._state.pop(series_id, None)


def read_steps(connection: sqlite3.Connection, start: int, end: int) -> dict[int, Steps]:
    """The workloads of the period [start, end) (buckets): each one with a row inside it or units held when it
    begins, with its units in force then and its changes inside it."""
    steps: dict[int, Steps] = {}
    if start > FIRST:
        for series_id, units, _ in connection.execute(
            "SELECT series_id, units, max(t) FROM holdings WHERE t < ? GROUP BY series_id", (start,)
        ):
            if units > 0:
                steps[series_id] = Steps(at_start=units)
    for series_id, t, units in connection.execute(
        "SELECT series_id, t, units FROM holdings WHERE t >= ? AND t < ? ORDER BY t", (start, end)
    ):
        steps.setdefault(series_id, Steps()).changes.append((t, units))
    return steps


def group_peak(members: Iterable[Steps]) -> float:
    """The largest sum of the members' units held at one interval: their changes swept in time order."""
    total = 0.0
    events: list[tuple[int, float]] = []
    for steps in members:
        total += steps.at_start
        before = steps.at_start
        for t, units in steps.changes:
            events.append((t, units - before))
            before = units
    peak = total
    events.sort(key=lambda event: event[0])
    index = 0
    while index < len(events):
        t = events[index][0]
        while index < len(events) and events[index][0] == t:  # every change at one interval before its sum counts
            total += events[index][1]
            index += 1
        peak = max(peak, total)
    return round(peak, 9)


def read_openings(connection: sqlite3.Connection, series_ids: Sequence[int]) -> dict[int, Opening]:
    found: dict[int, Opening] = {}
    for batch in _batches(series_ids):
        rows = connection.execute(
            f"SELECT * FROM openings WHERE series_id IN ({','.join('?' * len(batch))})", batch)
        for series_id, t, since, *figures in rows:
            found[series_id] = Opening(t=t, since=since, figures=tuple(figures))
    return found
