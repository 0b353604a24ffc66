"""Worked examples, one or more per DESIGN §3 definition, each with its arithmetic."""

from __future__ import annotations

import pytest

from gpuwm.model import GpuSample, PodEvent
from tests.unit.accounting.helpers import engine, figures, namespace, pod, sample, samples


def test_whole_gpu_splits_into_active_idle_and_unmonitored() -> None:
    e = engine()
    e.observe(pod(0, "train"))
    # busy (0, 10], idle (10, 20], a 10 s gap (20, 30] (> 3 x 1 s), idle (30, 40]
    for s in [*samples(0, 10, sm=50), *samples(11, 20, sm=0), *samples(30, 40, sm=0)]:
        e.observe(s)
    f = figures(e, "train", 40)
    assert f.active_gpu_seconds == pytest.approx(10)  # 1 unit x 10 s
    assert f.idle_gpu_seconds == pytest.approx(20)  # (10, 20] + (30, 40]
    assert f.unmonitored_gpu_seconds == pytest.approx(10)  # the gap
    assert f.allocated_gpu_seconds == pytest.approx(40)  # 10 + 20 + 10
    assert f.allocated_gpus == 1


def test_gap_of_exactly_three_intervals_is_monitored() -> None:
    e = engine(interval_seconds=1.0)
    e.observe(pod(0, "train"))
    for s in [sample(0, sm=50), sample(3, sm=50), sample(7, sm=50)]:
        e.observe(s)
    f = figures(e, "train", 7)
    assert f.active_gpu_seconds == pytest.approx(3)  # (0, 3]: 3 s <= 3 x 1 s
    assert f.unmonitored_gpu_seconds == pytest.approx(4)  # (3, 7]: 4 s > 3 s


def test_time_before_first_sample_and_after_latest_is_unmonitored() -> None:
    e = engine()
    e.observe(pod(0, "train"))
    for s in samples(5, 10, sm=50):
        e.observe(s)
    f = figures(e, "train", 12)
    # (0, 5] before the GPU's first sample, (10, 12] after its latest: 7 s unmonitored
    assert f.unmonitored_gpu_seconds == pytest.approx(7)
    assert f.active_gpu_seconds == pytest.approx(5)
    assert f.allocated_gpu_seconds == pytest.approx(12)
    # once a sample covers (10, 12] it is no longer unmonitored
    e.observe(sample(11, sm=50))
    e.observe(sample(12, sm=50))
    f = figures(e, "train", 12)
    assert f.unmonitored_gpu_seconds == pytest.approx(5)
    assert f.active_gpu_seconds == pytest.approx(7)


def test_time_sliced_share_uses_per_process_utilisation_over_the_share() -> None:
    e = engine()
    e.observe(pod(0, "half", devices=[("GPU-a", 0.5)]))
    for t in range(0, 11):
        e.observe(sample(t, sm=40, processes=[{"pid": 1, "pod_uid": "pod-half", "sm_percent": 40}]))
    f = figures(e, "half", 10)
    # 40 % of the device / 0.5 share = 80 %
    assert f.utilization.lifetime == pytest.approx(80)
    assert f.utilization.current == pytest.approx(80)
    assert f.allocated_gpu_seconds == pytest.approx(5)  # 0.5 unit x 10 s
    assert f.active_gpu_seconds == pytest.approx(5)


def test_per_process_utilisation_is_capped_at_100() -> None:
    e = engine()
    e.observe(pod(0, "half", devices=[("GPU-a", 0.25)]))
    for t in range(0, 3):
        e.observe(sample(t, sm=90, processes=[{"pid": 1, "pod_uid": "pod-half", "sm_percent": 90}]))
    # 90 / 0.25 = 360, capped at 100
    assert figures(e, "half", 2).utilization.lifetime == pytest.approx(100)


def test_another_pods_processes_do_not_make_a_workload_active() -> None:
    e = engine()
    e.observe(pod(0, "a", devices=[("GPU-a", 0.5)]))
    e.observe(pod(0, "b", devices=[("GPU-a", 0.5)]))
    for t in range(0, 11):
        e.observe(sample(t, sm=30, processes=[{"pid": 1, "pod_uid": "pod-a", "sm_percent": 30}]))
    a, b = figures(e, "a", 10), figures(e, "b", 10)
    assert a.utilization.lifetime == pytest.approx(60)  # 30 / 0.5
    assert a.active_gpu_seconds == pytest.approx(5)
    assert b.utilization.lifetime == pytest.approx(0)
    assert b.idle_gpu_seconds == pytest.approx(5)
    assert b.idle_gpus == pytest.approx(0.5)


