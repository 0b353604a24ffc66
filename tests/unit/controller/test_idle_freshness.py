"""Idle only when seen idle, idleSince, and state changes reaching their CR first."""

from __future__ import annotations

import pytest

from gpuwm.controller.kube.ratelimit import TokenBucket
from gpuwm.controller.status.build import (
    build_conditions,
    build_workload_status,
    workload_signature,
)
from gpuwm.controller.status.idleness import IdleWatch, idle_condition
from gpuwm.controller.status.writer import WORKLOAD_PLURAL, Desired, StatusWriter, Written
from gpuwm.model.figures import GpuFigures, WorkloadFigures
from tests.unit.controller.test_pods_agents import RecordingClient

from .test_status import NOW, figures

TIMEOUT = 120.0


def held(t: float, *, start: float, last_sample: float | None, monitored: bool, active_until: float | None = None,
         phase: str = "Running") -> WorkloadFigures:
    """One GPU held since `start`, its latest sample at `last_sample`, active until `active_until` (if ever)."""
    anchor = start if active_until is None else max(start, active_until)
    return figures(
        phase=phase, allocated_gpus=1.0, sampling=monitored, last_active_time=active_until,
        idle_seconds=0.0 if active_until is not None and active_until >= t else t - anchor,
        gpus=[GpuFigures(node="n1", uuid="GPU-a", units=1.0, pod="train-0", monitored=monitored,
                         last_sample_time=last_sample)],
    )


def idle_of(f: WorkloadFigures, observed: float | None) -> tuple[str, str]:
    return idle_condition(f, observed, TIMEOUT)


def test_time_before_the_first_sample_does_not_count_toward_idle() -> None:
    """The reported case: allocated at 0, first sample at 51 s, 'idle for 121s' at 121 s with ~70 s sampled."""
    watch, start = IdleWatch(), NOW
    seen: list[tuple[float, float | None, tuple[str, str]]] = []
    for t in (start + 15, start + 30, start + 45):  # allocated, no sample yet
        f = held(t, start=start, last_sample=None, monitored=False)
        observed = watch.observe(f, t)
        seen.append((t - start, observed, idle_of(f, observed)))
    assert all(state == ("Unknown", "NotYetSampled") and observed is None for _, observed, state in seen)
    for offset in (60, 75, 90, 105, 121, 135, 150, 165, 180, 195):  # sampled (idle) from 51 s on
        t = start + offset
        f = held(t, start=start, last_sample=t - 0.5, monitored=True)
        observed = watch.observe(f, t)
        seen.append((offset, observed, idle_of(f, observed)))
    by_offset = {offset: (observed, state) for offset, observed, state in seen}
    assert by_offset[60][0] == 0.0  # first cycle that saw it sampled: counting starts there (never earlier)
    assert by_offset[121] == (61.0, ("False", "IdleBelowTimeout"))  # idleSeconds 121 >= 120, not observed so
    assert by_offset[165][1] == ("False", "IdleBelowTimeout")
    assert by_offset[180] == (120.0, ("True", "IdleTooLong"))  # 120 s observed
    first_true = min(offset for offset, _, state in seen if state[0] == "True")
    assert first_true - 51 >= TIMEOUT  # never before the timeout of sampled time


def test_an_idle_stretch_seen_from_its_start_counts_from_its_start() -> None:
    watch, start = IdleWatch(), NOW - 1000
    t = NOW
    busy = held(t, start=start, last_sample=t - 0.5, monitored=True, active_until=t)
    assert watch.observe(busy, t) is None and idle_of(busy, None) == ("False", "Active")
    later = t + 15
    idle = held(later, start=start, last_sample=later - 0.5, monitored=True, active_until=t + 3)
    assert watch.observe(idle, later) == pytest.approx(12.0)  # since its last active sample: all of it observed
    at = t + 3 + TIMEOUT
    assert idle_of(held(at, start=start, last_sample=at - 0.5, monitored=True, active_until=t + 3),
                   watch.observe(held(at, start=start, last_sample=at - 0.5, monitored=True, active_until=t + 3), at)
                   ) == ("True", "IdleTooLong")


def test_an_agent_outage_makes_idle_unknown_and_no_event_but_keeps_the_spell() -> None:
    watch, start = IdleWatch(), NOW - 1000
    idle_from = NOW - 200
    before = held(NOW, start=start, last_sample=NOW - 0.5, monitored=True, active_until=idle_from)
    seen_busy = idle_from - 1  # a cycle saw it sampled and busy just before
    watch.observe(held(seen_busy, start=start, last_sample=seen_busy - 0.5, monitored=True, active_until=seen_busy),
                  seen_busy)
    observed = watch.observe(before, NOW)
    assert observed == pytest.approx(200.0) and idle_of(before, observed) == ("True", "IdleTooLong")
    out = held(NOW + 60, start=start, last_sample=NOW + 10, monitored=False, active_until=idle_from)
    during = watch.observe(out, NOW + 60)
    assert idle_of(out, during) == ("Unknown", "AgentNotReporting")
    conditions = {c.type: c for c in build_conditions(out, NOW + 60, idle_condition_after_seconds=TIMEOUT,
                                                      observed_idle_seconds=during)}
    assert "agent not reporting" in conditions["Idle"].message and "GPU-a" in conditions["Idle"].message
    back = held(NOW + 90, start=start, last_sample=NOW + 89.5, monitored=True, active_until=idle_from)
    assert idle_of(back, watch.observe(back, NOW + 90)) == ("True", "IdleTooLong")  # the same spell


