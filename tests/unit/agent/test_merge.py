"""Merged polls (gpuwm.feed.merge): which runs merge, what a merged sample says, and that the engine counts the same.

The property that makes merging safe: an engine fed each pull's polls merged reports the
same allocated, active, idle and unmonitored GPU-seconds, energy, lastActiveTime,
idleSeconds, idle GPUs, current and lifetime utilisation as one fed every poll, on random
traces with device-level and per-process data, holders with shares, allocations that start
and end inside runs, gaps, lost GPUs and energy counter resets.
"""

from __future__ import annotations

import random
from typing import Any
from urllib.parse import parse_qs

import pytest

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.feed import MergeRequest, merge_polls, merge_request, sample_columns
from gpuwm.feed.decode import parse_columns
from gpuwm.model import GpuSample, PodEvent
from tests.unit.accounting.helpers import pod

REQUEST = MergeRequest(span_seconds=15.0, threshold_percent=1.0, gap_seconds=3.0)
UNITS = {"whole": 1.0, "left": 0.5, "right": 0.5}  # what each workload of `_trace` holds


def poll(t: float, sm: float | None = 50.0, uuid: str = "GPU-a", seq: int | None = None, **fields: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"t": t, "node": "n1", "uuid": uuid, "seq": seq if seq is not None else int(t),
                              "sm_percent": sm, "memory_used_bytes": 10.0, "memory_total_bytes": 100.0,
                              "energy_joules": 100.0 * t, "healthy": True}
    values.update(fields)
    return values


def test_a_busy_pull_is_its_first_poll_one_merged_sample_and_its_last_poll() -> None:
    polls = [poll(float(t), sm=float(60 + t)) for t in range(1, 16)]
    merged = merge_polls(polls, REQUEST)
    assert [sample["t"] for sample in merged] == [1.0, 14.0, 15.0]
    assert merged[0] == polls[0] and merged[2] == polls[-1]  # single polls pass unchanged
    run = merged[1]
    assert run["merged_seconds"] == 12.0  # polls 2..14: 14 - 2
    assert run["seq"] == 14 and run["energy_joules"] == 1400.0  # the last poll's counter
    assert run["sm_percent"] == pytest.approx(sum(60 + t for t in range(2, 15)) / 13)
    GpuSample.model_validate(run)  # what the controller reads


def test_means_are_weighted_by_each_polls_interval() -> None:
    polls = [poll(0.0), poll(1.0, sm=60.0), poll(3.0, sm=70.0), poll(4.0, sm=100.0), poll(5.0)]
    merged = merge_polls(polls, REQUEST)
    assert merged[1]["sm_percent"] == pytest.approx((60.0 * 1 + 70.0 * 2 + 100.0 * 1) / 4)


@pytest.mark.parametrize(("breaker", "why"), [
    ({"sm_percent": 0.5}, "between 0 and the threshold"),
    ({"sm_percent": 0.0}, "idle among busy polls"),
    # 50 % is the cap for a holder of 1/2 (50 x 2 = 100), 30 % not: a holder of 1/3 would read 90 % and 100 %
    ({"sm_percent": 30.0}, "over the cap for one share where the others are not"),
    ({"healthy": False, "error": "GPU is lost", "sm_percent": None}, "a lost GPU"),
    ({"energy_joules": 1.0}, "the energy counter went back"),
    ({"memory_total_bytes": 200.0}, "a device field changed"),
    ({"processes": []}, "per-process data among device-level polls"),
])
def test_a_poll_that_could_count_differently_breaks_the_run(breaker: dict[str, Any], why: str) -> None:
    polls = [poll(float(t)) for t in range(1, 12)]
    polls[5] = {**polls[5], **breaker}
    merged = merge_polls(polls, REQUEST)
    assert polls[5] in merged, why
    assert [sample["t"] for sample in merged] == [1.0, 5.0, 6.0, 10.0, 11.0], why


def test_gaps_span_and_idle_runs() -> None:
    polls = [poll(float(t), sm=0.0) for t in (1, 2, 3, 4, 9, 10, 11, 12)]  # idle throughout, a 5 s gap at 9
    merged = merge_polls(polls, REQUEST)
    assert [(sample["t"], sample.get("merged_seconds")) for sample in merged] == [
        (1.0, None), (4.0, 2.0), (9.0, None), (11.0, 1.0), (12.0, None)]  # 9, after the gap, alone
    long = [poll(float(t)) for t in range(0, 40)]
    spans = [sample.get("merged_seconds") or 0.0 for sample in merge_polls(long, REQUEST)]
    assert max(spans) <= REQUEST.span_seconds and len(spans) == 5


