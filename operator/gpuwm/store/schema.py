"""The embedded store's file: what makes a file ours (application id, schema version) and its tables.

Why each table: `series` names every series once; `head` holds one row per interval and block of
series (what `record` appends); `chunks` one row per tier, series and span (compacted points) naming
its bytes in `payloads`, one payload per *part* of the metrics (codec.PARTS), where identical bytes are
kept once, counted by triggers so the bytes go when the last chunk naming them does; `latest_*` the
latest figures; `meta` the metric layout and watermarks; `holdings` a row when a workload's units held
change (or it accrues GPU-seconds while holding none at a status interval), from which reports find who
held GPUs in a period and the peaks of any group of workloads; `openings` what a workload had accrued
before the store first saw it, which reports apportion over its life before then.

Each schema since 4 adds parts at the end of the layout; a file of an earlier one is migrated in place,
in one transaction, when opened: it gains the columns (NULL in its chunks: those metrics missing) and
the tables, and its head rows are read as they are (narrower). Schema 5 added the pods' requests, limits
and disk rates (`host_payload`); 6 the engine's cumulative figures (`figures_payload`, `Rollup.LAST`),
`holdings` and `openings`; 7 the roll-ups' min and max of the gauges that keep extremes
(`*_extremes_payload`, codec.EXTREME_PARTS; the finest tier's chunks have none, a point being its own
min and max): a roll-up bucket written before has its mean only, which a reader takes as its min and max
too (`sqlite_read`). A chunk may name one payload of every metric in the `payload` column (codec.WHOLE,
as schema 3 wrote it): it reads back the same, and the next write of that chunk splits it. Schema 2 kept
the bytes inline in `chunks`; its migration moves them to `payloads`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from gpuwm.store.base import METRIC_NAMES, StoreError
from gpuwm.store.codec import EXTREME_PARTS, WHOLE
from gpuwm.store.figures import FIGURE_NAMES
from gpuwm.store.sql import batches, marks

log = logging.getLogger(__name__)

APPLICATION_ID = 0x6770776D  # "gpwm"
SCHEMA_VERSION = 7
#: the oldest schema this gpuwm converts when it opens the file
MIGRATABLE_VERSION = 2
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
    if 0 < user_version < MIGRATABLE_VERSION:
        raise StoreError(
            f"store {path} has schema version {user_version} (one row per series and time, from an earlier gpuwm); "
            f"this gpuwm writes the compact version {SCHEMA_VERSION} and converts only {MIGRATABLE_VERSION} and later, "
            "so it will not convert or overwrite it. "
            "Read it with the gpuwm that wrote it, or move it away / point --store at a new path: the latest "
            "figures come back within one interval, the history before does not."
        )


#: the column of `chunks` that names each part's payload (codec.PARTS); `payload` is the whole chunk
#: of schema 3, never written since; an extremes part's column only where codec.EXTREME_PARTS has the part
_EXTREMES_COLUMNS: dict[int, str] = {part: column for part, column in {
    7: "device_extremes_payload", 8: "units_extremes_payload", 9: "pod_extremes_payload",
    10: "host_extremes_payload"}.items() if part in EXTREME_PARTS}
PART_COLUMNS: dict[int, str] = {WHOLE: "payload", 1: "device_payload", 2: "energy_payload", 3: "units_payload",
                                4: "pod_payload", 5: "host_payload", 6: "figures_payload", **_EXTREMES_COLUMNS}
#: the payload columns added after schema 4, in the order they came: a file of an earlier schema gains those it lacks
_ADDED_COLUMNS = ("host_payload", "figures_payload", *_EXTREMES_COLUMNS.values())
#: one row per chunk and part it names, (tier, series_id, start, points, part, payload): for tools and
#: tests that count bytes or references by payload (the store itself reads chunks through `read_chunks`)
PART_ROWS = " UNION ALL ".join(
    f"SELECT tier, series_id, start, points, {part} AS part, {column} AS payload FROM chunks WHERE {column} IS NOT NULL"
    for part, column in PART_COLUMNS.items()
)
#: a chunk that is a coarse span's piece (its payload ids below zero, every part's: `store_payloads`):
#: the partial index's condition, which a query must repeat word for word for SQLite to use the index
PIECE_CONDITION = f"coalesce({', '.join(PART_COLUMNS.values())}) < 0"


def _ref_statements(sign: str, row: str, when: str = "") -> str:
    return " ".join(f"UPDATE payloads SET refs = refs {sign} 1 WHERE id = {row}.{column}{when.format(column=column)};"
                    for column in PART_COLUMNS.values())


#: the chunk tables; `chunks` rows are small, so the table is its own primary-key index
#: (retention finds old chunks series by series through it: a second index by start cost bytes on every chunk)
_CHUNK_TABLES = [
    # one row per tier (its step in seconds), series and span start: compacted points, by payload id per
    # part (NULL: no point of that part's metrics)
    "CREATE TABLE IF NOT EXISTS chunks (tier INTEGER NOT NULL, series_id INTEGER NOT NULL, "
    "start INTEGER NOT NULL, points INTEGER NOT NULL, "
    + ", ".join(f"{column} INTEGER" for column in PART_COLUMNS.values())
    + ", PRIMARY KEY (tier, series_id, start)) WITHOUT ROWID",
    # encoded chunk bytes, once however many chunks hold them. Ids are handed out in order (rows
    # appended fill whole pages; hash-ordered ids left a quarter of each page empty); `hash` (32
    # bits, compared with the bytes) finds an identical payload
    "CREATE TABLE IF NOT EXISTS payloads (id INTEGER PRIMARY KEY, hash INTEGER NOT NULL, refs INTEGER NOT NULL, "
    "data BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS payloads_by_hash ON payloads (hash)",
    # refs counts the chunk columns naming a payload, kept by the file itself so no write path can forget
    # it; bytes whose count fell to 0 go in `sweep_payloads` (not in the trigger: a later row of the same
    # statement may name them again), found through this small partial index
    "CREATE INDEX IF NOT EXISTS payloads_unreferenced ON payloads (id) WHERE refs <= 0",
    # the coarse pieces (payload ids below zero) of spans not merged yet: few rows, found without a scan
    f"CREATE INDEX IF NOT EXISTS chunks_pieces ON chunks (tier, start) WHERE {PIECE_CONDITION}",
    f"CREATE TRIGGER IF NOT EXISTS chunks_ref AFTER INSERT ON chunks BEGIN {_ref_statements('+', 'new')} END",
    f"CREATE TRIGGER IF NOT EXISTS chunks_unref AFTER DELETE ON chunks BEGIN {_ref_statements('-', 'old')} END",
    "CREATE TRIGGER IF NOT EXISTS chunks_reref AFTER UPDATE ON chunks BEGIN "
    + _ref_statements("+", "new", " AND new.{column} IS NOT old.{column}")
    + " "
    + _ref_statements("-", "old", " AND new.{column} IS NOT old.{column}")
    + " END",
]


def payload_hash(data: bytes) -> int:
    """What finds a payload's identical copy: 32 bits of BLAKE2b (a match is confirmed on the bytes)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "big", signed=True)


