"""A workload's phase and its times (DESIGN §3): when it ended, how long it waited, queued and sat idle.

Read at report time from the workload's pods and from its object's own timeline (`WorkloadEvent`s),
pure functions of the engine's records and `now`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from gpuwm.accounting.state import Workload
from gpuwm.model import ENDED_POD_PHASES, WorkloadEvent

#: the phases of a workload that has not got its GPUs: its requested units are unmet demand
WAITING_PHASES = frozenset({"Queued", "Pending"})


@dataclass(frozen=True, slots=True)
class PodsAtNow:
    """What a workload's pods say at `now`: their figures, and whether (and when, how) they all ended."""

    figures: list[dict[str, Any]]  # PodFigures' fields, validated with the workload's figures
    ended: bool
    end_time: float | None
    end_phase: str
    any_running: bool


def pods_at(workload: Workload, now: float) -> PodsAtNow:
    """Each pod's figures (by name, then uid), and the end of the workload's pods if every one has ended."""
    figures: list[dict[str, Any]] = []
    ended = bool(workload.pods)
    end_time: float | None = None
    end_phase = "Ended"
    any_running = False
    for pod in sorted(workload.pods.values(), key=lambda pod: (pod.name, pod.uid)):
        current = pod.current
        any_running = any_running or current.phase == "Running"
        units = 0.0
        for stretch in pod.stretches:
            if stretch.start <= now < stretch.end:
                units += stretch.units
        figures.append(dict(name=pod.name, uid=pod.uid, node=current.node, phase=current.phase,
                            allocated_gpus=units, labels=current.labels, resources=current.resources,
                            failure_reason=current.failure_reason))
        if current.phase in ENDED_POD_PHASES:
            terminal_time = pod.timeline[-1][0]
            if end_time is None or terminal_time >= end_time:
                end_time = terminal_time
                end_phase = current.phase if current.phase != "Deleted" else "Ended"
        else:
            ended = False
    return PodsAtNow(figures, ended, end_time if ended else None, end_phase, any_running)


def object_state(workload: Workload, now: float) -> WorkloadEvent | None:
    """The workload object's state at `now` (its latest event at or before it); None when only pods name it."""
    timeline = workload.timeline
    if not timeline:
        return None
    index = bisect.bisect_right([entry[0] for entry in timeline], now) - 1
    return timeline[max(index, 0)][1]


def phase_and_end(
    workload: Workload, pods: PodsAtNow, state: WorkloadEvent | None, running: bool, now: float,
) -> tuple[str, float | None]:
    """(phase, end time): Running while a GPU container runs; else the object's own state, where its pods do not
    say they finished (a preempted workload's deleted pods do not end it: it queues again); else the pods'."""
    if running:
        return "Running", pods.end_time
    if state is not None and not (pods.ended and pods.end_phase != "Ended"):
        phase, object_end = _object_phase(workload, state, now)
        if object_end is not None:
            return phase, object_end
        return phase, None if phase in WAITING_PHASES else pods.end_time
    if pods.ended:
        return pods.end_phase, pods.end_time
    return ("Running" if pods.any_running else "Pending"), pods.end_time


def _object_phase(workload: Workload, state: WorkloadEvent, now: float) -> tuple[str, float | None]:
    """(phase, end time) from the object's own state when no GPU container runs: deleted (Ended), finished,
    suspended (Queued), else Pending (admitted or never suspended, no GPU container running yet)."""
    if state.deleted or state.finished is not None:
        # when it ended: the first event of the run of ended states that `state` belongs to
        end = now
        for t, event in reversed(workload.timeline):
            if t > now:
                continue
            if not (event.deleted or event.finished is not None):
                break
            end = t
        return ("Ended" if state.deleted and state.finished is None else state.finished or "Ended"), end
    return ("Queued" if state.suspended else "Pending"), None


def idle_seconds(
    runs: list[tuple[float, float]], last_active: float, running: bool, active_now: bool, now: float,
) -> float:
    """now - max(lastActiveTime, start of the current allocation); 0 while active; frozen at the last run's end."""
    if running:
        current_start = runs[-1][0] if runs else now
        return 0.0 if active_now else max(0.0, now - max(last_active, current_start))
    if runs:
        run_start, run_end = runs[-1]
        return max(0.0, run_end - max(last_active, run_start))
    return 0.0


def wait_and_queued(
    workload: Workload, runs: list[tuple[float, float]], end_time: float | None, now: float,
) -> tuple[float, float, float]:
    """(creation time, waitSeconds, queuedSeconds): from creation to the first running GPU container (or to
    now, or the end), plus the waits of a workload queued again after it ran; at least its queued time."""
    created = workload.created if workload.created is not None else workload.first_seen
    if workload.first_run_start is not None:
        wait_seconds = max(0.0, workload.first_run_start - created)
    else:
        wait_seconds = max(0.0, (end_time if end_time is not None else now) - created)
    if not workload.timeline:
        return created, wait_seconds, 0.0
    queued_seconds, requeued_wait = _queued_and_requeued(workload, created, runs, now, end_time)
    # a workload waits at least as long as it was held back: a container start the kubelet writes in
    # whole seconds can read up to a second before the admission the controller saw
    return created, max(wait_seconds + requeued_wait, queued_seconds), queued_seconds


def _queued_and_requeued(
    workload: Workload, created: float, runs: list[tuple[float, float]], now: float, end_time: float | None,
) -> tuple[float, float]:
    """(queuedSeconds, the wait added by queueing again after a run) from the object's timeline.

    queuedSeconds: every second from creation to now (or the end) the object was held back; its
    first event's state holds from its creation (a workload is seen suspended from the start).
    A workload suspended again after it ran (preempted) waits again: from its suspension, or from
    the end of the run it was suspended in, to its next run, or to now (both count on).
    """
    stop = now if end_time is None else min(now, end_time)
    timeline = [(t, event) for t, event in workload.timeline if t <= stop]
    if not timeline:
        return 0.0, 0.0
    queued = 0.0
    start = min(created, timeline[0][0])
    for position, (t, event) in enumerate(timeline):
        begin = start if position == 0 else t
        until = timeline[position + 1][0] if position + 1 < len(timeline) else stop
        if event.suspended and until > begin:
            queued += until - begin
    requeued = 0.0
    first_run = runs[0][0] if runs else None
    suspended_before = timeline[0][1].suspended
    for t, event in timeline[1:]:
        if event.suspended and not suspended_before and first_run is not None and t > first_run:
            from_time = t
            for run_start, run_end in runs:
                if run_start <= t < run_end:
                    from_time = run_end
            following = [run_start for run_start, _run_end in runs if run_start >= from_time]
            until_run = following[0] if following else stop
            requeued += max(0.0, min(until_run, stop) - from_time)
        suspended_before = event.suspended
    return queued, requeued