def test_a_restarted_controller_trusts_an_idle_condition_it_wrote_and_nothing_else() -> None:
    f = held(NOW, start=NOW - 1000, last_sample=NOW - 0.5, monitored=True, active_until=NOW - 500)
    assert IdleWatch().observe(f, NOW, written_idle=True) == pytest.approx(500.0)
    assert IdleWatch().observe(f, NOW) == 0.0  # not written idle: counting starts now


def test_idle_since_is_when_the_stretch_began_and_absent_while_active_or_ended() -> None:
    idle = held(NOW, start=NOW - 1000, last_sample=NOW - 0.5, monitored=True, active_until=NOW - 300.4)
    body = build_workload_status(idle, NOW, observed_idle_seconds=300.4).model_dump(mode="json", by_alias=True)
    assert body["idleSince"] == "2025-12-31T23:54:59Z" and body["idleSeconds"] == pytest.approx(300.4)
    assert build_workload_status(idle, NOW, observed_idle_seconds=300.4).idle_since == body["idleSince"]
    busy = held(NOW, start=NOW - 1000, last_sample=NOW - 0.5, monitored=True, active_until=NOW)
    assert build_workload_status(busy, NOW).model_dump(mode="json", by_alias=True)["idleSince"] is None  # merge-patched as null: the field goes
    ended = idle.model_copy(update={"phase": "Succeeded", "allocated_gpus": 0.0})
    assert build_workload_status(ended, NOW).model_dump(mode="json", by_alias=True)["idleSince"] is None
    # the same stretch a cycle later: the same second (the signature does not flip on float noise)
    later = idle.model_copy(update={"idle_seconds": idle.idle_seconds + 15.000000001})
    assert build_workload_status(later, NOW + 15).model_dump(mode="json", by_alias=True)["idleSince"] == body["idleSince"]


def test_going_idle_and_active_again_is_news_in_the_signature() -> None:
    busy = held(NOW, start=NOW - 1000, last_sample=NOW - 0.5, monitored=True, active_until=NOW)
    idle = held(NOW + 15, start=NOW - 1000, last_sample=NOW + 14.5, monitored=True, active_until=NOW + 2)
    still = held(NOW + 30, start=NOW - 1000, last_sample=NOW + 29.5, monitored=True, active_until=NOW + 2)
    assert workload_signature(busy, NOW) != workload_signature(idle, NOW + 15)
    assert workload_signature(idle, NOW + 15, observed_idle_seconds=13) == workload_signature(
        still, NOW + 30, observed_idle_seconds=28)  # the same stretch: counters only
    unknown = held(NOW + 30, start=NOW - 1000, last_sample=NOW + 2, monitored=False, active_until=NOW + 2)
    assert workload_signature(unknown, NOW + 30, observed_idle_seconds=28) != workload_signature(
        still, NOW + 30, observed_idle_seconds=28)  # the Idle condition went Unknown


def _offer(writer: StatusWriter, name: str, state: int, counter: float) -> None:
    writer.offer(Desired(plural=WORKLOAD_PLURAL, namespace="ns", name=name, spec={}, labels={},
                         render=lambda: {"phase": "Running"}, signature=("Running", state), counters=(counter,)))


async def _drain(writer: StatusWriter, client: RecordingClient, writes: int, clock: list[float]) -> list[str]:
    """`writes` writes as the token bucket would space them (one 1/rate s apart): the names written."""
    names = []
    step = 1.0 / writer.bucket.rate_per_second
    for _ in range(writes):
        desired = writer._next()
        if desired is None:
            break
        clock[0] += step
        await writer.write(desired)
        names.append(desired.name)
    return names


