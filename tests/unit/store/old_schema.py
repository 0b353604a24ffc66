"""Rewrite a file of the current schema as an earlier schema left it (test support for the migrations).

Schema 4 had no `host_payload` (the pods' requests, limits and disk rates), schema 5 no `figures_payload`
(the engine's cumulative figures), `holdings` or `openings`; each wrote head rows and a metric layout
only as wide as its metrics. Schema 6 and those before had no `*_extremes_payload` (the roll-ups' gauge
minima and maxima).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np

from gpuwm.store.base import METRIC_NAMES
from gpuwm.store.codec import (
    METRIC_COUNT,
    MISSING,
    SCHEMA4_METRIC_COUNT,
    SCHEMA5_METRIC_COUNT,
    decode_head,
    encode_head,
)
from gpuwm.store.schema import PART_COLUMNS

#: the roll-ups' extremes columns schema 7 added
_EXTREMES = tuple(column for column in PART_COLUMNS.values() if column.endswith("_extremes_payload"))
#: per earlier schema: (its metric count, the payload columns it did not have)
LAYOUTS = {
    4: (SCHEMA4_METRIC_COUNT, ("host_payload", "figures_payload", *_EXTREMES)),
    5: (SCHEMA5_METRIC_COUNT, ("figures_payload", *_EXTREMES)),
    6: (METRIC_COUNT, _EXTREMES),
}


def metric_count(version: int) -> int:
    return LAYOUTS[version][0]


def narrowed(values: dict[tuple[int, int, int], list[list[int]]], version: int) -> dict[tuple[int, int, int], list[list[int]]]:
    """`chunk_values` as the file of `version` holds them: the later metrics missing (chunks left with none dropped)."""
    count = metric_count(version)
    kept = {key: [row if index < count else [MISSING] * len(row) for index, row in enumerate(rows)]
            for key, rows in values.items()}
    return {key: rows for key, rows in kept.items() if any(v != MISSING for row in rows for v in row)}


def rewrite_as_schema(path: Path, version: int) -> None:
    """The file at `path` (closed) as schema `version` (4, 5 or 6) left it."""
    count, dropped = LAYOUTS[version]
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("BEGIN")
    connection.execute("DROP INDEX chunks_pieces")
    for name in ("chunks_ref", "chunks_unref", "chunks_reref"):
        connection.execute(f"DROP TRIGGER {name}")
    for column in dropped:
        connection.execute(f"ALTER TABLE chunks DROP COLUMN {column}")
    kept = [column for column in PART_COLUMNS.values() if column not in dropped]
    # a chunk left with no part at all is no chunk of that schema (a workload series' engine figures only)
    connection.execute(f"DELETE FROM chunks WHERE coalesce({', '.join(kept)}) IS NULL")
    named = " UNION ALL ".join(f"SELECT {column} AS payload FROM chunks WHERE {column} IS NOT NULL" for column in kept)
    connection.execute(f"UPDATE payloads SET refs = (SELECT count(*) FROM ({named}) WHERE payload = payloads.id)")
    connection.execute("DELETE FROM payloads WHERE refs = 0")
    if version < 6:
        connection.execute("DROP TABLE IF EXISTS holdings")
        connection.execute("DROP TABLE IF EXISTS openings")
    for block, t, data in connection.execute("SELECT block, t, data FROM head").fetchall():
        narrow = np.ascontiguousarray(decode_head(data)[:, :count])
        connection.execute("UPDATE head SET data = ? WHERE block = ? AND t = ?", (encode_head(narrow), block, t))
    connection.execute("UPDATE meta SET value = ? WHERE key = 'metrics'", (json.dumps(METRIC_NAMES[:count]),))
    connection.execute(f"PRAGMA user_version = {version}")
    connection.execute("COMMIT")
    connection.close()
