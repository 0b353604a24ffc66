"""The latest workload figures' table: a rowid table whose rows each interval updates in place.

Before, it was a WITHOUT ROWID table rewritten with INSERT OR REPLACE (each ~2-3 KB row deleted and
inserted again, its index entry with it). A file of that layout is rebuilt on opening, its rows
kept; the schema version stays, since the columns and the queries are the same.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gpuwm.store.embedded import EmbeddedStore

from .store_data import cluster, project, sample, workload

_EARLIER_TABLE = (
    "CREATE TABLE latest_workloads (uid TEXT PRIMARY KEY, namespace TEXT NOT NULL, "
    "name TEXT NOT NULL, project TEXT NOT NULL, at REAL NOT NULL, figures TEXT NOT NULL) WITHOUT ROWID"
)
_EARLIER_INDEX = "CREATE INDEX latest_workloads_by_name ON latest_workloads (namespace, name, at)"


def _table_sql(path: Path) -> str:
    with sqlite3.connect(path) as connection:
        (sql,) = connection.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'latest_workloads'"
        ).fetchone()
    return str(sql)


def _index_columns(path: Path) -> list[str]:
    with sqlite3.connect(path) as connection:
        return [row[2] for row in connection.execute("PRAGMA index_info(latest_workloads_by_name)")]


def _rows(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as connection:
        return connection.execute("SELECT * FROM latest_workloads ORDER BY uid").fetchall()


def test_a_new_store_keeps_the_latest_workloads_in_a_rowid_table(tmp_path: Path) -> None:
    path = tmp_path / "gpuwm.db"
    EmbeddedStore(path).close()
    assert "WITHOUT ROWID" not in _table_sql(path).upper()
    assert _index_columns(path) == ["namespace", "name"]


def test_an_earlier_file_is_rebuilt_with_every_row_and_its_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "gpuwm.db"
    store = EmbeddedStore(path)
    a, b = workload("a", [("gpu-0", 1.0, 40.0)]), workload("b", [("gpu-1", 1.0, 0.0)], namespace="team-b")
    store.record(1000.0, [sample(1000.0, "gpu-0"), sample(1000.0, "gpu-1")], [a, b], [project("alpha", [a, b])],
                 cluster(2))
    store.close()
    rows = _rows(path)
    with sqlite3.connect(path, isolation_level=None) as connection:  # as an earlier gpuwm left the file
        (version,) = connection.execute("PRAGMA user_version").fetchone()
        connection.execute("BEGIN")
        connection.execute("DROP INDEX latest_workloads_by_name")
        connection.execute("ALTER TABLE latest_workloads RENAME TO old")
        connection.execute(_EARLIER_TABLE)
        connection.execute("INSERT INTO latest_workloads SELECT * FROM old")
        connection.execute("DROP TABLE old")
        connection.execute(_EARLIER_INDEX)
        connection.execute("COMMIT")
    assert "WITHOUT ROWID" in _table_sql(path).upper()

    store = EmbeddedStore(path)
    try:
        assert "WITHOUT ROWID" not in _table_sql(path).upper()
        assert _index_columns(path) == ["namespace", "name"]
        assert _rows(path) == rows
        assert store.workload("team-b", "b") == b
        assert [found.uid for found in store.workloads()] == ["uid-a", "uid-b"]
        moved = workload("a", [("gpu-0", 1.0, 90.0)], project="beta", energy_joules=7.0)
        store.record(1015.0, [sample(1015.0, "gpu-0")], [moved, b], [project("alpha", [b]), project("beta", [moved])],
                     cluster(2))
        assert store.workload("team-a", "a") == moved
    finally:
        store.close()
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA user_version").fetchone() == (version,)
        assert connection.execute("SELECT project, at FROM latest_workloads WHERE uid = 'uid-a'").fetchone() == (
            "beta", 1015.0)


def test_each_interval_updates_a_workloads_row_in_place(tmp_path: Path) -> None:
    """The same row (rowid) with the new project, time and figures: not a row deleted and inserted again."""
    path = tmp_path / "gpuwm.db"
    store = EmbeddedStore(path)
    try:
        first = workload("a", [("gpu-0", 1.0, 40.0)])
        store.record(1000.0, [sample(1000.0, "gpu-0")], [first], [project("alpha", [first])], cluster(1))
        with sqlite3.connect(path) as connection:
            (rowid,) = connection.execute("SELECT rowid FROM latest_workloads WHERE uid = 'uid-a'").fetchone()
        later = workload("a", [("gpu-0", 1.0, 80.0)], project="beta", energy_joules=3.0)
        store.record(1015.0, [sample(1015.0, "gpu-0")], [later], [project("beta", [later])], cluster(1))
        with sqlite3.connect(path) as connection:
            found = connection.execute(
                "SELECT rowid, namespace, name, project, at FROM latest_workloads WHERE uid = 'uid-a'"
            ).fetchall()
        assert found == [(rowid, "team-a", "a", "beta", 1015.0)]
        assert store.workload("team-a", "a") == later
    finally:
        store.close()


def test_an_earlier_gpuwm_still_writes_the_rebuilt_table(tmp_path: Path) -> None:
    """Its INSERT OR REPLACE works on the rowid table: one row per uid, the newest figures."""
    path = tmp_path / "gpuwm.db"
    store = EmbeddedStore(path)
    first = workload("a", [("gpu-0", 1.0, 40.0)])
    store.record(1000.0, [sample(1000.0, "gpu-0")], [first], [project("alpha", [first])], cluster(1))
    store.close()
    later = workload("a", [("gpu-0", 1.0, 60.0)], energy_joules=2.0)
    with sqlite3.connect(path) as connection:
        connection.execute("INSERT OR REPLACE INTO latest_workloads VALUES (?, ?, ?, ?, ?, ?)",
                           ("uid-a", "team-a", "a", "alpha", 1015.0, later.model_dump_json()))
    store = EmbeddedStore(path)
    try:
        assert store.workload("team-a", "a") == later
        assert len(_rows(path)) == 1
    finally:
        store.close()