def test_a_sole_holder_without_per_process_data_takes_the_device_sm_over_its_share() -> None:
    e = engine()
    e.observe(pod(0, "half", devices=[("GPU-a", 0.5)]))
    for s in samples(0, 10, sm=40):
        e.observe(s)
    # it holds GPU-a alone: all of the device's 40 % is its own, over its 0.5 share = 80 % (the attribution rule)
    assert figures(e, "half", 10).utilization.lifetime == pytest.approx(80)


def test_shares_on_one_physical_gpu_add_up() -> None:
    e = engine(interval_seconds=60.0)
    for index in range(4):
        e.observe(pod(0, f"p{index}", devices=[("GPU-a::" + str(index), 0.25)]))
    for t in range(0, 3601, 60):
        e.observe(sample(t, sm=10))
    total = sum(f.allocated_gpu_seconds for f in e.workloads(3600))
    assert total == pytest.approx(3600)  # 4 x 0.25 x 3600 s = one GPU-hour
    assert e.cluster(3600).allocated_gpus == pytest.approx(1.0)


def test_mig_slice_units_and_energy_split_of_the_parent_counter() -> None:
    e = engine()
    e.observe(pod(0, "small", devices=[("MIG-1", 1 / 7)]))
    # the instance's samples carry the parent's energy counter: 700 J/s for the whole GPU
    for t in range(0, 11):
        e.observe(
            sample(t, "MIG-1", sm=70, parent_uuid="GPU-p", device_units=1 / 7, energy_joules=700.0 * t, mig_profile="1g.10gb")
        )
    f = figures(e, "small", 10)
    assert f.allocated_gpu_seconds == pytest.approx(10 / 7)  # 1/7 unit x 10 s
    assert f.energy_joules == pytest.approx(1000)  # 700 J/s x 10 s x 1/7
    assert f.utilization.lifetime == pytest.approx(70)  # device SM of the instance
    assert f.gpus[0].mig_profile == "1g.10gb"


def test_energy_is_split_by_units_and_unallocated_share_goes_to_nobody() -> None:
    e = engine()
    e.observe(pod(0, "a", devices=[("GPU-a", 0.25)]))
    for t in range(0, 11):
        e.observe(sample(t, sm=0, energy_joules=100.0 * t))
    # 100 J/s x 10 s = 1000 J; a quarter is 250 J; the other 750 J belong to nobody
    assert figures(e, "a", 10).energy_joules == pytest.approx(250)
    assert e.cluster(10).energy_joules == pytest.approx(250)


def test_energy_across_a_gap_is_counted() -> None:
    e = engine()
    e.observe(pod(0, "a"))
    for t in (0, 1, 2, 30, 31):
        e.observe(sample(t, sm=0, energy_joules=10.0 * t))
    f = figures(e, "a", 31)
    assert f.energy_joules == pytest.approx(310)  # the counter's whole delta 0 -> 310 J
    assert f.unmonitored_gpu_seconds == pytest.approx(28)  # (2, 30]


def test_energy_counter_reset_does_not_go_negative() -> None:
    e = engine()
    e.observe(pod(0, "a"))
    for t, joules in ((0, 1000.0), (1, 1100.0), (2, 5.0), (3, 105.0)):
        e.observe(sample(t, sm=0, energy_joules=joules))
    # 100 J in (0, 1], the reset in (1, 2] counts 0, 100 J in (2, 3]
    assert figures(e, "a", 3).energy_joules == pytest.approx(200)


def test_allocation_is_cut_at_start_and_end_within_a_sample_interval() -> None:
    e = engine(interval_seconds=10.0)
    e.observe(pod(5, "a"))
    e.observe(pod(25, "a", phase="Succeeded"))
    for t in (0, 10, 20, 30):
        e.observe(sample(t, sm=50))
    f = figures(e, "a", 30)
    # (5, 10] + (10, 20] + (20, 25] = 20 s, all in monitored active intervals
    assert f.allocated_gpu_seconds == pytest.approx(20)
    assert f.active_gpu_seconds == pytest.approx(20)
    assert f.last_active_time == pytest.approx(25)  # the active interval (20, 30] is cut at the end


def test_idle_seconds_zero_while_active_grows_while_idle_and_freezes_at_end() -> None:
    e = engine()
    e.observe(pod(0, "a"))
    for s in samples(0, 10, sm=50):
        e.observe(s)
    assert figures(e, "a", 10).idle_seconds == 0
    for s in samples(11, 20, sm=0):
        e.observe(s)
    f = figures(e, "a", 20)
    assert f.last_active_time == 10
    assert f.idle_seconds == pytest.approx(10)  # 20 - max(10, 0)
    assert figures(e, "a", 25).idle_seconds == pytest.approx(15)  # grows one-for-one, sampled or not
    e.observe(pod(22, "a", phase="Succeeded"))
    f = figures(e, "a", 100)
    assert f.idle_seconds == pytest.approx(12)  # frozen at the end: 22 - 10
    assert f.phase == "Succeeded"
    assert f.end_time == 22
    assert f.allocated_gpus == 0