def test_per_process_runs_merge_per_pod_and_keep_each_pods_mean() -> None:
    def busy(t: float, a: float, b: float) -> dict[str, Any]:
        return poll(t, processes=[{"pid": 1, "pod_uid": "pod-a", "sm_percent": a},
                                  {"pid": 2, "pod_uid": "pod-b", "sm_percent": b}])
    polls = [busy(1.0, 30.0, 0.0), busy(2.0, 55.0, 0.0), busy(3.0, 80.0, 0.0), busy(4.0, 65.0, 0.0), busy(5.0, 5.0, 0.0)]
    merged = merge_polls(polls, REQUEST)
    assert len(merged) == 3
    processes = {process["pod_uid"]: process["sm_percent"] for process in merged[1]["processes"]}
    assert processes == {"pod-a": pytest.approx((55.0 + 80.0 + 65.0) / 3), "pod-b": 0.0}  # polls 2-4
    polls[2] = busy(3.0, 40.0, 0.0)  # 40 % over a half share is 80 %, 55 % is 110 % capped: the mean would differ
    assert len(merge_polls(polls, REQUEST)) == 5
    polls[2] = busy(3.0, 40.0, 5.0)  # pod-b busy in one poll: its verdict changes, the run breaks
    assert len(merge_polls(polls, REQUEST)) == 5
    polls[2] = busy(3.0, 40.0, 0.4)  # pod-b at 0.4 %: over a small share it may be active
    assert len(merge_polls(polls, REQUEST)) == 5


def test_other_devices_and_seq_order_are_kept() -> None:
    polls = [poll(float(t), uuid=uuid, seq=2 * t + offset) for t in range(1, 8) for offset, uuid in enumerate(["A", "B"])]
    merged = merge_polls(polls, REQUEST)
    assert [(sample["uuid"], sample["t"]) for sample in merged] == [
        ("A", 1.0), ("B", 1.0), ("A", 6.0), ("B", 6.0), ("A", 7.0), ("B", 7.0)]
    assert [sample["seq"] for sample in merged] == sorted(sample["seq"] for sample in merged)
    shuffled = [polls[3], polls[1], *polls[4:], polls[0], polls[2]]  # a device's times not rising: left alone
    assert merge_polls(shuffled, REQUEST) == shuffled


def test_merge_request_from_a_query() -> None:
    assert merge_request({}) is None
    assert merge_request({"merge_seconds": ["0"]}) is None
    assert merge_request({"merge_seconds": ["15"], "merge_threshold_percent": ["5"], "merge_gap_seconds": ["6"]}) == (
        MergeRequest(15.0, 5.0, 6.0))
    assert merge_request({"merge_seconds": [REQUEST.query().split("=")[1].split("&")[0]]}) == MergeRequest(15.0)
    for name, value in (("merge_seconds", "soon"), ("merge_threshold_percent", "150"), ("merge_gap_seconds", "-1"),
                        ("merge_seconds", "inf"), ("merge_seconds", "nan"), ("merge_exact_replicas", "0"),
                        ("merge_exact_replicas", "17"), ("merge_exact_replicas", "1.5"), ("merge_exact_replicas", "x")):
        with pytest.raises(ValueError, match=name):
            merge_request({"merge_seconds": ["15"], name: [value]})


def test_a_request_for_whole_devices_round_trips_and_the_default_asks_nothing_new() -> None:
    whole = MergeRequest(15.0, 5.0, 6.0, exact_replicas=1)
    assert "merge_exact_replicas" not in MergeRequest(15.0, 5.0, 6.0).query()  # older agents see the same query
    parsed = merge_request(parse_qs(whole.query().lstrip("&")))
    assert parsed == whole


def test_whole_devices_merge_across_the_cap_sides_only_a_share_tells_apart() -> None:
    # 45 % and 60 %: both busy, but a quarter of the device would read 100 (capped) and 100 (capped), half of it
    # 90 and 100: the default request keeps them apart, a node of whole devices merges them
    polls = [poll(float(t), 45.0 if t % 2 else 60.0, seq=t) for t in range(1, 11)]
    assert len(merge_polls(polls, REQUEST)) == len(polls)
    assert len(merge_polls(polls, MergeRequest(15.0, exact_replicas=1))) == 3


# --------------------------------------------------------------------------- the engine counts the same