def store_payloads(connection: sqlite3.Connection, payloads: Sequence[bytes], transient: bool = False) -> list[int]:
    """The payload id of each of `payloads`, inserting the bytes not stored yet (inside the caller's
    transaction). Identical bytes get one id, found by hash and confirmed byte for byte.

    `transient` bytes (a coarse span's pieces, replaced by the whole chunk when the span ends) get
    ids below zero, counting down, so they fill pages of their own: mixed in with the chunks that
    stay, their deletion left payload pages part empty.
    """
    hashes = {data: payload_hash(data) for data in payloads}
    found: dict[bytes, int] = {}
    unique = sorted(set(hashes.values()))
    # transient bytes are shared with transient bytes only, lasting with lasting: every part of a piece
    # has an id below zero, every part of a whole chunk one above (what PIECE_CONDITION relies on)
    sign = "id < 0" if transient else "id > 0"
    for batch in batches(unique):
        for payload_id, data in connection.execute(
            f"SELECT id, data FROM payloads WHERE hash IN ({marks(batch)}) AND {sign}", batch
        ):
            if data in hashes:
                found.setdefault(data, payload_id)
    lowest: int | None = None
    for data, digest in hashes.items():
        if data in found:
            continue
        if transient:
            if lowest is None:
                lowest = min(0, connection.execute("SELECT coalesce(min(id), 0) FROM payloads").fetchone()[0])
            lowest -= 1
            connection.execute("INSERT INTO payloads (id, hash, refs, data) VALUES (?, ?, 0, ?)", (lowest, digest, data))
            found[data] = lowest
        else:
            cursor = connection.execute("INSERT INTO payloads (hash, refs, data) VALUES (?, 0, ?)", (digest, data))
            found[data] = int(cursor.lastrowid or 0)
    return [found[data] for data in payloads]


def sweep_payloads(connection: sqlite3.Connection) -> int:
    """Drop the payloads no chunk names any more (inside the caller's transaction); returns how many."""
    return connection.execute("DELETE FROM payloads WHERE refs <= 0").rowcount


