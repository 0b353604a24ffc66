"""DESIGN §3's attribution rule: activity is never lost to attribution. One worked example per branch.

Each test feeds samples of GPU-a at 0, 1, ..., 10 (1 s polls, threshold 1 %): ten monitored
seconds. Whatever the process list says, a GPU with one holding workload gives that workload
all of its activity; a shared GPU splits by process unless its holders' processes cannot
explain a busy device.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuwm.accounting import Engine
from gpuwm.model import GpuSample
from tests.unit.accounting.helpers import batch_of_samples, engine, figures, pod, sample


def _feed(e: Engine, sm: float, processes: list[dict[str, Any]] | None, end: int = 10, start: int = 0) -> None:
    for t in range(start, end + 1):
        fields: dict[str, Any] = {} if processes is None else {"processes": processes}
        e.observe(sample(t, sm=sm, **fields))


def test_sole_holder_with_an_empty_process_list_on_a_busy_gpu_is_busy() -> None:
    # the case seen on a real H200: the agent in its own PID namespace sees no process while the GPU computes
    e = engine()
    e.observe(pod(0, "train"))
    _feed(e, sm=80, processes=[])
    f = figures(e, "train", 10)
    assert f.active_gpu_seconds == pytest.approx(10)  # 1 unit x 10 s, not idle
    assert f.idle_gpu_seconds == 0
    assert f.utilization.lifetime == pytest.approx(80)  # the device's 80 % over a share of 1
    assert f.idle_seconds == 0
    assert f.last_active_time == 10
    assert f.unattributed_gpu_seconds == pytest.approx(10)  # the processes did not explain it: counted
    assert e.unattributed_samples == 10  # the samples at 1..10 (the one at 0 starts the history)


def test_sole_holder_with_processes_of_no_pod_takes_the_device() -> None:
    e = engine()
    e.observe(pod(0, "train"))
    _feed(e, sm=60, processes=[{"pid": 7, "sm_percent": 60}])  # a pid the agent could not map to a pod
    f = figures(e, "train", 10)
    assert f.active_gpu_seconds == pytest.approx(10)
    assert f.utilization.lifetime == pytest.approx(60)
    assert f.unattributed_gpu_seconds == pytest.approx(10)


def test_sole_holder_whose_processes_explain_the_device_is_not_unattributed() -> None:
    e = engine()
    e.observe(pod(0, "train"))
    _feed(e, sm=60, processes=[{"pid": 7, "pod_uid": "pod-train", "sm_percent": 55}])
    f = figures(e, "train", 10)
    assert f.utilization.lifetime == pytest.approx(60)  # the device's figure, not the processes' 55
    assert f.unattributed_gpu_seconds == 0


def test_sole_holder_of_a_time_sliced_share_gets_the_device_over_its_share() -> None:
    e = engine()
    e.observe(pod(0, "quarter", devices=[("GPU-a::0", 0.25)]))
    _feed(e, sm=20, processes=[])
    f = figures(e, "quarter", 10)
    assert f.utilization.lifetime == pytest.approx(80)  # 20 % / 0.25
    assert f.active_gpu_seconds == pytest.approx(2.5)  # 0.25 unit x 10 s


def test_sole_holder_share_is_capped_at_100() -> None:
    e = engine()
    e.observe(pod(0, "quarter", devices=[("GPU-a::0", 0.25)]))
    _feed(e, sm=50, processes=None)
    assert figures(e, "quarter", 10).utilization.lifetime == pytest.approx(100)  # 50 / 0.25 = 200, capped


def test_an_empty_list_on_an_idle_device_still_says_idle() -> None:
    e = engine()
    e.observe(pod(0, "train"))
    _feed(e, sm=0.5, processes=[])  # below the 1 % threshold
    f = figures(e, "train", 10)
    assert f.idle_gpu_seconds == pytest.approx(10)
    assert f.active_gpu_seconds == 0
    assert f.unattributed_gpu_seconds == 0


def test_shared_gpu_with_an_empty_list_on_a_busy_device_gives_every_holder_the_device() -> None:
    e = engine()
    e.observe(pod(0, "a", devices=[("GPU-a::0", 0.5)]))
    e.observe(pod(0, "b", devices=[("GPU-a::1", 0.5)]))
    _feed(e, sm=70, processes=[])
    for name in ("a", "b"):
        f = figures(e, name, 10)
        assert f.utilization.lifetime == pytest.approx(70)  # the device's SM %, not divided by the share
        assert f.active_gpu_seconds == pytest.approx(5)  # 0.5 unit x 10 s
        assert f.unattributed_gpu_seconds == pytest.approx(5)


def test_shared_gpu_whose_holders_processes_sum_below_the_threshold_falls_back() -> None:
    e = engine()
    e.observe(pod(0, "a", devices=[("GPU-a::0", 0.5)]))
    e.observe(pod(0, "b", devices=[("GPU-a::1", 0.5)]))
    # the device computes at 50 %; the holders' processes show 0.3 + 0.2 = 0.5 % (< 1 %); the rest is a
    # process of no pod (another namespace's, unmapped)
    processes: list[dict[str, Any]] = [
        {"pid": 1, "pod_uid": "pod-a", "sm_percent": 0.3},
        {"pid": 2, "pod_uid": "pod-b", "sm_percent": 0.2},
        {"pid": 3, "sm_percent": 49.5},
    ]
    _feed(e, sm=50, processes=processes)
    for name in ("a", "b"):
        f = figures(e, name, 10)
        assert f.utilization.lifetime == pytest.approx(50)
        assert f.active_gpu_seconds == pytest.approx(5)


def test_shared_gpu_with_processes_without_sm_figures_falls_back_to_the_device() -> None:
    e = engine()
    e.observe(pod(0, "a", devices=[("GPU-a::0", 0.5)]))
    e.observe(pod(0, "b", devices=[("GPU-a::1", 0.5)]))
    _feed(e, sm=40, processes=[{"pid": 1, "pod_uid": "pod-a"}, {"pid": 2, "pod_uid": "pod-b"}])
    for name in ("a", "b"):
        assert figures(e, name, 10).utilization.lifetime == pytest.approx(40)


def test_shared_gpu_explained_by_processes_splits_per_process() -> None:
    e = engine()
    e.observe(pod(0, "a", devices=[("GPU-a::0", 0.5)]))
    e.observe(pod(0, "b", devices=[("GPU-a::1", 0.5)]))
    _feed(e, sm=40, processes=[{"pid": 1, "pod_uid": "pod-a", "sm_percent": 40}])
    a, b = figures(e, "a", 10), figures(e, "b", 10)
    assert a.utilization.lifetime == pytest.approx(80)  # 40 % / 0.5
    assert b.utilization.lifetime == 0  # its processes: none
    assert b.idle_gpu_seconds == pytest.approx(5)
    assert a.unattributed_gpu_seconds == 0 and b.unattributed_gpu_seconds == 0


def test_shared_idle_gpu_with_an_empty_list_is_idle_for_everyone() -> None:
    e = engine()
    e.observe(pod(0, "a", devices=[("GPU-a::0", 0.5)]))
    e.observe(pod(0, "b", devices=[("GPU-a::1", 0.5)]))
    _feed(e, sm=0, processes=[])
    for name in ("a", "b"):
        f = figures(e, name, 10)
        assert f.idle_gpu_seconds == pytest.approx(5)
        assert f.active_gpu_seconds == 0


def test_the_rule_follows_who_holds_the_gpu_in_each_stretch_of_an_interval() -> None:
    # a holds GPU-a (units 0.5) from 0; b joins at 10.5, inside the interval (10, 11]. The device is busy
    # with an empty process list. (10, 10.5]: a alone -> 60 / 0.5 = 100 (capped); (10.5, 11]: shared -> 60.
    e = engine()
    e.observe(pod(0, "a", devices=[("GPU-a::0", 0.5)]))
    e.observe(pod(10.5, "b", devices=[("GPU-a::1", 0.5)]))
    _feed(e, sm=60, processes=[], end=11)
    a, b = figures(e, "a", 11), figures(e, "b", 11)
    assert a.active_gpu_seconds == pytest.approx(5.5)
    assert b.active_gpu_seconds == pytest.approx(0.25)
    # a's lifetime: 10.5 s at 100 % and 0.5 s at 60 %, each of 0.5 unit
    assert a.utilization.lifetime == pytest.approx((10.5 * 100 + 0.5 * 60) / 11)
    assert b.utilization.lifetime == pytest.approx(60)


def test_a_holder_arriving_late_changes_the_others_figures_the_same_as_in_order() -> None:
    # b's pod event arrives after the samples that cover its time: a is re-accounted as shared
    in_order, late = engine(), engine()
    for e in (in_order, late):
        e.observe(pod(0, "a", devices=[("GPU-a::0", 0.5)]))
    in_order.observe(pod(4, "b", devices=[("GPU-a::1", 0.5)]))
    processes = [{"pid": 1, "pod_uid": "pod-b", "sm_percent": 30}]
    _feed(in_order, sm=30, processes=processes)
    _feed(late, sm=30, processes=processes)
    late.observe(pod(4, "b", devices=[("GPU-a::1", 0.5)]))
    for name in ("a", "b"):
        expected, got = figures(in_order, name, 10), figures(late, name, 10)
        assert got.active_gpu_seconds == pytest.approx(expected.active_gpu_seconds)
        assert got.idle_gpu_seconds == pytest.approx(expected.idle_gpu_seconds)
        assert got.utilization.lifetime == pytest.approx(expected.utilization.lifetime)
    a = figures(late, "a", 10)
    # (0, 4]: a alone, 30 / 0.5 = 60 % active; (4, 10]: shared and explained by b's process -> a idle
    assert a.active_gpu_seconds == pytest.approx(2.0)
    assert a.idle_gpu_seconds == pytest.approx(3.0)


def test_batch_and_single_samples_give_the_same_figures_under_the_rule() -> None:
    one, batched = engine(), engine()
    for e in (one, batched):
        e.observe(pod(0, "solo"))
        e.observe(pod(0, "a", devices=[("GPU-b::0", 0.5)]))
        e.observe(pod(0, "b", devices=[("GPU-b::1", 0.5)]))
    rows: list[GpuSample] = []
    for t in range(0, 200):
        rows.append(sample(t, "GPU-a", sm=90 if t % 7 else 0, processes=[]))
        rows.append(sample(t, "GPU-b", sm=35, processes=[{"pid": 1, "pod_uid": "pod-a", "sm_percent": 0.4}]))
    for row in rows:
        one.observe(row)
    batched.observe_samples(batch_of_samples(rows))
    assert [f.model_dump() for f in one.workloads(199)] == [f.model_dump() for f in batched.workloads(199)]
    solo = figures(one, "solo", 199)
    assert solo.active_gpu_seconds > 150
    assert figures(one, "a", 199).utilization.lifetime == pytest.approx(35)  # 0.4 % explains nothing: fallback
    assert one.unattributed_samples == batched.unattributed_samples > 0
