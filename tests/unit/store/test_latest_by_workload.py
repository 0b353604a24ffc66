"""`Store.latest_by_workload`: the embedded store's one read of every workload's own series answers what the
plain version (a range query per workload) answers, windows that reach into the coarser tier included."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwm.model import PodStatsSample
from gpuwm.store.base import Store
from gpuwm.store.embedded import EmbeddedStore
from tests.unit.store.store_data import cluster, project, sample, workload

TIMES = [float(t) for t in range(0, 600, 15)]
METRICS = ("cpu_usage_cores", "memory_used_bytes", "gpu_utilization_percent")


def stats(t: float, name: str, cpu: float) -> PodStatsSample:
    return PodStatsSample(t=t, node="node-a", namespace="team-a", pod=f"{name}-0", pod_uid=f"pod-uid-{name}",
                          cpu_usage_cores=cpu, memory_used_bytes=1e9 + cpu)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EmbeddedStore]:
    """`a` and `b` with host figures (b's stop at 300), `c` with GPU figures only; 15 s kept 2 minutes."""
    opened = EmbeddedStore(tmp_path / "latest.db", tiers=["15s:2m", "1m:1d"])
    for t in TIMES:
        jobs = [workload(name, [(f"gpu-{index}", 1.0, 50.0)]) for index, name in enumerate("abc")]
        pod_stats = [stats(t, "a", 1.0 + t / 100)] + ([stats(t, "b", 3.0)] if t < 300 else [])
        samples = [sample(t, f"gpu-{index}", sm=10.0 * (index + 1)) for index in range(3)]
        opened.record(t, samples, jobs, [project("alpha", jobs)], cluster(3), pod_stats)
    opened.compact(everything=True)
    yield opened
    opened.close()


@pytest.mark.parametrize(("start", "end"), [(TIMES[-1] - 60, TIMES[-1]), (200.0, 400.0), (0.0, TIMES[-1])])
def test_one_read_answers_what_a_query_per_workload_answers(store: EmbeddedStore, start: float, end: float) -> None:
    uids = ["uid-a", "uid-b", "uid-c", "uid-unknown"]
    plain = Store.latest_by_workload(store, uids, METRICS, start, end, 15.0)
    assert store.latest_by_workload(uids, METRICS, start, end, 15.0) == plain
    assert "uid-unknown" not in plain
    assert plain["uid-c"].keys() == {"gpu_utilization_percent"}  # no host figures of c: only its GPU's


def test_the_latest_values(store: EmbeddedStore) -> None:
    latest = store.latest_by_workload(["uid-a", "uid-b", "uid-c"], METRICS, TIMES[-1] - 60, TIMES[-1], 15.0)
    assert latest["uid-a"]["cpu_usage_cores"] == pytest.approx(1.0 + TIMES[-1] / 100, abs=1e-3)
    assert latest["uid-c"]["gpu_utilization_percent"] == pytest.approx(50.0)  # the figures' utilisation
    assert latest["uid-b"].keys() == {"gpu_utilization_percent"}  # its host figures stopped at 300
    assert store.latest_by_workload(["uid-a"], METRICS, 200.0, 400.0, 15.0).keys() == {"uid-a"}
    assert store.latest_by_workload([], METRICS, 0.0, TIMES[-1], 15.0) == {}
    assert store.latest_by_workload(["uid-b"], ("cpu_usage_cores",), 200.0, 400.0, 60.0) == {
        "uid-b": {"cpu_usage_cores": pytest.approx(3.0)}
    }