def test_idle_seconds_counts_from_allocation_start_when_never_active() -> None:
    e = engine()
    e.observe(pod(0, "a", phase="Pending"))
    e.observe(pod(5, "a"))
    for s in samples(0, 20, sm=0):
        e.observe(s)
    f = figures(e, "a", 20)
    assert f.last_active_time is None
    assert f.idle_seconds == pytest.approx(15)  # 20 - 5
    assert f.wait_seconds == pytest.approx(5)


def test_idle_seconds_keeps_growing_through_a_gap() -> None:
    e = engine()
    e.observe(pod(0, "a"))
    for s in samples(0, 10, sm=50):
        e.observe(s)
    # no samples after 10: the latest was active, but 20 s later it is no longer "now active"
    f = figures(e, "a", 30)
    assert f.idle_seconds == pytest.approx(20)
    assert f.sampling is False
    assert f.unmonitored_gpu_seconds == pytest.approx(20)


def test_utilisation_windows_and_null_where_nothing_monitored() -> None:
    e = engine()
    e.observe(pod(0, "a"))
    # 90 % for (0, 300], 10 % for (300, 360]
    for t in range(0, 361):
        e.observe(sample(t, sm=90 if t <= 300 else 10))
    f = figures(e, "a", 360)
    assert f.utilization.avg1m == pytest.approx(10)
    assert f.utilization.avg5m == pytest.approx((240 * 90 + 60 * 10) / 300)  # window (60, 360]
    assert f.utilization.avg1h == pytest.approx((300 * 90 + 60 * 10) / 360)
    assert f.utilization.lifetime == pytest.approx((300 * 90 + 60 * 10) / 360)
    assert f.memory_utilization.lifetime == pytest.approx(10)  # 10 of 100 bytes
    # a minute later with no samples: the last minute was not monitored at all
    later = figures(e, "a", 425)
    assert later.utilization.avg1m is None
    assert later.utilization.avg5m == pytest.approx((175 * 90 + 60 * 10) / 235)  # (125, 360] monitored


def test_utilisation_is_allocation_weighted_across_gpus() -> None:
    e = engine()
    e.observe(pod(0, "a", devices=[("GPU-a", 1.0), ("GPU-b", 0.5)]))
    for t in range(0, 11):
        e.observe(sample(t, "GPU-a", sm=30))
        e.observe(sample(t, "GPU-b", sm=45))
    # a holds half of GPU-b alone: 45 % / 0.5 = 90 %; (1 x 30 + 0.5 x 90) / 1.5 = 50
    f = figures(e, "a", 10)
    assert f.utilization.lifetime == pytest.approx(50)
    assert f.allocated_gpus == pytest.approx(1.5)


def test_wait_and_run_seconds_with_a_restarted_pod_and_a_move() -> None:
    e = engine()
    e.observe(pod(0, "job-0", workload="job", created=-10, phase="Pending"))
    e.observe(pod(10, "job-0", workload="job"))
    e.observe(pod(30, "job-0", workload="job", phase="Failed"))
    # the Job retries on another node with another GPU after 10 s
    e.observe(pod(40, "job-1", workload="job", node="n2", devices=[("GPU-b", 1.0)]))
    for t in range(0, 61):
        e.observe(sample(t, "GPU-a", sm=50))
        e.observe(sample(t, "GPU-b", sm=50))
    f = figures(e, "job", 60)
    assert f.wait_seconds == pytest.approx(20)  # created -10, first running 10
    assert f.run_seconds == pytest.approx(40)  # (10, 30] + (40, 60]
    assert f.allocated_gpu_seconds == pytest.approx(40)
    assert f.nodes == ["n2"]
    assert f.start_time == 10
    assert f.phase == "Running"


def test_wait_seconds_grows_while_pending() -> None:
    e = engine()
    e.observe(pod(0, "a", phase="Pending", created=-3))
    assert figures(e, "a", 7).wait_seconds == pytest.approx(10)
    assert figures(e, "a", 7).phase == "Pending"


def test_project_from_pod_label_then_namespace_label_then_namespace() -> None:
    e = engine()
    e.observe(namespace(0, "ml", {"gpuwm.io/project": "vision"}))
    e.observe(namespace(0, "other"))
    e.observe(pod(0, "labelled", labels={"gpuwm.io/project": "sandbox"}))
    e.observe(pod(0, "plain", devices=[("GPU-b", 1.0)]))
    e.observe(pod(0, "bare", namespace="other", devices=[("GPU-c", 1.0)]))
    assert figures(e, "labelled", 0).project == "sandbox"
    assert figures(e, "plain", 0).project == "vision"
    assert figures(e, "bare", 0).project == "other"


