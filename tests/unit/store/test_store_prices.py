"""Each run's price per GPU-hour in the embedded store: a row when it changes, the one in force at a period's
end read back, kept across a reopen, and gone with the run's series."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwm.store import GpuHourPrice
from gpuwm.store.embedded import EmbeddedStore

from .store_data import cluster, project, sample, workload

H100 = GpuHourPrice(4.0, "EUR")
SPOT = GpuHourPrice(1.2, "EUR")
SMALL_TIERS = ["15s:4m", "1m:10m"]


def _rows(store: EmbeddedStore) -> list[tuple[str, float, float]]:
    return store._writer.execute("SELECT uid, t, price_per_gpu_hour FROM workload_prices ORDER BY uid, t").fetchall()


def test_a_price_is_written_when_it_changes_and_read_as_of_a_periods_end(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db")
    try:
        for t in (100.0, 115.0, 130.0):
            store.record_prices(t, {"uid-a": H100, "uid-b": SPOT})
        store.record_prices(145.0, {"uid-a": SPOT, "uid-b": SPOT})
        assert _rows(store) == [("uid-a", 100.0, 4.0), ("uid-a", 145.0, 1.2), ("uid-b", 100.0, 1.2)]
        # the price recorded last by the end, else the first: a run priced after the period is still priced
        assert store.gpu_hour_prices(["uid-a", "uid-b"], 0.0, 120.0) == {"uid-a": H100, "uid-b": SPOT}
        assert store.gpu_hour_prices(["uid-a"], 0.0, 145.0) == {"uid-a": SPOT}
        assert store.gpu_hour_prices(["uid-a"], 0.0, 50.0) == {"uid-a": H100}
        assert store.gpu_hour_prices(["uid-a", "uid-never"], 0.0, 1e12) == {"uid-a": SPOT}
        assert store.gpu_hour_prices([], 0.0, 1e12) == {}
    finally:
        store.close()


def test_a_reopened_store_writes_no_price_it_holds_already(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = EmbeddedStore(path)
    store.record_prices(100.0, {"uid-a": H100})
    store.close()
    store = EmbeddedStore(path)
    try:
        store.record_prices(115.0, {"uid-a": H100})
        store.record_prices(130.0, {"uid-a": GpuHourPrice(4.0, "USD")})  # another currency is another price
        assert _rows(store) == [("uid-a", 100.0, 4.0), ("uid-a", 130.0, 4.0)]
        assert store.gpu_hour_prices(["uid-a"], 0.0, 1e12) == {"uid-a": GpuHourPrice(4.0, "USD")}
    finally:
        store.close()


def test_a_rolled_back_price_is_written_again(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db")
    try:
        store.record_prices(100.0, {"uid-a": H100})
        with pytest.raises(RuntimeError), store._transaction():
            store._prices.write(115.0, {"uid-a": SPOT})
            raise RuntimeError("the interval's write failed after the price")
        store.record_prices(130.0, {"uid-a": SPOT})
        assert _rows(store) == [("uid-a", 100.0, 4.0), ("uid-a", 130.0, 1.2)]
    finally:
        store.close()


def test_a_runs_price_goes_with_its_series(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)
    try:
        def interval(t: float, names: list[str]) -> None:
            jobs = [workload(name, [(f"gpu-{index}", 1.0, 40.0)]) for index, name in enumerate(names)]
            store.record(t, [sample(t, f"gpu-{index}") for index in range(len(names))], jobs,
                         [project("alpha", jobs)], cluster(len(names)))
            store.record_prices(t, {job.uid: H100 for job in jobs})

        for t in range(0, 300, 15):
            interval(float(t), ["train", "serve"])
        assert {uid for uid, _, _ in _rows(store)} == {"uid-train", "uid-serve"}
        t = 300
        while t < 1500 and any(uid == "uid-train" for uid, _, _ in _rows(store)):
            interval(float(t), ["serve"])
            t += 15
        assert {uid for uid, _, _ in _rows(store)} == {"uid-serve"}
        assert not any(kind == "workload" and key == "uid-train" for kind, key in store._series_ids)
    finally:
        store.close()
