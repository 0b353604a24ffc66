"""The embedded store's latest figures: each workload's, project's and the cluster's, one JSON row each.

`latest_workloads` (by run: a reused name's runs are rows of their own), `latest_projects` and
`latest_cluster` answer the API's current-state reads. Most running workloads' figures move every
interval, and rewriting every row each interval was most of the store's writes: a row is written
when its JSON changed, and a running workload whose row already says its phase has only counters
to update, which it gets in turns (`refresh_rows` an interval, the longest unwritten first).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from operator import attrgetter, itemgetter
from typing import NamedTuple, TypeVar

from pydantic import BaseModel

from gpuwm.model import ClusterFigures, ProjectFigures, WorkloadFigures, model_json

#: rows written per statement: the JSON held at once is bounded, however large the fleet
_ROWS_PER_WRITE = 256
#: workload phases whose figures change every interval (new objects: not worth keeping to compare)
_LIVE_PHASES = frozenset({"Running", "Pending", "Queued"})  # a Queued one's queuedSeconds grows

_Figures = TypeVar("_Figures", bound=BaseModel)


class Entry(NamedTuple):
    """One row to write: its key in the table, its columns before the JSON, and the figures."""

    key: str
    columns: tuple[object, ...]
    figures: BaseModel


class _Refreshed(NamedTuple):
    """A live workload's row as written: its phase, and when."""

    phase: object
    at: float


class _Batch:
    """The changed rows of one table, written `_ROWS_PER_WRITE` at a time."""

    def __init__(self, connection: sqlite3.Connection, table: str) -> None:
        self._connection = connection
        self._table = table
        self._rows: list[tuple[object, ...]] = []
        self.written = 0

    def add(self, row: tuple[object, ...]) -> None:
        self._rows.append(row)
        self.written += 1
        if len(self._rows) >= _ROWS_PER_WRITE:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            self._connection.executemany(_insert_statement(self._table, len(self._rows[0])), self._rows)
            self._rows.clear()


class LatestWriter:
    """Writes the latest-figures rows inside the store's transactions, and remembers what they say.

    It keeps, per row, a hash of the JSON written (the JSON itself would grow with every workload the
    cluster ran), the figures objects last written of rows that no longer change (ended workloads,
    projects, the cluster: the engine hands the same object again for a settled workload), and when
    each live workload's row was written in which phase.
    """

    def __init__(self, connection: sqlite3.Connection, refresh_rows: int | None = None) -> None:
        self._connection = connection
        #: running workloads' rows rewritten per interval at most (None: every changed row)
        self.refresh_rows = refresh_rows
        self.digests: dict[str, int] = {}  # "table:key" -> hash() of its JSON
        self.objects: dict[str, object] = {}  # "table:key" -> the figures last written, where they no longer change
        self.refreshed: dict[str, _Refreshed] = {}  # "table:key" of a live workload -> its row's phase and time
        for table, column in (("latest_workloads", "uid"), ("latest_projects", "name")):
            for key, figures in connection.execute(f"SELECT {column}, figures FROM {table}"):
                self.digests[f"{table}:{key}"] = hash(figures.encode())

    def forget_uncommitted(self) -> None:
        """After a rollback: the rolled-back rows may be gone, so each row is written again next time."""
        self.digests.clear()
        self.objects.clear()
        self.refreshed.clear()

    def record(self, at: float, workloads: Sequence[WorkloadFigures], projects: Sequence[ProjectFigures],
               cluster: ClusterFigures) -> None:
        """The interval's rows, in the caller's transaction."""
        self.write("latest_workloads", [Entry(w.uid, (w.uid, w.namespace, w.name, w.project, at), w) for w in workloads],
                   at=at, refresh_rows=self.refresh_rows)
        self.write("latest_projects", [Entry(p.name, (p.name, at), p) for p in projects])
        self.write("latest_cluster", [Entry("1", (1, at), cluster)])

    def write(self, table: str, entries: list[Entry], *, at: float = 0.0, refresh_rows: int | None = None) -> None:
        """Rewrite the rows of `table` whose JSON changed; `entries` are all its figures of this interval.

        The very object written last time is not dumped again. Only this call's objects are kept, and
        of workloads only ended ones'. The JSON remembered for a key no longer reported (a workload the
        controller forgot after its retention) is dropped; its row stays until the store's retention.
        `refresh_rows`: a live row that says its phase already waits its turn (see the module's docstring).
        """
        batch = _Batch(self._connection, table)
        kept: dict[str, object] = {}
        waiting: list[tuple[float, str, Entry]] = []  # (its row written at, cache key, entry)
        for entry in entries:
            cache_key = f"{table}:{entry.key}"
            phase = getattr(entry.figures, "phase", None)
            live = phase in _LIVE_PHASES
            if not live:  # a live workload's figures are new each time
                kept[cache_key] = entry.figures
            if self.objects.get(cache_key) is entry.figures:
                continue
            last = self.refreshed.get(cache_key) if live and refresh_rows is not None else None
            if last is not None and last.phase == phase:  # its row says this phase already: counters only
                waiting.append((last.at, cache_key, entry))
                continue
            self._write(batch, cache_key, entry, at, refresh_rows)
        if refresh_rows is not None:
            slots = max(0, refresh_rows - batch.written)
            if slots < len(waiting):
                waiting.sort(key=itemgetter(0, 1))  # the longest unwritten first (then by key: the same each run)
                del waiting[slots:]
            for _, cache_key, entry in waiting:
                self._write(batch, cache_key, entry, at, refresh_rows)
        self._keep(f"{table}:", kept, {f"{table}:{entry.key}" for entry in entries})
        batch.flush()

    def _write(self, batch: _Batch, cache_key: str, entry: Entry, at: float, refresh_rows: int | None) -> None:
        """The entry's row, where its JSON changed; a live workload's row noted as written in its phase."""
        dumped = model_json(entry.figures)
        digest = hash(dumped)  # 64 bits: a changed row read as unchanged is a 2^-64 chance
        if refresh_rows is not None:  # the file row says this (now, or once the row below is written)
            phase = getattr(entry.figures, "phase", None)
            if phase in _LIVE_PHASES:
                self.refreshed[cache_key] = _Refreshed(phase, at)
            else:
                self.refreshed.pop(cache_key, None)
        if self.digests.get(cache_key) == digest:
            return
        self.digests[cache_key] = digest
        batch.add((*entry.columns, dumped.decode()))

    def _keep(self, prefix: str, kept: dict[str, object], reported: set[str]) -> None:
        """Of one table's rows, the objects of this interval alone, and digests of the rows still reported."""
        self.objects = {key: value for key, value in self.objects.items()
                        if not key.startswith(prefix)} | kept
        for cache_key in [key for key in self.digests if key.startswith(prefix) and key not in reported]:
            del self.digests[cache_key]
            self.refreshed.pop(cache_key, None)

    def forget_workload(self, uid: str) -> None:
        """Drop a workload's row (its points age out with the tiers)."""
        self._connection.execute("DELETE FROM latest_workloads WHERE uid = ?", (uid,))
        self.digests.pop(f"latest_workloads:{uid}", None)
        self.refreshed.pop(f"latest_workloads:{uid}", None)

    def apply_retention(self, before: float) -> None:
        """Delete the workloads' and projects' rows last written before `before`."""
        self._connection.execute("DELETE FROM latest_workloads WHERE at < ?", (before,))
        self._connection.execute("DELETE FROM latest_projects WHERE at < ?", (before,))


