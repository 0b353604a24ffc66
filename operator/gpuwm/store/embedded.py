"""The embedded store: one SQLite file (WAL) the controller writes each status interval.

Layout (why): one row per (series, time) with one REAL column per metric, in a
`WITHOUT ROWID` table clustered on (series_id, t), so a 24 h query of one series reads
5,760 adjacent rows. Workload, project, node and cluster series are aggregated when
written, so a project query over 1,000 workloads reads one series, not 8,000. One table
per roll-up tier (`points_<step>`); older data lives only in coarser tiers. The file
carries an application_id and a schema version so a foreign or newer file is refused
and never written to.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpuwm.model import GpuSample, PodStatsSample
from gpuwm.model.figures import ClusterFigures, ProjectFigures, WorkloadFigures
from gpuwm.store.base import (
    METRIC_NAMES,
    METRICS,
    RangeQuery,
    Rollup,
    Series,
    Store,
    StoreError,
)
from gpuwm.store.rows import SeriesRow, build_rows
from gpuwm.store.sqlite_read import read_range
from gpuwm.store.tiers import Tier, parse_tiers

log = logging.getLogger(__name__)

APPLICATION_ID = 0x6770776D  # "gpwm"
SCHEMA_VERSION = 1
_SQLITE_MAGIC = b"SQLite format 3\x00"
_COLUMNS = [f"m{index}" for index in range(len(METRIC_NAMES))]
#: page cache of the writing connection (readers keep the bigger cache and mmap of `_connect`)
WRITER_CACHE_KIB = 16 * 1024


def _check_file(path: Path) -> None:
    """Refuse a file that is not a gpuwm store before SQLite touches it."""
    if not path.exists() or path.stat().st_size == 0:
        return
    if path.is_dir():
        raise StoreError(f"store {path} is a directory; --store needs a file path (e.g. {path}/gpuwm.db)")
    with path.open("rb") as handle:
        header = handle.read(100)
    if not header.startswith(_SQLITE_MAGIC) or len(header) < 100:
        raise StoreError(
            f"store {path} is not a SQLite database (corrupt or some other file); refusing to open or overwrite it. "
            "Move it away or point --store at a new path."
        )
    user_version = int.from_bytes(header[60:64], "big")
    application_id = int.from_bytes(header[68:72], "big")
    if application_id != APPLICATION_ID:
        raise StoreError(
            f"store {path} is a SQLite database of another application (application_id {application_id:#x}, "
            f"gpuwm uses {APPLICATION_ID:#x}); refusing to open or overwrite it. Point --store at a new path."
        )
    if user_version > SCHEMA_VERSION:
        raise StoreError(
            f"store {path} has schema version {user_version}, newer than this gpuwm understands ({SCHEMA_VERSION}); "
            "upgrade gpuwm or point --store at a new path."
        )


class EmbeddedStore(Store):
    """SQLite store: per-series points with roll-ups and retention, plus the latest figures."""

    def __init__(
        self,
        path: str | Path,
        tiers: Sequence[str] | Sequence[Tier] = ("15s:2d", "5m:30d"),
        retention_seconds: float = 7 * 86400.0,
    ) -> None:
        self.path = Path(path)
        self.tiers: list[Tier] = (
            [tier for tier in tiers if isinstance(tier, Tier)]
            if tiers and isinstance(tiers[0], Tier)
            else parse_tiers([str(tier) for tier in tiers])
        )
        self.retention_seconds = retention_seconds
        _check_file(self.path)
        if not self.path.parent.exists():
            raise StoreError(
                f"store {self.path}: directory {self.path.parent} does not exist; create it or fix --store"
            )
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._series_ids: dict[tuple[str, str], int] = {}
        try:
            self._writer = self._connect()
            # the writer's pages are the controller's RSS (issue 4: <= 256 MiB): a small cache, no mmap.
            # Each interval touches one leaf page per series, more than any cache here holds, so a
            # bigger cache bought no CPU (measured at 8,000 GPUs), only ~60 MiB more RSS
            self._writer.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
            self._writer.execute("PRAGMA mmap_size = 0")
            self._init_schema()
        except sqlite3.DatabaseError as error:
            raise StoreError(
                f"store {self.path} is corrupt or unreadable ({error}); refusing to overwrite it. "
                "Move it away or point --store at a new path."
            ) from None
        self._readers: list[sqlite3.Connection] = []

    # -- connections -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
        connection.execute("PRAGMA busy_timeout = 30000")
        connection.execute("PRAGMA cache_size = -65536")
        connection.execute("PRAGMA mmap_size = 1073741824")
        return connection

    def _reader(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._connect()
            connection.execute("PRAGMA query_only = 1")
            self._local.connection = connection
            self._readers.append(connection)
        return connection

    def _init_schema(self) -> None:
        connection = self._writer
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            tables = connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if tables:
                raise StoreError(
                    f"store {self.path} is a SQLite database with tables but no gpuwm schema; refusing to touch it. "
                    "Point --store at a new path."
                )
            # application_id goes into the main file before WAL mode, so the header check sees it at once
            connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            log.info("created store", extra={"store": str(self.path), "schema_version": SCHEMA_VERSION})
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = NORMAL")
        statements = [
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
            "CREATE TABLE IF NOT EXISTS series (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, key TEXT NOT NULL, "
            "workload_uid TEXT, project TEXT, node TEXT, labels TEXT NOT NULL, UNIQUE (kind, key))",
            "CREATE INDEX IF NOT EXISTS series_by_workload ON series (kind, workload_uid)",
            "CREATE INDEX IF NOT EXISTS series_by_project ON series (kind, project)",
            "CREATE INDEX IF NOT EXISTS series_by_node ON series (kind, node)",
            "CREATE TABLE IF NOT EXISTS latest_workloads (uid TEXT PRIMARY KEY, namespace TEXT NOT NULL, "
            "name TEXT NOT NULL, project TEXT NOT NULL, at REAL NOT NULL, figures TEXT NOT NULL) WITHOUT ROWID",
            "CREATE INDEX IF NOT EXISTS latest_workloads_by_name ON latest_workloads (namespace, name, at)",
            "CREATE TABLE IF NOT EXISTS latest_projects (name TEXT PRIMARY KEY, at REAL NOT NULL, "
            "figures TEXT NOT NULL) WITHOUT ROWID",
            "CREATE TABLE IF NOT EXISTS latest_cluster (id INTEGER PRIMARY KEY CHECK (id = 1), at REAL NOT NULL, "
            "figures TEXT NOT NULL)",
        ]
        columns = ", ".join(f"{column} REAL" for column in _COLUMNS)
        for tier in self.tiers:
            statements.append(
                f"CREATE TABLE IF NOT EXISTS {tier.table} (series_id INTEGER NOT NULL, t INTEGER NOT NULL, "
                f"{columns}, PRIMARY KEY (series_id, t)) WITHOUT ROWID"
            )
            statements.append(f"CREATE INDEX IF NOT EXISTS {tier.table}_by_time ON {tier.table} (t)")
        connection.execute("BEGIN IMMEDIATE")
        try:
            for statement in statements:
                connection.execute(statement)
            connection.execute(
                "INSERT OR IGNORE INTO meta VALUES ('metrics', ?)", (json.dumps(METRIC_NAMES),)
            )
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        stored = json.loads(connection.execute("SELECT value FROM meta WHERE key = 'metrics'").fetchone()[0])
        if list(stored) != list(METRIC_NAMES)[: len(stored)]:
            raise StoreError(
                f"store {self.path} has an incompatible metric layout; point --store at a new path"
            )
        for kind, key, series_id in connection.execute("SELECT kind, key, id FROM series"):
            self._series_ids[(kind, key)] = series_id

    def close(self) -> None:
        for connection in self._readers:
            connection.close()
        self._readers.clear()
        self._local = threading.local()
        self._writer.close()

    # -- writing -----------------------------------------------------------------------------

    def record(
        self,
        at: float,
        samples: Sequence[GpuSample],
        workloads: Sequence[WorkloadFigures],
        projects: Sequence[ProjectFigures],
        cluster: ClusterFigures,
        pod_stats: Sequence[PodStatsSample] = (),
    ) -> None:
        """Write one interval: a row per series at the finest tier, the latest figures, then roll-ups."""
        rows = build_rows(samples, workloads, projects, cluster, pod_stats)
        with self._write_lock:
            connection = self._writer
            connection.execute("BEGIN IMMEDIATE")
            try:
                self.write_points(at, rows.items())
                connection.executemany(
                    "INSERT OR REPLACE INTO latest_workloads VALUES (?, ?, ?, ?, ?, ?)",
                    [(w.uid, w.namespace, w.name, w.project, at, w.model_dump_json()) for w in workloads],
                )
                connection.executemany(
                    "INSERT OR REPLACE INTO latest_projects VALUES (?, ?, ?)",
                    [(p.name, at, p.model_dump_json()) for p in projects],
                )
                connection.execute(
                    "INSERT OR REPLACE INTO latest_cluster VALUES (1, ?, ?)", (at, cluster.model_dump_json())
                )
                self._set_meta("latest_time", at)
                if self._get_meta("earliest_time") is None:
                    self._set_meta("earliest_time", at)
                self._roll_up(at)
                connection.execute("COMMIT")
            except BaseException:
                connection.execute("ROLLBACK")
                raise

    def write_points(self, at: float, rows: Iterable[tuple[tuple[str, str], SeriesRow]]) -> None:
        """Insert rows at the finest tier (inside the caller's transaction); the bench loads data through this."""
        base = self.tiers[0]
        bucket = math.floor(at / base.step_seconds) * base.step_seconds
        values = [(self._series_id(kind, key, row.labels), bucket, *row.values) for (kind, key), row in rows]
        placeholders = ", ".join("?" * (2 + len(_COLUMNS)))
        self._writer.executemany(f"INSERT OR REPLACE INTO {base.table} VALUES ({placeholders})", values)

    def _series_id(self, kind: str, key: str, labels: dict[str, str]) -> int:
        found = self._series_ids.get((kind, key))
        if found is None:
            cursor = self._writer.execute(
                "INSERT INTO series (kind, key, workload_uid, project, node, labels) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    kind,
                    key,
                    labels.get("workload_uid"),
                    labels.get("project"),
                    labels.get("node"),
                    json.dumps(labels, sort_keys=True),
                ),
            )
            found = int(cursor.lastrowid or 0)
            self._series_ids[(kind, key)] = found
        return found

    def _get_meta(self, key: str, connection: sqlite3.Connection | None = None) -> float | None:
        row = (connection or self._writer).execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return float(row[0]) if row else None

    def _set_meta(self, key: str, value: float) -> None:
        self._writer.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, repr(value)))

    def _roll_up(self, at: float) -> None:
        """Fill each coarser tier up to its last complete bucket, then drop what is past each tier's KEEP."""
        connection = self._writer
        complete_until = float(math.floor(at / self.tiers[0].step_seconds) * self.tiers[0].step_seconds)
        for finer, coarser in zip(self.tiers, self.tiers[1:], strict=False):
            step = coarser.step_seconds
            until = int(complete_until // step) * step
            watermark_key = f"rollup_until:{step}"
            watermark = self._get_meta(watermark_key)
            if watermark is None:
                first = connection.execute(f"SELECT min(t) FROM {finer.table}").fetchone()[0]
                watermark = float(int(first // step) * step) if first is not None else float(until)
            if until > watermark:
                aggregates = ", ".join(
                    f"{'max' if metric.rollup is Rollup.MAX else 'avg'}({column})"
                    for metric, column in zip(METRICS, _COLUMNS, strict=True)
                )
                connection.execute(
                    f"INSERT OR REPLACE INTO {coarser.table} SELECT series_id, (t / {step}) * {step}, {aggregates} "
                    f"FROM {finer.table} WHERE t >= ? AND t < ? GROUP BY series_id, t / {step}",
                    (int(watermark), int(until)),
                )
                self._set_meta(watermark_key, float(until))
                self._apply_retention(at)
            complete_until = float(until)
        if len(self.tiers) == 1 and int(at) % 300 < self.tiers[0].step_seconds:
            self._apply_retention(at)

    def _apply_retention(self, at: float) -> None:
        connection = self._writer
        for tier in self.tiers:
            connection.execute(f"DELETE FROM {tier.table} WHERE t < ?", (int(at - tier.keep_seconds),))
        connection.execute("DELETE FROM latest_workloads WHERE at < ?", (at - self.retention_seconds,))
        connection.execute("DELETE FROM latest_projects WHERE at < ?", (at - self.retention_seconds,))

    def forget_workload(self, uid: str) -> None:
        """Drop a workload's latest figures (its points age out with the tiers)."""
        with self._write_lock:
            self._writer.execute("DELETE FROM latest_workloads WHERE uid = ?", (uid,))

    # -- reading: latest state ---------------------------------------------------------------

    def workloads(self) -> list[WorkloadFigures]:
        rows = self._reader().execute("SELECT figures FROM latest_workloads ORDER BY namespace, name, at")
        by_name: dict[tuple[str, str], WorkloadFigures] = {}
        for (figures,) in rows:
            workload = WorkloadFigures.model_validate_json(figures)
            by_name[(workload.namespace, workload.name)] = workload  # the newest of a reused name wins
        return list(by_name.values())

    def workload(self, namespace: str, name: str) -> WorkloadFigures | None:
        row = (
            self._reader()
            .execute(
                "SELECT figures FROM latest_workloads WHERE namespace = ? AND name = ? ORDER BY at DESC LIMIT 1",
                (namespace, name),
            )
            .fetchone()
        )
        return WorkloadFigures.model_validate_json(row[0]) if row else None

    def projects(self) -> list[ProjectFigures]:
        rows = self._reader().execute("SELECT figures FROM latest_projects ORDER BY name")
        return [ProjectFigures.model_validate_json(figures) for (figures,) in rows]

    def project(self, name: str) -> ProjectFigures | None:
        row = self._reader().execute("SELECT figures FROM latest_projects WHERE name = ?", (name,)).fetchone()
        return ProjectFigures.model_validate_json(row[0]) if row else None

    def cluster(self) -> ClusterFigures | None:
        row = self._reader().execute("SELECT figures FROM latest_cluster WHERE id = 1").fetchone()
        return ClusterFigures.model_validate_json(row[0]) if row else None

    def nodes(self) -> list[str]:
        rows = self._reader().execute("SELECT DISTINCT node FROM series WHERE kind = 'node' ORDER BY node")
        return [node for (node,) in rows]

    def latest_time(self) -> float | None:
        return self._get_meta("latest_time", self._reader())

    def earliest_time(self) -> float | None:
        earliest = self._get_meta("earliest_time", self._reader())
        latest = self.latest_time()
        if earliest is None or latest is None:
            return earliest
        return max(earliest, latest - self.tiers[-1].keep_seconds)

    # -- reading: time series ----------------------------------------------------------------

    def query_range(self, query: RangeQuery) -> list[Series]:
        connection = self._reader()
        watermarks = {
            tier.step_seconds: self._get_meta(f"rollup_until:{tier.step_seconds}", connection)
            for tier in self.tiers
        }
        return read_range(
            connection, self.tiers, self._get_meta("latest_time", connection), watermarks, query
        )
