"""The embedded store's SQLite connections: one writer, and a read-only connection per reading thread.

SQLite in WAL mode lets readers run beside the writer, each on a connection of its own. The API reads
from worker threads that come and go (anyio retires one idle for 10 s), so a thread's connection is
made on its first read and closed once its thread has ended.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

from gpuwm.store.base import METRIC_NAMES, StoreError
from gpuwm.store.schema import create_schema

#: page cache of the writing connection (readers keep the bigger cache and mmap of `connect`): record() takes
#: the same CPU with a bigger one (bench/README.md, "The store's choices"); 4 MiB keeps an interval's head pages
#: (every block's leaves and the tree above them) at 1,000 nodes with room to spare
WRITER_CACHE_KIB = 4 * 1024


def connect(path: Path) -> sqlite3.Connection:
    """A connection to the store file: autocommit (the store opens its transactions), usable from any thread,
    waiting for a lock up to 30 s, with a big page cache and mmap for reading."""
    connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30.0)
    connection.execute("PRAGMA busy_timeout = 30000")
    connection.execute("PRAGMA cache_size = -65536")
    connection.execute("PRAGMA mmap_size = 1073741824")
    return connection


def open_writer(path: Path) -> sqlite3.Connection:
    """The writing connection, the file's schema created or migrated (schema.py), its metric layout checked.

    Its pages are the controller's resident memory, which has a budget: a small cache, and no mmap.
    sqlite3.DatabaseError where the file is corrupt (the caller says so, with what else it reads).
    """
    if not path.parent.exists():
        raise StoreError(f"store {path}: directory {path.parent} does not exist; create it or fix --store")
    connection = connect(path)
    connection.execute("PRAGMA mmap_size = 0")
    create_schema(connection, path)
    stored = json.loads(connection.execute("SELECT value FROM meta WHERE key = 'metrics'").fetchone()[0])
    if list(stored) != list(METRIC_NAMES):
        raise StoreError(f"store {path} has an incompatible metric layout; point --store at a new path")
    # set after the schema: a new file's `page_size` pragma leaves a cache size set before it unenforced
    # (SQLite 3.40: the cache then kept every page written)
    connection.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
    return connection


class Readers:
    """Each reading thread's read-only connection, with its thread (a dead thread's is closed on the next opening)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._local = threading.local()
        self._open: list[tuple[threading.Thread, sqlite3.Connection]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """The connections open now."""
        return len(self._open)

    def connection(self) -> sqlite3.Connection:
        """This thread's connection, opened on its first read."""
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = connect(self._path)
            connection.execute("PRAGMA query_only = 1")
            self._local.connection = connection
            with self._lock:
                live: list[tuple[threading.Thread, sqlite3.Connection]] = []
                ended: list[tuple[threading.Thread, sqlite3.Connection]] = []
                for each in self._open:
                    (live if each[0].is_alive() else ended).append(each)
                self._open = [*live, (threading.current_thread(), connection)]
            for _, gone in ended:  # its thread has ended: nothing runs on it any more
                gone.close()
        return connection

    def close(self) -> None:
        """Close every thread's connection; a later read opens a new one."""
        with self._lock:
            readers, self._open = self._open, []
        for _, connection in readers:
            connection.close()
        self._local = threading.local()