def _insert_statement(table: str, columns: int) -> str:
    if table == "latest_workloads":
        # updated in place: a REPLACE deletes the row and inserts it again, index entries and all. A uid's
        # namespace and name never change (the index on them stays as it is)
        return (f"INSERT INTO {table} VALUES ({', '.join('?' * columns)}) ON CONFLICT (uid) DO UPDATE SET "
                "project = excluded.project, at = excluded.at, figures = excluded.figures")
    return f"INSERT OR REPLACE INTO {table} VALUES ({', '.join('?' * columns)})"


# -- reading ------------------------------------------------------------------------------------------

_newest_of_name = attrgetter("namespace", "name")


def read_workloads(connection: sqlite3.Connection) -> list[WorkloadFigures]:
    """The newest run of each workload name."""
    by_name: dict[tuple[str, str], WorkloadFigures] = {}
    for (figures,) in connection.execute("SELECT figures FROM latest_workloads ORDER BY namespace, name, at"):
        workload = WorkloadFigures.model_validate_json(figures)
        by_name[_newest_of_name(workload)] = workload  # the newest of a reused name wins
    return list(by_name.values())


def read_runs(connection: sqlite3.Connection) -> list[WorkloadFigures]:
    """Every run kept."""
    rows = connection.execute("SELECT figures FROM latest_workloads ORDER BY namespace, name, at, uid")
    return [WorkloadFigures.model_validate_json(figures) for (figures,) in rows]


def read_projects(connection: sqlite3.Connection) -> list[ProjectFigures]:
    rows = connection.execute("SELECT figures FROM latest_projects ORDER BY name")
    return [ProjectFigures.model_validate_json(figures) for (figures,) in rows]


def read_one(connection: sqlite3.Connection, model: type[_Figures], query: str, *arguments: object) -> _Figures | None:
    """The figures of the one latest row `query` selects, or None."""
    row = connection.execute(query, arguments).fetchone()
    return model.model_validate_json(row[0]) if row else None
