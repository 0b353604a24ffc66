"""The period report over 30 days at 1,000 nodes: how long `GET /api/v1/report` takes to answer.

    .venv/bin/python bench/report.py [--workloads 4000] [--finished 1000] [--days 30] [--workdir DIR [--reuse]]

Builds an embedded store (the default roll-ups, 15s:2d,5m:30d) holding `--days` of the engine's cumulative
figures of `--workloads` workloads running the whole time (2 GPUs each: 8,000 GPUs at 1,000 nodes of 8)
and `--finished` more that ran for a day or two early on and were forgotten a week after they ended
(their counters end long before the report's end). Loaded hour by hour through the store's bulk path
(`EmbeddedStore.load_history`, the chunks and roll-ups compaction writes), with the holdings and records
a controller's intervals would have written; only the workload series are loaded (a report reads nothing
else). Then times `build_report` (what the route runs off the loop) by project and by workload over the
last `--days` (an edge in the 5 min tier, apportioned, and one at the latest data), and over the last day
(both edges in the 15 s tier), three times each, and prints the best wall and CPU seconds (on a machine
shared with other work the CPU seconds are the figure to compare). Asserts nothing.

Target: the 30-day report at 1,000 nodes / 4,000 workloads answers in <= 2 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gpuwm.api.report import build_report
from gpuwm.store.base import METRIC_INDEX, METRICS
from gpuwm.store.codec import quantize
from gpuwm.store.embedded import EmbeddedStore
from gpuwm.store.figures import FIGURE_NAMES

STEP = 15
HOUR = 3600
UNITS = 2.0
#: the hours loaded into the 15 s tier (the report over a day reads edges there); the days before, 5 min only
FINE_HOURS = 26
#: the end of the loaded data: on an hour (the bulk path's spans), before the machine's now
END = 1_790_006_400 // 86400 * 86400


def _register(store: EmbeddedStore, count: int, prefix: str) -> list[int]:
    ids = []
    for index in range(count):
        uid = f"{prefix}-{index:05d}"
        labels = {"namespace": f"team-{index % 40}", "workload": f"job-{prefix}-{index}", "workload_uid": uid,
                  "project": f"project-{index % 10}"}
        ids.append(store.register_series("workload", uid, labels))
    return ids


def _hour(rng: np.random.Generator, totals: np.ndarray, running: np.ndarray) -> np.ndarray:
    """[series, metrics, 240] points of one hour: the figures of the running series grow each interval (active
    and idle by a random split), the others stay; totals (allocated, active, idle, energy) advance in place."""
    series = len(totals)
    values = np.full((series, len(METRICS), HOUR // STEP), np.nan)
    for step in range(HOUR // STEP):
        share = rng.choice([0.0, 0.5, 1.0], size=series)
        grows = running * UNITS * STEP
        totals[:, 0] += grows
        totals[:, 1] += grows * share
        totals[:, 2] += grows * (1 - share)
        totals[:, 3] += running * rng.uniform(200, 600, size=series) * STEP
        figures = {"allocated_gpu_seconds": totals[:, 0], "active_gpu_seconds": totals[:, 1],
                   "idle_gpu_seconds": totals[:, 2], "unmonitored_gpu_seconds": totals[:, 0] - totals[:, 1] - totals[:, 2],
                   "utilized_gpu_seconds": totals[:, 1] * 0.8, "energy_joules": totals[:, 3]}
        for name in FIGURE_NAMES:
            values[:, METRIC_INDEX[name], step] = figures[name]
        values[:, METRIC_INDEX["gpu_allocated"], step] = running * UNITS
    return values


def build(path: Path, workloads: int, finished: int, days: int) -> EmbeddedStore:
    """The store: the last FINE_HOURS hour by hour through the bulk path (fine chunks and their roll-ups), the
    days before as the 5 min tier's whole chunks alone (what the 15 s tier's retention leaves of them), made
    from the same points: each 5 min bucket's last value of the engine's figures, the units held."""
    store = EmbeddedStore(path)
    start = END - days * 86400
    ids = _register(store, workloads, "run") + _register(store, finished, "done")
    totals = np.zeros((len(ids), 4))
    rng = np.random.default_rng(1)
    ends = {series_id: start + int(rng.integers(1, 3)) * 86400 for series_id in ids[workloads:]}
    fine_from = END - FINE_HOURS * HOUR
    coarse = store.spans[-1]
    buffered: list[np.ndarray] = []
    began = time.monotonic()
    for hour in range(start, END, HOUR):
        keep = np.array([ends.get(series_id, END) + 7 * 86400 > hour for series_id in ids])
        running = np.array([1.0 if ends.get(series_id, END) > hour else 0.0 for series_id in ids])
        values = _hour(rng, totals, running)
        values[~keep] = np.nan  # forgotten a week after it ended: no more points
        if hour < fine_from:
            buffered.append(values[:, :, coarse.step // STEP - 1 :: coarse.step // STEP].copy())  # not a view: the hour goes
        span_start = (hour + HOUR) // coarse.span_seconds * coarse.span_seconds
        if buffered and (hour + HOUR == span_start or hour + HOUR == fine_from):
            _store_coarse(store, ids, span_start - len(buffered) * HOUR if hour + HOUR == span_start
                          else hour + HOUR - len(buffered) * HOUR, buffered)
            buffered = []
        if hour >= fine_from:
            store.load_history(ids, hour, values)
        if (hour - start) % (5 * 86400) == 0:
            print(f"  day {(hour - start) // 86400 + 1} of {days} ({time.monotonic() - began:.0f} s)", flush=True)
    with store._transaction(forget=False):
        connection = store._writer
        connection.executemany("INSERT INTO holdings VALUES (?, ?, ?)", [(i, start, UNITS) for i in ids])
        connection.executemany("INSERT INTO holdings VALUES (?, ?, ?)",
                               [(i, end // STEP * STEP, 0.0) for i, end in ends.items()])
        connection.executemany("INSERT INTO records VALUES (?)", [(t,) for t in range(start, END, STEP)])
        connection.execute("UPDATE meta SET value = ? WHERE key = 'earliest_time'", (float(start),))
    return store


def _store_coarse(store: EmbeddedStore, ids: list[int], first: int, hours: list[np.ndarray]) -> None:
    """Hours of 5 min points from `first` into the 5 min tier's chunk of their span, as whole chunks."""
    coarse = store.spans[-1]
    span_start = first // coarse.span_seconds * coarse.span_seconds
    values = np.full((len(ids), len(METRICS), coarse.points), np.nan)
    offset = (first - span_start) // coarse.step
    joined = np.concatenate(hours, axis=2)
    values[:, :, offset : offset + joined.shape[2]] = joined
    quantized = quantize(values.transpose(0, 2, 1)).transpose(0, 2, 1).copy()
    with store._transaction(forget=False):
        store._chunks._store(coarse, span_start, ids, quantized)
        store._set_meta("earliest_time", float(span_start))


