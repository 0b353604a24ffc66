"""Who held how many GPU units when: the step functions behind a period's workloads, peaks and apportioning.

The embedded store writes a `holdings` row (the workload's series id, the interval's bucket, the units it
held then) when a workload's units held change, and when any of its cumulative figures change while it
holds none at the interval (a pod that ran between two intervals, late samples that turn unmonitored time
active after it ended): a workload that keeps its units writes nothing. Its units at any interval are the
last row's at or before it. So the workloads whose figures change in a period are exactly those with a
row inside it or units held when it begins; a workload's peak is the largest of those units, and a
group's peak (a namespace, a project, the fleet, or the part of them a reader may see) is the largest sum
of its workloads' units at one interval, found by sweeping their rows in time order: exact at the status
interval, whichever tier holds the counters. Where a period's edge cuts a coarse bucket, the units held at
each interval of the bucket weigh how much of it falls on either side (`unit_weights`).

`records` keeps the bucket of every interval recorded: the units in force when a period begins count
towards its peaks only where an interval of the period was recorded before they changed.

`openings` keeps what a workload had accrued before the store first saw it (its series' first point
carries that whole history): a store migrated from a schema without counters, or a new file beside a
running controller. A report apportions it over the workload's life before then (`periods.py`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from gpuwm.model import WorkloadFigures
from gpuwm.store.sql import batches, marks

#: below any edge a period can have: "before everything"
FIRST = -(2**62)
#: above any edge: "after everything"
LAST = 2**62
#: the weight of an interval in which a workload holding no units at either end still accrued (a short pod)
_ACCRUED_WITHOUT_UNITS = 1e-6


class Held(NamedTuple):
    """A workload's state at the last interval: units held, and its cumulative figures (None: not known,
    after the store was opened). A named tuple: one is made for every workload at every interval."""

    units: float
    figures: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Opening:
    """What a workload had accrued when the store first saw it at bucket `t`, since it began (`since`), and
    the units it held then (what stands for its units before)."""

    t: int
    since: float
    units: float
    figures: tuple[int, ...]  # in FIGURE_NAMES order, the store's resolution

    def spread_end(self, finest_step: int) -> float:
        """The end of the stretch its figures are spread over, [since, spread_end): its first bucket's end."""
        return float(self.t + finest_step)


@dataclass
class Steps:
    """One workload's units held over a period: in force when it begins, then each change inside it.

    `first_record`: the period's first recorded interval (None: it has none); the units in force at the
    start were held at an interval of the period only if they had not changed by then."""

    at_start: float = 0.0
    changes: list[tuple[int, float]] = field(default_factory=list)
    first_record: int | None = None

    def start_held(self) -> bool:
        return self.first_record is not None and (not self.changes or self.changes[0][0] > self.first_record)

    def peak(self) -> float:
        return max([self.at_start if self.start_held() else 0.0, *(units for _, units in self.changes)])


class HoldingsWriter:
    """Writes `holdings`, `records` and `openings` rows inside the store's write transactions.

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
            "SELECT series_id, units, max(t) FROM holdings GROUP BY series_id HAVING units > 0")
        self._state = {series_id: Held(units) for series_id, units, _ in rows}

    def _last_rows(self, series_ids: Sequence[int]) -> dict[int, Held]:
        rows = (row for batch in batches(series_ids) for row in self._connection.execute(
            f"SELECT series_id, units, max(t) FROM holdings WHERE series_id IN ({marks(batch)}) GROUP BY series_id",
            batch))
        return {series_id: Held(units) for series_id, units, _ in rows}

    def record(
        self, bucket: int, workloads: Sequence[tuple[int, WorkloadFigures]], stored: npt.NDArray[np.int64],
        opening_before: float | None,
    ) -> None:
        """The rows of the interval at `bucket`: `workloads` (series id, figures) are those reported now, `stored`
        their cumulative figures as the store keeps them (a row each); one held before and not reported now
        holds nothing from now. A workload new to the store that began before `opening_before` (None: none
        did) brings an opening."""
        rows: list[tuple[int, int, float]] = []
        openings: list[tuple[object, ...]] = []
        state = self._state
        looked_up = self._last_rows([series_id for series_id, _ in workloads if series_id not in state])
        now: dict[int, Held] = {}
        for (series_id, figures), row in zip(workloads, stored.tolist(), strict=True):
            held = Held(figures.allocated_gpus, tuple(row))
            before = state.get(series_id) or looked_up.get(series_id)
            if before is None:
                rows.append((series_id, bucket, held.units))
                began = figures.start_time
                if any(held.figures or ()) and began is not None and opening_before is not None and began < opening_before:
                    openings.append((series_id, bucket, began, held.units, *(held.figures or ())))
            elif held.units != before.units or (held.units == 0 and held.figures != before.figures):
                rows.append((series_id, bucket, held.units))
            now[series_id] = held
        rows += [(series_id, bucket, 0.0) for series_id, held in state.items() if series_id not in now and held.units > 0]
        self._state = now
        self._connection.execute("INSERT OR IGNORE INTO records VALUES (?)", (bucket,))
        self._connection.executemany("INSERT OR REPLACE INTO holdings VALUES (?, ?, ?)", rows)
        if openings:
            self._connection.executemany(f"INSERT OR IGNORE INTO openings VALUES ({marks(openings[0])})", openings)

    def apply_retention(self, cut: int) -> None:
        """Drop the rows before `cut` that a later row at or before it replaces (each workload's units at
        `cut` stay known), and the records before it."""
        self._connection.execute(
            "DELETE FROM holdings WHERE t < ? AND EXISTS (SELECT 1 FROM holdings later WHERE "
            "later.series_id = holdings.series_id AND later.t > holdings.t AND later.t <= ?)", (cut, cut))
        self._connection.execute("DELETE FROM records WHERE t < ?", (cut,))

    def forget(self, series_ids: Sequence[int]) -> None:
        """Drop the rows of series the store forgets."""
        for batch in batches(series_ids):
            self._connection.execute(f"DELETE FROM holdings WHERE series_id IN ({marks(batch)})", batch)
            self._connection.execute(f"DELETE FROM openings WHERE series_id IN ({marks(batch)})", batch)
        for series_id in series_ids:
            self._state.pop(series_id, None)


def _in_force(connection: sqlite3.Connection, before: int, series_ids: Sequence[int] | None) -> dict[int, float]:
    """Each workload's units held at `before` (its last row before it), all workloads or `series_ids`."""
    if series_ids is None:
        rows = connection.execute("SELECT series_id, units, max(t) FROM holdings WHERE t < ? GROUP BY series_id",
                                  (before,)).fetchall()
    else:
        rows = [row for batch in batches(series_ids) for row in connection.execute(
            f"SELECT series_id, units, max(t) FROM holdings WHERE t < ? AND series_id IN ({marks(batch)}) "
            "GROUP BY series_id", (before, *batch))]
    return {series_id: units for series_id, units, _ in rows}