def _migrate_from_2(connection: sqlite3.Connection, path: Path) -> None:
    """Schema 2 -> 4 inside the caller's transaction: chunk bytes move into `payloads`, once each, each
    chunk naming its bytes as schema 3 did (the whole chunk, in `payload`)."""
    connection.execute("DROP INDEX IF EXISTS chunks_by_start")
    connection.execute("ALTER TABLE chunks RENAME TO chunks_schema2")
    for statement in _CHUNK_TABLES:
        connection.execute(statement)
    # a coarse tier's pieces: fewer points than its whole chunks (the finest tier has none)
    whole = dict(connection.execute("SELECT tier, max(points) FROM chunks_schema2 GROUP BY tier").fetchall())
    finest = min(whole, default=0)
    rows = connection.execute("SELECT tier, series_id, start, points, data FROM chunks_schema2")
    moved = 0
    while batch := rows.fetchmany(1000):
        for transient in (False, True):
            chosen = [row for row in batch if (row[0] != finest and row[3] < whole[row[0]]) == transient]
            ids = store_payloads(connection, [row[4] for row in chosen], transient=transient)
            connection.executemany(
                "INSERT INTO chunks (tier, series_id, start, points, payload) VALUES (?, ?, ?, ?, ?)",
                [(*row[:4], payload_id) for row, payload_id in zip(chosen, ids, strict=True)],
            )
        moved += len(batch)
    connection.execute("DROP TABLE chunks_schema2")
    payloads = connection.execute("SELECT count(*) FROM payloads").fetchone()[0]
    log.info(
        "migrated store from schema 2",
        extra={"store": str(path), "chunks": moved, "payloads": payloads, "schema_version": SCHEMA_VERSION},
    )


def _migrate_from_3(connection: sqlite3.Connection, path: Path) -> None:
    """Schema 3 -> 4 inside the caller's transaction: `chunks` gains a payload column per part.

    The payloads stay as they are (each still named once by the same chunk), so their counts hold;
    only the small chunk rows are copied."""
    connection.execute("DROP INDEX IF EXISTS chunks_pieces")
    for trigger in ("chunks_ref", "chunks_unref", "chunks_reref"):
        connection.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    connection.execute("ALTER TABLE chunks RENAME TO chunks_schema3")
    for statement in _CHUNK_TABLES:
        connection.execute(statement)
    # the new table's trigger counts each copied row: the counts start again from 0 (the old table's
    # triggers are gone, so dropping it takes nothing off)
    connection.execute("UPDATE payloads SET refs = 0")
    moved = connection.execute(
        "INSERT INTO chunks (tier, series_id, start, points, payload) "
        "SELECT tier, series_id, start, points, payload FROM chunks_schema3"
    ).rowcount
    connection.execute("DROP TABLE chunks_schema3")
    log.info("migrated store to schema 4", extra={"store": str(path), "chunks": moved, "schema_version": SCHEMA_VERSION})


def _migrate_columns(connection: sqlite3.Connection, path: Path) -> None:
    """Schema 4, 5 or 6 (or a file just migrated from 2 or 3) -> 7 inside the caller's transaction: `chunks`
    gains each payload column it lacks (`_ADDED_COLUMNS`; the triggers and the pieces'
    index name every payload column, so they are made again by `_CHUNK_TABLES`), and the metric layout in
    `meta` gains the new metrics after the old ones. Chunks and head rows are not rewritten: their new
    metrics are missing, which is what they are. The new tables come with `create_schema`'s statements."""
    columns = {row[1] for row in connection.execute("PRAGMA table_info(chunks)")}
    added = [column for column in _ADDED_COLUMNS if column not in columns]
    if added:
        connection.execute("DROP INDEX IF EXISTS chunks_pieces")
        for trigger in ("chunks_ref", "chunks_unref", "chunks_reref"):
            connection.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        for column in added:
            connection.execute(f"ALTER TABLE chunks ADD COLUMN {column} INTEGER")
    row = connection.execute("SELECT value FROM meta WHERE key = 'metrics'").fetchone()
    if row is not None:
        stored = list(json.loads(row[0]))
        if stored != list(METRIC_NAMES[: len(stored)]):
            raise StoreError(f"store {path} has an incompatible metric layout; point --store at a new path")
        connection.execute("UPDATE meta SET value = ? WHERE key = 'metrics'", (json.dumps(METRIC_NAMES),))
    log.info("migrated store", extra={"store": str(path), "schema_version": SCHEMA_VERSION, "columns": added})


