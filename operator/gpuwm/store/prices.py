"""Each run's price per GPU-hour in the embedded store: what a period report prices its GPU-seconds at.

The controller prices a run by the devices it holds (node labels, GPU model, the default: `CostMeter`) and
remembers that price once it holds none; the store keeps it in `workload_prices`, a row when it changes.
The API cannot price a run again by itself: a finished run's figures name no devices, and node labels are
known only to the controller. A period takes the price recorded last by its end (else the first recorded
after it, for a run priced only once pricing was switched on): the price is the same whatever period is
asked while it holds, so the cost of periods adds up as their GPU-seconds do.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence

from gpuwm.store.base import GpuHourPrice
from gpuwm.store.sql import batches, marks


class PriceWriter:
    """Writes `workload_prices` rows inside the store's write transactions: a run's price where it changed
    from the last one this file holds for it."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection
        self._last: dict[str, GpuHourPrice] | None = None  # read from the file when first needed

    def reload(self) -> None:
        """Read the file again before the next write (after a rolled-back transaction)."""
        self._last = None

    def _known(self) -> dict[str, GpuHourPrice]:
        if self._last is None:
            rows = self._connection.execute(
                "SELECT uid, price_per_gpu_hour, currency, max(t) FROM workload_prices GROUP BY uid")
            self._last = {uid: GpuHourPrice(price, currency) for uid, price, currency, _ in rows}
        return self._last

    def changes(self, prices: Mapping[str, GpuHourPrice]) -> dict[str, GpuHourPrice]:
        """The prices that differ from the last this file holds for their runs (most intervals: none)."""
        known = self._known()
        return {uid: price for uid, price in prices.items() if known.get(uid) != price}

    def write(self, at: float, changed: Mapping[str, GpuHourPrice]) -> None:
        """Write the `changed` prices as of `at` (inside the caller's transaction)."""
        self._connection.executemany(
            "INSERT OR REPLACE INTO workload_prices (uid, t, price_per_gpu_hour, currency) VALUES (?, ?, ?, ?)",
            [(uid, at, price.price_per_gpu_hour, price.currency) for uid, price in changed.items()])
        self._known().update(changed)

    def forget(self, uids: Sequence[str]) -> None:
        """Drop the prices of runs the store no longer keeps a point of."""
        for batch in batches(uids):
            self._connection.execute(f"DELETE FROM workload_prices WHERE uid IN ({marks(batch)})", batch)
        if self._last is not None:
            for uid in uids:
                self._last.pop(uid, None)


def read_prices(connection: sqlite3.Connection, uids: Sequence[str], end: float) -> dict[str, GpuHourPrice]:
    """Each run's price recorded last at or before `end`, else its first; runs never priced left out."""
    found: dict[str, GpuHourPrice] = {}
    settled: set[str] = set()
    for batch in batches(sorted(set(uids))):
        rows = connection.execute(
            f"SELECT uid, t, price_per_gpu_hour, currency FROM workload_prices WHERE uid IN ({marks(batch)}) "
            "ORDER BY uid, t", batch)
        for uid, t, price, currency in rows:
            if uid in settled:
                continue
            if uid not in found or t <= end:
                found[uid] = GpuHourPrice(price, currency)
            if t > end:  # later prices do not apply to the period
                settled.add(uid)
    return found