def _trace(seed: int) -> tuple[list[PodEvent], list[dict[str, Any]]]:
    """Pod events and 1 Hz polls (seq order) of a whole GPU (device-level data) and a shared one (per process)."""
    rng = random.Random(seed)
    events = [
        pod(rng.uniform(0, 30), "whole", devices=[("GPU-w", 1.0)], created=0.0),
        pod(rng.uniform(0, 30), "left", devices=[("GPU-s", 0.5)], created=0.0),
        pod(rng.uniform(20, 90), "right", devices=[("GPU-s", 0.5)], created=0.0),
    ]
    events.append(pod(rng.uniform(100, 200), "whole", "Succeeded", devices=[("GPU-w", 1.0)], created=0.0))
    events.append(pod(rng.uniform(120, 220), "left", "Deleted", devices=[("GPU-s", 0.5)], created=0.0))
    polls: list[dict[str, Any]] = []
    energy = {"GPU-w": 0.0, "GPU-s": 0.0}
    regime = {"GPU-w": 50.0, "left": 30.0, "right": 0.0}
    t, seq = 0.0, 0
    while t < 240.0:
        t += rng.choice([1.0, 1.0, 1.0, 0.999, 1.002, 4.5]) if rng.random() < 0.97 else 7.0
        for uuid in ("GPU-w", "GPU-s"):
            for key in (("GPU-w",) if uuid == "GPU-w" else ("left", "right")):
                if rng.random() < 0.1:  # a new regime: busy, idle, or just under the threshold
                    regime[key] = rng.choice([0.0, 0.0, 0.6, 25.0, 45.0])
            seq += 1
            energy[uuid] = 0.0 if rng.random() < 0.01 else energy[uuid] + rng.uniform(50, 300)
            values = poll(t, uuid=uuid, seq=seq, energy_joules=energy[uuid],
                          memory_used_bytes=rng.uniform(0, 100))
            if uuid == "GPU-w":
                values["sm_percent"] = regime["GPU-w"] and max(1.0, regime["GPU-w"] + rng.uniform(-5, 5))
            else:
                left, right = (regime[key] and max(1.0, regime[key] + rng.uniform(-4, 4)) for key in ("left", "right"))
                if regime["left"] == 0.6:
                    left = 0.6
                values["sm_percent"] = min(100.0, left + right)
                values["processes"] = [{"pid": 11, "pod_uid": "pod-left", "sm_percent": left},
                                       {"pid": 12, "pod_uid": "pod-right", "sm_percent": right}]
            if rng.random() < 0.02:
                values.update(healthy=False, error="GPU is lost", sm_percent=None)
            polls.append(values)
    return events, polls


