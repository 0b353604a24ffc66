"""Each workload folds its window segments at a point of its own (48-80 segments after its last fold, from
its uid), so workloads started together do not all fold in the same maintenance.

With one fold point for all, 4,000 workloads started at once (a job array; bench/controller.py's)
grew and folded their segments in step: the controller's RSS rose and fell by ~18 MiB every ~5
minutes and one maintenance folded every workload. The point is the same for a uid in every process
and after a restore, so a replay gives the same figures.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import uuid

import pytest

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.accounting.windows import WindowSums, fold_after_of, maintain_all

from .helpers import pod, sample


def _uids(count: int) -> list[str]:
    rng = random.Random(17)
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(count)]


def test_fold_points_spread_around_64_and_are_the_same_in_every_process() -> None:
    uids = _uids(4000)
    points = [fold_after_of(uid) for uid in uids]
    assert min(points) == 48 and max(points) == 80
    assert statistics.mean(points) == pytest.approx(64, abs=1)
    assert len(set(points)) == 33
    other = subprocess.run(
        [sys.executable, "-c", "import sys, json; from gpuwm.accounting.windows import fold_after_of; "
         "print(json.dumps([fold_after_of(u) for u in json.loads(sys.stdin.read())]))"],
        input=json.dumps(uids[:50]), capture_output=True, text=True, check=True,
    )
    assert json.loads(other.stdout) == points[:50]  # not Python's per-process string hash


def _fold_counts(fold_points: list[int]) -> tuple[list[int], list[int]]:
    """Workloads fed the same segments in step, maintained every 30 s: (how many fold in each maintenance,
    the total segments before each)."""
    many = [WindowSums(point) for point in fold_points]
    folds, totals = [], []
    now = 1_763_900_000.0
    for second in range(0, 7200, 5):  # a segment every 5 s each (merged polls: ~0.2 a second), all different rates
        t = now + second
        for index, sums in enumerate(many):
            sums.add(t - 5.0, t, 1.0, float((second * 7 + index) % 100), 1.0, 50.0)
        if second % 30 == 25:
            before = [len(sums) for sums in many]
            totals.append(sum(before))
            maintain_all(many, t)
            # a fold takes off dozens of segments; the hour's trim, which all do together, a few
            folds.append(sum(len(sums) < count - 20 for sums, count in zip(many, before, strict=True)))
    return folds, totals


def test_workloads_started_together_fold_in_different_maintenances() -> None:
    uids = _uids(200)
    spread_folds, spread_totals = _fold_counts([fold_after_of(uid) for uid in uids])
    same_folds, same_totals = _fold_counts([64] * len(uids))
    assert max(same_folds) == 200  # one point for all: every workload in the same maintenance
    assert max(spread_folds) <= 100  # their own points: the folds come in smaller groups
    late = slice(len(same_totals) // 2, None)  # once the first folds are behind
    same_swing = max(same_totals[late]) - min(same_totals[late])
    spread_swing = max(spread_totals[late]) - min(spread_totals[late])
    assert spread_swing < 0.6 * same_swing  # ~0.43 here
    # the same memory on average: the fold points average 64
    assert statistics.mean(spread_totals[late]) == pytest.approx(statistics.mean(same_totals[late]), rel=0.1)


def test_a_restored_workload_keeps_its_fold_point(monkeypatch: pytest.MonkeyPatch) -> None:
    config = EngineConfig(interval_seconds=1.0)
    engine = Engine(config)
    engine.observe(pod(0.0, "train", devices=[("GPU-a", 1.0)]))
    for t in range(1, 300):
        engine.observe(sample(float(t), "GPU-a", sm=float(t % 90)))
    (uid,) = engine.workload_records
    windows = engine.workload_records[uid].windows
    assert windows._fold_after == fold_after_of(uid)
    restored = Engine.restore(json.loads(json.dumps(engine.save())), config)
    again = restored.workload_records[uid].windows
    assert again._fold_after == fold_after_of(uid)
    assert again.capacity == windows.capacity  # its next fold where it would have been


def test_an_engine_restored_between_folds_folds_and_reports_as_one_that_never_stopped() -> None:
    """Saved between two folds of each workload and restored, the engine folds in the same maintenances as
    the original and gives the same short windows; with the capacity reset at the restore it did neither."""
    config = EngineConfig(interval_seconds=5.0)
    uids = _uids(6)
    engine = Engine(config)
    for index, uid in enumerate(uids):
        engine.observe(pod(0.0, f"job-{index}", uid=uid, devices=[(f"GPU-{index}", 1.0)]))

    def feed(target: Engine, start: int, stop: int) -> None:
        for t in range(start, stop, 5):  # a segment every 5 s each, a different rate each time
            for index in range(len(uids)):
                target.observe(sample(float(t), f"GPU-{index}", sm=float((t * 7 + index * 13) % 97)))

    feed(engine, 5, 1205)
    saved = {uid: (len(engine.workload_records[uid].windows), engine.workload_records[uid].windows.capacity)
             for uid in engine.workload_records}
    assert sum(held < capacity - 10 for held, capacity in saved.values()) >= 4  # most between two folds
    restored = Engine.restore(json.loads(json.dumps(engine.save())), config)
    feed(engine, 1205, 2405)
    feed(restored, 1205, 2405)
    for uid in engine.workload_records:
        assert len(restored.workload_records[uid].windows) == len(engine.workload_records[uid].windows)
    assert [w.model_dump() for w in restored.workloads(2400.0)] == [w.model_dump() for w in engine.workloads(2400.0)]