@pytest.mark.parametrize("adopted", [False, True], ids=["written-before", "adopted-at-restart"])
async def test_under_a_backlog_a_state_change_is_written_within_two_intervals(adopted: bool) -> None:
    """4,000 CRs whose counters move every 15 s interval, 20 writes/s (300 an interval): a backlog of ~3,700
    refreshes every interval. State changes still reach their CRs within two intervals, and every CR's
    counters within the counters refresh (a sweep of 4,000 at 20/s is 200 s, under 300 s)."""
    interval, count, rate = 15.0, 4000, 20.0
    clock = [NOW]
    client = RecordingClient()
    writer = StatusWriter(client, TokenBucket(rate), interval, clock=lambda: clock[0],  # type: ignore[arg-type]
                          counters_refresh_seconds=300.0)
    names = [f"w{index:04d}" for index in range(count)]
    keys = [(WORKLOAD_PLURAL, "ns", name) for name in names]
    writer.existing.update(keys)
    if not adopted:  # a controller that has written every CR once already, long ago
        for name in names:
            _offer(writer, name, 0, 0.0)
        while writer._next() is not None:
            pass
        for key in keys:
            writer.written[key] = writer.written.get(key) or _written_at(NOW - 400)
    last_write = {name: NOW - 400 for name in names}
    changed_at: dict[str, float] = {}
    lags: list[float] = []
    oldest: list[float] = []
    state = dict.fromkeys(names, 0)
    for cycle in range(1, 41):  # 10 minutes
        now = clock[0] = NOW + cycle * interval
        if cycle in (5, 17, 30):  # 40 workloads change state (went idle, ended, ...)
            for name in names[cycle::97][:40]:
                state[name] += 1
                changed_at.setdefault(name, now)
        for name in names:
            _offer(writer, name, state[name], now)  # counters move every interval
        written = await _drain(writer, client, int(rate * interval), clock)
        for name in written:
            last_write[name] = clock[0]
            if name in changed_at:
                lags.append(clock[0] - changed_at.pop(name))
        if cycle > 20:  # past the first sweep
            oldest.append(max(clock[0] - at for at in last_write.values()))
        clock[0] = now  # the next cycle starts on time
    assert not changed_at, "state changes never written"
    assert len(lags) == 120 and max(lags) <= 2 * interval
    assert max(oldest) <= 300.0  # statusCountersRefresh


def _written_at(at: float) -> Written:
    return Written(signature=("Running", 0), counters=(0.0,), at=at)


async def test_a_refresh_older_than_the_counters_refresh_goes_before_routine_ones() -> None:
    clock = [NOW]
    client = RecordingClient()
    writer = StatusWriter(client, TokenBucket(20), 15.0, clock=lambda: clock[0],  # type: ignore[arg-type]
                          counters_refresh_seconds=300.0)
    for name in ("a", "b", "old"):
        writer.existing.add((WORKLOAD_PLURAL, "ns", name))
        _offer(writer, name, 0, 0.0)
    for desired in [writer._next(), writer._next(), writer._next()]:
        assert desired is not None
        await writer.write(desired)
    writer.written[(WORKLOAD_PLURAL, "ns", "old")].at = NOW - 400  # written 400 s ago; a, b just now
    clock[0] = NOW + 20
    for name in ("a", "b", "old"):  # counters moved: routine refreshes for a and b, an overdue one for old
        _offer(writer, name, 0, 1.0)
    _offer(writer, "a", 1, 1.0)  # ... and a state change of a: before everything
    assert [d.name for d in (writer._next(), writer._next(), writer._next()) if d is not None] == ["a", "old", "b"]


def test_samples_a_pull_old_are_still_reporting_and_a_busy_one_still_active() -> None:
    """A report seconds after the pull (hundreds of agents pulled in turn) sees busy devices' latest samples a
    few polls old: the engine then says unmonitored now and starts idleSeconds. With the slack the controller
    passes (the engine's gap plus a status interval) that is neither a state change nor idleness."""
    slack = 3.0 + 15.0
    fresh = held(NOW, start=NOW - 1000, last_sample=NOW - 0.5, monitored=True, active_until=NOW)
    late = fresh.model_copy(update={"sampling": False, "idle_seconds": 4.0, "last_active_time": NOW - 4.0, "gpus": [
        fresh.gpus[0].model_copy(update={"monitored": False, "last_sample_time": NOW - 4.0, "active": True})]})
    assert workload_signature(late, NOW, reporting_slack_seconds=slack) == workload_signature(
        fresh.model_copy(update={"gpus": [fresh.gpus[0].model_copy(update={"active": True})]}), NOW,
        reporting_slack_seconds=slack)
    assert idle_condition(late, None, TIMEOUT, NOW, slack) == ("False", "Active")
    assert build_workload_status(late, NOW, reporting_slack_seconds=slack).model_dump(mode="json", by_alias=True)["idleSince"] is None
    assert workload_signature(late, NOW) != workload_signature(fresh, NOW)  # without the slack: a flip
    silent = late.model_copy(update={"gpus": [late.gpus[0].model_copy(update={"last_sample_time": NOW - 30.0})]})
    assert idle_condition(silent, None, TIMEOUT, NOW, slack) == ("Unknown", "AgentNotReporting")
    unnamed = fresh.model_copy(update={"sampling": False, "allocated_gpus": 2.0, "idle_seconds": 30.0})
    assert idle_condition(unnamed, None, TIMEOUT, NOW, slack)[0] == "Unknown"  # a unit no agent named yet
