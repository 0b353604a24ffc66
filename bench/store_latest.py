"""The latest workload figures' table: CPU per interval of rewriting every live workload's row.

Each interval the store rewrites the latest figures of every running workload (~2.7 KB of JSON
each; 4,000 at the controller benchmark's size) in one transaction. This compares the table
layouts and statements, in the store's own page size and journal settings:

    .venv/bin/python bench/store_latest.py [--workloads 4000] [--intervals 12] [--row-bytes 2700]

Layouts: the earlier WITHOUT ROWID table with its (namespace, name, at) index, rewritten with
INSERT OR REPLACE, and the rowid table with its (namespace, name) index updated in place
(upsert), which the store uses now (gpuwm.store.schema.LATEST_WORKLOADS_TABLE).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from gpuwm.store.latest import _insert_statement  # noqa: E402
from gpuwm.store.schema import LATEST_WORKLOADS_TABLE, PAGE_SIZE  # noqa: E402

_EARLIER = (
    "CREATE TABLE latest_workloads (uid TEXT PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL, "
    "project TEXT NOT NULL, at REAL NOT NULL, figures TEXT NOT NULL) WITHOUT ROWID",
    "CREATE INDEX latest_workloads_by_name ON latest_workloads (namespace, name, at)",
)
_NOW = (LATEST_WORKLOADS_TABLE, "CREATE INDEX latest_workloads_by_name ON latest_workloads (namespace, name)")
_REPLACE = "INSERT OR REPLACE INTO latest_workloads VALUES (?, ?, ?, ?, ?, ?)"


def measure(schema: tuple[str, ...], statement: str, args: argparse.Namespace) -> tuple[float, float, int]:
    """(mean, max) CPU seconds per interval after the first two, and the file's size in bytes."""
    folder = Path(tempfile.mkdtemp(prefix="gpuwm-latest-"))
    try:
        connection = sqlite3.connect(folder / "latest.db", isolation_level=None)
        connection.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = NORMAL")
        for sql in schema:
            connection.execute(sql)
        rng = random.Random(1)
        keys = [(str(uuid.UUID(int=rng.getrandbits(128))), f"team-{i % 40}", f"job-{i}") for i in range(args.workloads)]
        # JSON-like text that differs from interval to interval (the figures move every interval)
        texts = [os.urandom(args.row_bytes // 2).hex() for _ in range(args.workloads)]
        spent = []
        for interval in range(args.intervals):
            rows = [(uid, namespace, name, "alpha", 1000.0 + 15 * interval, texts[(i + interval) % len(texts)])
                    for i, (uid, namespace, name) in enumerate(keys)]
            started = time.process_time()
            connection.execute("BEGIN IMMEDIATE")
            connection.executemany(statement, rows)
            connection.execute("COMMIT")
            spent.append(time.process_time() - started)
        connection.close()
        steady = spent[2:] or spent
        return statistics.mean(steady), max(steady), (folder / "latest.db").stat().st_size
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=int, default=4000)
    parser.add_argument("--intervals", type=int, default=12)
    parser.add_argument("--row-bytes", type=int, default=2700, help="bytes of figures JSON per workload")
    args = parser.parse_args()
    for label, schema, statement in (
        ("earlier: WITHOUT ROWID, INSERT OR REPLACE", _EARLIER, _REPLACE),
        ("now: rowid table, updated in place", _NOW, _insert_statement("latest_workloads", 6)),
    ):
        mean, most, size = measure(schema, statement, args)
        print(f"{label}: {mean * 1000:.1f} ms CPU per interval (max {most * 1000:.1f}) for {args.workloads} rows of "
              f"{args.row_bytes} bytes; file {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