def measure(store: EmbeddedStore, start: float, end: float, by: str) -> tuple[float, float, int]:
    """The best of three: (wall seconds, this process's CPU seconds, rows)."""
    best = (float("inf"), float("inf"))
    rows = 0
    for _ in range(3):
        began, cpu = time.monotonic(), time.process_time()
        workloads = store.period(start, end)
        report = build_report(store, workloads, start, end, by, 15.0, 1.0)  # type: ignore[arg-type]
        best = min(best, (time.monotonic() - began, time.process_time() - cpu))
        rows = len(report.rows)
    return best[0], best[1], rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=int, default=4000)
    parser.add_argument("--finished", type=int, default=1000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--reuse", action="store_true", help="reuse the database built by an earlier run in --workdir")
    args = parser.parse_args(argv)
    directory = args.workdir or Path(tempfile.mkdtemp(prefix="gpuwm-bench-report-"))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "report.db"
    shape = json.dumps([args.workloads, args.finished, args.days])
    marker = directory / "report.shape"
    try:
        if args.reuse and path.exists() and marker.exists() and marker.read_text() == shape:
            store = EmbeddedStore(path)
        else:
            for stale in directory.glob("report.db*"):
                stale.unlink()
            print(f"building: {args.workloads} running + {args.finished} finished workloads, {args.days} days", flush=True)
            store = build(path, args.workloads, args.finished, args.days)
            marker.write_text(shape)
        size = sum(each.stat().st_size for each in directory.glob("report.db*"))
        print(f"store: {size / 2**30:.2f} GiB", flush=True)
        latest = store.latest_time()
        assert latest is not None
        for label, start in ((f"{args.days} days", latest - args.days * 86400 + 7 * STEP + 3), ("1 day", latest - 86400)):
            for by in ("project", "workload"):
                seconds, cpu, rows = measure(store, start, latest, by)
                print(f"  report over {label} by {by}: {seconds:.2f} s, {cpu:.2f} CPU-s ({rows} rows; best of 3)",
                      flush=True)
        store.close()
    finally:
        if args.workdir is None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
