"""Statements that name many rows: their ids a bounded batch at a time, with a `?` for each."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import TypeVar

_Item = TypeVar("_Item")

#: ids per statement (well below SQLite's variable limit)
BATCH = 500


def batches(items: Sequence[_Item], size: int = BATCH) -> Iterator[list[_Item]]:
    for offset in range(0, len(items), size):
        yield list(items[offset : offset + size])


def marks(batch: Collection[object]) -> str:
    """The placeholders of an `IN (...)` list or a row of `batch`'s length."""
    return ",".join("?" * len(batch))