def _pulls(polls: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The polls cut into pulls of ~15 s, as a controller's status interval cuts them."""
    pulls: list[list[dict[str, Any]]] = []
    for values in polls:
        if not pulls or values["t"] >= pulls[-1][0]["t"] + 15.0:
            pulls.append([])
        pulls[-1].append(values)
    return pulls


def _aligned(events: list[PodEvent], polls: list[dict[str, Any]]) -> list[PodEvent]:
    """The events moved to the first poll of a pull (never inside a run: each pull's first poll is single)."""
    starts = [pulled[0]["t"] for pulled in _pulls(polls)]
    return [event.model_copy(update={"t": min((t for t in starts if t >= event.t), default=starts[-1])})
            for event in events]


def _feed(events: list[PodEvent], polls: list[dict[str, Any]], merge: bool, columns: bool = False,
          request: MergeRequest = REQUEST) -> Engine:
    """Each pull's polls (merged or not, as `request` asks), with the pod events that fall before its end first."""
    engine = Engine(EngineConfig(interval_seconds=1.0, idle_threshold_percent=1.0))
    pending = sorted(events, key=lambda event: event.t)
    for pulled in _pulls(polls):
        while pending and pending[0].t <= pulled[-1]["t"]:
            engine.observe(pending.pop(0))
        given = merge_polls(pulled, request) if merge else pulled
        if columns:
            engine.observe_samples(parse_columns(sample_columns(given)).batch(_identity(len(given))))
        else:
            for item in given:
                engine.observe_sample(GpuSample.model_validate(item))
    for event in pending:
        engine.observe(event)
    return engine


def _identity(count: int) -> Any:
    import numpy

    return numpy.arange(count, dtype=numpy.int64)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_an_engine_fed_merged_polls_counts_what_one_fed_every_poll_counts(seed: int, aligned: bool) -> None:
    events, polls = _trace(seed)
    if aligned:
        events = _aligned(events, polls)
    every, merged = _feed(events, polls, merge=False), _feed(events, polls, merge=True)
    assert len(merge_polls(polls, REQUEST)) < 0.75 * len(polls)  # the trace does merge
    now = polls[-1]["t"]
    expected = {figures.name: figures for figures in every.workloads(now)}
    for figures in merged.workloads(now):
        want = expected[figures.name]
        for name in ("allocated_gpu_seconds", "active_gpu_seconds", "idle_gpu_seconds", "unmonitored_gpu_seconds",
                     "idle_seconds", "run_seconds", "allocated_gpus", "idle_gpus"):
            assert getattr(figures, name) == pytest.approx(getattr(want, name), rel=1e-9, abs=1e-6), (figures.name, name)
        # energy is exact unless an allocation starts or ends inside a run, where the run's mean power splits it:
        # at most a run's (15 s) energy at ~300 W per start and end
        energy_bound = 1e-6 if aligned else 2 * 15.0 * 301.0 * UNITS[figures.name]
        assert abs(figures.energy_joules - want.energy_joules) <= energy_bound, figures.name
        assert figures.last_active_time == pytest.approx(want.last_active_time, abs=1e-9), figures.name
        assert figures.utilization.current == want.utilization.current, figures.name
        # lifetime means likewise: exact, but for the piece of a run an allocation starts or ends in
        monitored = want.active_gpu_seconds + want.idle_gpu_seconds
        mean_bound = 1e-9 if aligned else 2 * 15.0 * UNITS[figures.name] * 100.0 / max(monitored, 1e-9)
        for windows, expected_windows in ((figures.utilization, want.utilization),
                                          (figures.memory_utilization, want.memory_utilization)):
            if expected_windows.lifetime is None:
                assert windows.lifetime is None
            else:
                assert windows.lifetime == pytest.approx(expected_windows.lifetime, rel=mean_bound, abs=mean_bound)


@pytest.mark.parametrize("seed", range(10))
def test_merged_polls_through_the_columnar_feed_count_as_the_samples_do(seed: int) -> None:
    events, polls = _trace(seed)
    by_sample, by_columns = _feed(events, polls, merge=True), _feed(events, polls, merge=True, columns=True)
    now = polls[-1]["t"]
    assert [item.model_dump() for item in by_columns.workloads(now)] == [item.model_dump() for item in by_sample.workloads(now)]


def _whole_trace(seed: int) -> tuple[list[PodEvent], list[dict[str, Any]]]:
    """Pod events and 1 Hz polls of two whole GPUs whose busy figures wander across 50 % and 100/k for every k."""
    rng = random.Random(seed)
    events = [pod(rng.uniform(0, 30), "a", devices=[("GPU-a", 1.0)], created=0.0),
              pod(rng.uniform(0, 30), "b", devices=[("GPU-b", 1.0)], created=0.0)]
    events.append(pod(rng.uniform(150, 220), "a", "Succeeded", devices=[("GPU-a", 1.0)], created=0.0))
    polls: list[dict[str, Any]] = []
    t, seq, energy = 0.0, 0, 0.0
    while t < 240.0:
        t += 1.0 if rng.random() < 0.97 else 5.0
        for uuid in ("GPU-a", "GPU-b"):
            seq += 1
            energy += rng.uniform(50, 300)
            sm = rng.choice([0.0, rng.uniform(1.0, 100.0), rng.uniform(20.0, 80.0)])
            polls.append(poll(t, sm, uuid=uuid, seq=seq, energy_joules=energy, memory_used_bytes=rng.uniform(0, 100)))
    return events, polls


@pytest.mark.parametrize("seed", range(20))
def test_whole_devices_merged_as_such_count_what_every_poll_counts(seed: int) -> None:
    """`exact_replicas` 1 (a node of whole devices): fewer samples, and the figures of their whole holders as
    exact as the default's, to the same bounds (events aligned to pulls: a run never straddles a holder change)."""
    events, polls = _whole_trace(seed)
    events = _aligned(events, polls)
    whole = MergeRequest(15.0, exact_replicas=1)
    assert len(merge_polls(polls, whole)) < len(merge_polls(polls, REQUEST))
    every, merged = _feed(events, polls, merge=False), _feed(events, polls, merge=True, request=whole)
    now = polls[-1]["t"]
    expected = {figures.name: figures for figures in every.workloads(now)}
    for figures in merged.workloads(now):
        want = expected[figures.name]
        for name in ("allocated_gpu_seconds", "active_gpu_seconds", "idle_gpu_seconds", "unmonitored_gpu_seconds",
                     "idle_seconds", "run_seconds", "allocated_gpus", "idle_gpus", "energy_joules"):
            assert getattr(figures, name) == pytest.approx(getattr(want, name), rel=1e-9, abs=1e-6), (figures.name, name)
        assert figures.last_active_time == pytest.approx(want.last_active_time, abs=1e-9), figures.name
        for got, wanted in ((figures.utilization.current, want.utilization.current),
                            (figures.utilization.lifetime, want.utilization.lifetime),
                            (figures.memory_utilization.lifetime, want.memory_utilization.lifetime)):
            assert (got is None) == (wanted is None), figures.name
            assert got is None or got == pytest.approx(wanted, rel=1e-9), figures.name