def read_steps(connection: sqlite3.Connection, start: int, end: int) -> dict[int, Steps]:
    """The workloads of the period [start, end) (buckets): each one with a row inside it or units held when it
    begins, with its units in force then and its changes inside it."""
    (first_record,) = connection.execute("SELECT min(t) FROM records WHERE t >= ? AND t < ?", (start, end)).fetchone()
    steps: dict[int, Steps] = {}
    if start > FIRST:
        for series_id, units in _in_force(connection, start, None).items():
            if units > 0:
                steps[series_id] = Steps(at_start=units, first_record=first_record)
    for series_id, t, units in connection.execute(
        "SELECT series_id, t, units FROM holdings WHERE t >= ? AND t < ? ORDER BY t", (start, end)
    ):
        steps.setdefault(series_id, Steps(first_record=first_record)).changes.append((t, units))
    return steps


def unit_weights(
    connection: sqlite3.Connection, series_ids: Sequence[int], low: int, high: int,
) -> dict[int, list[tuple[int, float]]]:
    """Per workload, the weight of each interval recorded in [low, high): the units it held then (where a row
    says its units changed, the larger of those before and after, and a little where it held none at either
    end yet accrued): how a coarse bucket's figures spread over its intervals."""
    times = [t for (t,) in connection.execute("SELECT t FROM records WHERE t >= ? AND t < ? ORDER BY t", (low, high))]
    held = _in_force(connection, low, series_ids)
    changes: dict[int, dict[int, float]] = {}
    for batch in batches(series_ids):
        for series_id, t, units in connection.execute(
            f"SELECT series_id, t, units FROM holdings WHERE t >= ? AND t < ? AND series_id IN ({marks(batch)})",
            (low, high, *batch),
        ):
            changes.setdefault(series_id, {})[t] = units
    weights: dict[int, list[tuple[int, float]]] = {}
    for series_id in series_ids:
        units = held.get(series_id, 0.0)
        mine = changes.get(series_id, {})
        series_weights = []
        for t in times:
            if t in mine:
                weight = max(units, mine[t], _ACCRUED_WITHOUT_UNITS)
                units = mine[t]
            else:
                weight = units
            series_weights.append((t, weight))
        weights[series_id] = series_weights
    return weights


def group_peak(members: Iterable[Steps]) -> float:
    """The largest sum of the members' units held at one interval: their changes swept in time order (the
    sum in force at the start counts where the period recorded an interval before the first change)."""
    total = 0.0
    events: list[tuple[int, float]] = []
    first_record: int | None = None
    for steps in members:
        first_record = steps.first_record
        total += steps.at_start
        before = steps.at_start
        for t, units in steps.changes:
            events.append((t, units - before))
            before = units
    events.sort(key=lambda event: event[0])
    held = first_record is not None and (not events or events[0][0] > first_record)
    peak = total if held else 0.0
    index = 0
    while index < len(events):
        t = events[index][0]
        while index < len(events) and events[index][0] == t:  # every change at one interval before its sum counts
            total += events[index][1]
            index += 1
        peak = max(peak, total)
    return round(peak, 9)


def read_openings(connection: sqlite3.Connection, series_ids: Sequence[int]) -> dict[int, Opening]:
    rows = (row for batch in batches(series_ids) for row in connection.execute(
        f"SELECT * FROM openings WHERE series_id IN ({marks(batch)})", batch))
    return {series_id: Opening(t=t, since=since, units=units, figures=tuple(figures))
            for series_id, t, since, units, *figures in rows}


def first_rows(connection: sqlite3.Connection, series_ids: Sequence[int]) -> dict[int, int]:
    """Each workload's first row kept: when the store first saw it (its figures have no point before it)."""
    return {series_id: t for batch in batches(series_ids) for series_id, t in connection.execute(
        f"SELECT series_id, min(t) FROM holdings WHERE series_id IN ({marks(batch)}) GROUP BY series_id", batch)}


def openings_within(connection: sqlite3.Connection, start: float, end: float, finest_step: int) -> list[int]:
    """The workloads whose opening is spread over part of [start, end)."""
    rows = connection.execute("SELECT series_id FROM openings WHERE since < ? AND t + ? > ?", (end, finest_step, start))
    return [series_id for (series_id,) in rows]
