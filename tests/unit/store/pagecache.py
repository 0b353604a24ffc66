"""The page cache a SQLite connection holds now (tests and bench/controller.py)."""

from __future__ import annotations

import sqlite3


def page_cache_mib(connection: sqlite3.Connection) -> float | None:
    """SQLITE_DBSTATUS_CACHE_USED of a connection, through the C API (the sqlite3 module does not expose it);
    None where `sqlite3_db_status` cannot be reached from this Python's _sqlite3 module."""
    import _sqlite3
    import ctypes

    try:
        db_status = ctypes.CDLL(_sqlite3.__file__).sqlite3_db_status
    except (OSError, AttributeError):
        return None
    # pysqlite_Connection starts with PyObject_HEAD (two pointers), then `sqlite3 *db`
    handle = ctypes.c_void_p.from_address(id(connection) + 2 * ctypes.sizeof(ctypes.c_void_p)).value
    current, highest = ctypes.c_int(), ctypes.c_int()
    if db_status(ctypes.c_void_p(handle), 1, ctypes.byref(current), ctypes.byref(highest), 0) != 0:
        return None
    return current.value / 2**20