#: `holdings`, `records` and `openings` (store/holdings.py): a row when a workload's units held change, by
#: series and bucket, found by time for a period; the buckets the store recorded an interval at; what a
#: workload new to the store had accrued before, by series
HOLDINGS_TABLES = [
    "CREATE TABLE IF NOT EXISTS holdings (series_id INTEGER NOT NULL, t INTEGER NOT NULL, units REAL NOT NULL, "
    "PRIMARY KEY (series_id, t)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS holdings_by_t ON holdings (t)",
    "CREATE TABLE IF NOT EXISTS records (t INTEGER PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS openings (series_id INTEGER PRIMARY KEY, t INTEGER NOT NULL, since REAL NOT NULL, "
    "units REAL NOT NULL, "
    + ", ".join(f"{name} INTEGER NOT NULL" for name in FIGURE_NAMES) + ")",
]


#: each run's price per GPU-hour (store/prices.py): a row when the controller's price of it changes
PRICE_TABLES = [
    "CREATE TABLE IF NOT EXISTS workload_prices (uid TEXT NOT NULL, t REAL NOT NULL, "
    "price_per_gpu_hour REAL NOT NULL, currency TEXT NOT NULL, PRIMARY KEY (uid, t)) WITHOUT ROWID",
]


#: a rowid table: its ~2-3 KB rows (a workload's figures JSON), rewritten every interval, are cheaper to
#: update in place there than in the index b-tree of a WITHOUT ROWID table, which holds ~5 of them a page
#: and was rebalanced at each rewrite (`bench/store_latest.py`). Its index leaves out `at`, which every
#: write changes; a uid's namespace and name never change, so a rewrite does not touch the index
LATEST_WORKLOADS_TABLE = (
    "CREATE TABLE IF NOT EXISTS latest_workloads (uid TEXT PRIMARY KEY, namespace TEXT NOT NULL, "
    "name TEXT NOT NULL, project TEXT NOT NULL, at REAL NOT NULL, figures TEXT NOT NULL)"
)


def _rebuild_latest_workloads(connection: sqlite3.Connection, path: Path) -> None:
    """A file written before the latest figures' table was a rowid table gets one (inside the caller's
    transaction). The rows are copied as they are; the file's schema version stays (the columns and
    every query are the same, so an earlier gpuwm still reads and writes it)."""
    row = connection.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'latest_workloads'").fetchone()
    if row is None or "WITHOUT ROWID" not in row[0].upper():
        return
    connection.execute("DROP INDEX IF EXISTS latest_workloads_by_name")
    connection.execute("ALTER TABLE latest_workloads RENAME TO latest_workloads_before")
    connection.execute(LATEST_WORKLOADS_TABLE)
    copied = connection.execute(
        "INSERT INTO latest_workloads (uid, namespace, name, project, at, figures) "
        "SELECT uid, namespace, name, project, at, figures FROM latest_workloads_before"
    ).rowcount
    connection.execute("DROP TABLE latest_workloads_before")
    log.info("rebuilt the latest figures' table as a rowid table", extra={"store": str(path), "rows": copied})


def create_schema(connection: sqlite3.Connection, path: Path) -> None:
    """Create the tables of a new file (or check an existing one is ours, migrating schema 2), in WAL mode."""
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
        LATEST_WORKLOADS_TABLE,
        "CREATE INDEX IF NOT EXISTS latest_workloads_by_name ON latest_workloads (namespace, name)",
        "CREATE TABLE IF NOT EXISTS latest_projects (name TEXT PRIMARY KEY, at REAL NOT NULL, "
        "figures TEXT NOT NULL) WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS latest_cluster (id INTEGER PRIMARY KEY CHECK (id = 1), at REAL NOT NULL, "
        "figures TEXT NOT NULL)",
        # one row per interval and block of BLOCK series: what `record` appends
        "CREATE TABLE IF NOT EXISTS head (block INTEGER NOT NULL, t INTEGER NOT NULL, data BLOB NOT NULL, "
        "UNIQUE (block, t))",
    ]
    connection.execute("BEGIN IMMEDIATE")
    try:
        # read again under the write lock: another process (the API beside the controller) may have
        # migrated the file since, and a second migration of a migrated file is not one
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version == MIGRATABLE_VERSION:
            _migrate_from_2(connection, path)
        elif version == 3:
            _migrate_from_3(connection, path)
        if MIGRATABLE_VERSION <= version < SCHEMA_VERSION:
            _migrate_columns(connection, path)
            connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        _rebuild_latest_workloads(connection, path)
        for statement in statements + _CHUNK_TABLES + HOLDINGS_TABLES + PRICE_TABLES:
            connection.execute(statement)
        connection.execute(
            "INSERT OR IGNORE INTO meta VALUES ('metrics', ?)", (json.dumps(METRIC_NAMES),)
        )
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