def test_project_sums_idle_gpus_and_quota() -> None:
    e = engine()
    e.observe(namespace(0, "ml", {"gpuwm.io/project": "vision"}, **{"gpuwm.io/gpu-quota": "4"}))
    e.observe(pod(0, "busy", devices=[("GPU-a", 1.0)]))
    e.observe(pod(0, "lazy", devices=[("GPU-b", 1.0)]))
    for t in range(0, 11):
        e.observe(sample(t, "GPU-a", sm=80))
        e.observe(sample(t, "GPU-b", sm=0))
    (project,) = e.projects(10)
    assert project.name == "vision"
    assert project.workloads == 2
    assert project.allocated_gpus == 2
    assert project.idle_gpus == 1  # GPU-b's latest sample was inactive
    assert project.quota == 4
    assert project.allocated_gpu_seconds == pytest.approx(20)
    assert project.utilization.lifetime == pytest.approx(40)  # (80 x 10 + 0 x 10) / 20


def test_idle_threshold_is_configurable() -> None:
    e = engine(idle_threshold_percent=20.0)
    e.observe(pod(0, "a"))
    for s in samples(0, 10, sm=15):
        e.observe(s)
    f = figures(e, "a", 10)
    assert f.idle_gpu_seconds == pytest.approx(10)  # 15 % < 20 %
    assert f.active_gpu_seconds == 0


def test_lost_gpu_sample_is_unmonitored_not_idle() -> None:
    e = engine()
    e.observe(pod(0, "a"))
    for s in samples(0, 5, sm=50):
        e.observe(s)
    for t in range(6, 11):
        e.observe(sample(t, sm=None, healthy=False, error="GPU is lost"))
    f = figures(e, "a", 10)
    assert f.unmonitored_gpu_seconds == pytest.approx(5)
    assert f.idle_gpu_seconds == 0
    assert f.gpus[0].healthy is False


def test_mig_instances_without_energy_share_the_parents_counter_by_units() -> None:
    e = engine()
    e.observe(pod(0, "small", devices=[("MIG-1", 1 / 7)]))
    e.observe(pod(0, "big", devices=[("MIG-2", 3 / 7)]))
    for t in range(0, 11):
        # the parent GPU's own sample carries the counter (700 J/s); the instances carry none
        e.observe(sample(t, "GPU-p", sm=None, energy_joules=700.0 * t))
        e.observe(sample(t, "MIG-1", sm=50, parent_uuid="GPU-p", device_units=1 / 7))
        e.observe(sample(t, "MIG-2", sm=50, parent_uuid="GPU-p", device_units=3 / 7))
    # 7,000 J in (0, 10]: 1/7 -> 1,000 J, 3/7 -> 3,000 J, the free 3/7 to nobody
    assert figures(e, "small", 10).energy_joules == pytest.approx(1000)
    assert figures(e, "big", 10).energy_joules == pytest.approx(3000)
    assert e.cluster(10).total_gpu_units == pytest.approx(4 / 7)  # the parent is not capacity of its own


def test_mig_parent_energy_is_order_independent() -> None:
    events: list[PodEvent | GpuSample] = [pod(0, "small", devices=[("MIG-1", 1 / 7)])]
    for t in range(0, 11):
        events.append(sample(t, "GPU-p", sm=None, energy_joules=700.0 * t))
        events.append(sample(t, "MIG-1", sm=50, parent_uuid="GPU-p", device_units=1 / 7))
    forward, backward = engine(), engine()
    for event in events:
        forward.observe(event)
    for event in reversed(events):
        backward.observe(event)
    assert figures(backward, "small", 10).energy_joules == pytest.approx(figures(forward, "small", 10).energy_joules)
    assert figures(forward, "small", 10).energy_joules == pytest.approx(1000)


def test_gpus_report_each_device_once_per_holder_and_unallocated_ones() -> None:
    e = engine()
    e.observe(pod(0, "a", devices=[("GPU-a::0", 0.5)]))
    e.observe(pod(0, "b", devices=[("GPU-a::1", 0.5)]))
    for t in range(0, 3):
        e.observe(sample(t, "GPU-a", sm=30, processes=[{"pid": 1, "pod_uid": "pod-a", "sm_percent": 30}], index=0))
        e.observe(sample(t, "GPU-b", sm=0, index=1, model="H100"))
    rows = e.gpus(2)
    assert [(row.uuid, row.pod) for row in rows] == [("GPU-a", "a"), ("GPU-a", "b"), ("GPU-b", None)]
    assert rows[0].utilization_percent == pytest.approx(60)  # 30 % of the device / 0.5
    assert rows[1].utilization_percent == pytest.approx(0) and rows[1].active is False
    assert rows[2].model == "H100" and rows[2].units == 0 and rows[2].monitored is True
    assert e.cluster(2).gpus == 2 and e.cluster(2).allocated_gpus == pytest.approx(1.0)
