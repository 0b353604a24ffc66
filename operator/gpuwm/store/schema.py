"""The embedded store's file: what makes a file ours (application id, schema version) and its tables.

Schema 2 (why each table): `series` names every series once; `head` holds one row per interval
and block of series (what `record` appends); `chunks` one row per tier, series and span
(compacted points); `latest_*` the latest figures; `meta` the metric layout and watermarks.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

from gpuwm.store.base import METRIC_NAMES, StoreError

log = logging.getLogger(__name__)

APPLICATION_ID = 0x6770776D  # "gpwm"
SCHEMA_VERSION = 2
PAGE_SIZE = 16384
_SQLITE_MAGIC = b"SQLite format 3\x00"


def check_file(path: Path) -> None:
    """Refuse a file that is not a gpuwm store of this schema before SQLite touches it."""
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
    if 0 < user_version < SCHEMA_VERSION:
        raise StoreError(
            f"store {path} has schema version {user_version} (one row per series and time, from an earlier gpuwm); "
            f"this gpuwm writes the compact version {SCHEMA_VERSION} and will not convert or overwrite it. "
            "Read it with the gpuwm that wrote it, or move it away / point --store at a new path: the latest "
            "figures come back within one interval, the history before does not."
        )


def create_schema(connection: sqlite3.Connection, path: Path) -> None:
    """Create the tables of a new file (or check an existing one is ours), in WAL mode."""
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    if version == 0:
        tables = connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if tables:
            raise StoreError(
                f"store {path} is a SQLite database with tables but no gpuwm schema; refusing to touch it. "
                "Point --store at a new path."
            )
        # application_id goes into the main file before WAL mode, so the header check sees it at once
        # chunks are 1-4 KiB blobs: 16 KiB pages waste less of each page than SQLite's 4 KiB default
        connection.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        log.info("created store", extra={"store": str(path), "schema_version": SCHEMA_VERSION})
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
        # one row per interval and block of BLOCK series: what `record` appends
        "CREATE TABLE IF NOT EXISTS head (block INTEGER NOT NULL, t INTEGER NOT NULL, data BLOB NOT NULL, "
        "UNIQUE (block, t))",
        # one row per tier (its step in seconds), series and span start: compacted points
        "CREATE TABLE IF NOT EXISTS chunks (tier INTEGER NOT NULL, series_id INTEGER NOT NULL, "
        "start INTEGER NOT NULL, points INTEGER NOT NULL, data BLOB NOT NULL, UNIQUE (tier, series_id, start))",
        "CREATE INDEX IF NOT EXISTS chunks_by_start ON chunks (tier, start)",
    ]
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
