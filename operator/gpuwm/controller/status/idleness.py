"""Idleness as observed through samples: the Idle condition's judge, `status.idleSince`, and what counts as reporting.

DESIGN §3: the Idle condition (and the Events and any action built on it) rests on observed
idleness only. The engine's idleSeconds runs through time no sample covered; these functions
decide, from a workload's figures and the controller's memory of earlier cycles (`IdleWatch`),
whether it is seen active, seen idle and for how long, or not seen at all (Unknown).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

from gpuwm.accounting import holds_gpus
from gpuwm.model import GpuFigures, WorkloadFigures

ConditionStatus = Literal["True", "False", "Unknown"]


def sample_recent(gpu: GpuFigures, now: float, slack_seconds: float) -> bool:
    """The device's latest sample is recent: monitored by the engine's rule, or within `slack_seconds` of `now`."""
    return gpu.monitored or (slack_seconds > 0 and gpu.last_sample_time is not None
                             and now - gpu.last_sample_time <= slack_seconds)


def reporting(figures: WorkloadFigures, now: float, slack_seconds: float = 0.0) -> bool:
    """Whether every unit the workload holds has a recent sample: the engine's `sampling`, or each device's
    latest sample within `slack_seconds` of `now`.

    The engine calls a device monitored now while its latest sample is within 3 poll intervals
    of the report's time; a controller pulling hundreds of agents one after the other reports
    seconds after the first agent answered, so that flag flips with the pull's timing alone.
    The controller passes the engine's gap plus a status interval as the slack: a device the
    latest pull heard from counts as reporting, one that stayed silent for a whole interval does
    not. Units no agent has named yet (allocated from the pod's requests) are never reporting.
    """
    if figures.sampling:
        return True
    if slack_seconds <= 0 or not figures.gpus:
        return False
    named_units = sum(gpu.units for gpu in figures.gpus)
    return named_units >= figures.allocated_gpus - 1e-6 and all(sample_recent(gpu, now, slack_seconds) for gpu in figures.gpus)


def seen_active(figures: WorkloadFigures, now: float, slack_seconds: float = 0.0) -> bool:
    """Active now: the engine says so (idleSeconds 0), or a recent latest sample of one of its devices was active
    (the engine's idleSeconds runs from a busy device's last sample once it is a few polls old; see `reporting`)."""
    if figures.idle_seconds <= 0:
        return True
    return slack_seconds > 0 and any(gpu.active and sample_recent(gpu, now, slack_seconds) for gpu in figures.gpus)


def idle_since_second(figures: WorkloadFigures, now: float, slack_seconds: float = 0.0) -> int | None:
    """The whole second the current idle stretch began (`status.idleSince`); None while active or not running.

    `now - idleSeconds` is the later of lastActiveTime and the current allocation's start; the
    millisecond of slack keeps the float subtraction from flipping the second between cycles.
    """
    if not holds_gpus(figures) or seen_active(figures, now, slack_seconds):
        return None
    return math.floor(now - figures.idle_seconds + 1e-3)


class Seen(NamedTuple):
    """What a workload's samples show at one time: judged once a status cycle (`seen_now`), and read alike
    by the idle watch, the Idle condition and the writer's signature."""

    holds_gpus: bool  # see `holds_gpus`
    reporting: bool  # see `reporting`
    idle_since_second: int | None  # see `idle_since_second`; None also means seen active


def seen_now(figures: WorkloadFigures, now: float, slack_seconds: float = 0.0) -> Seen:
    return Seen(holds_gpus(figures), reporting(figures, now, slack_seconds),
                idle_since_second(figures, now, slack_seconds))


def idle_condition(
    figures: WorkloadFigures, observed_idle_seconds: float | None, idle_condition_after_seconds: float,
    now: float = 0.0, slack_seconds: float = 0.0, seen: Seen | None = None,
) -> tuple[ConditionStatus, str]:
    """The Idle condition's status and reason: True only on observed idleness (DESIGN §3).

    `observed_idle_seconds`: how long the current idle stretch has been watched through samples
    (`IdleWatch`); None when it has not been. Idle time before a workload's first sample or while
    its agent is not reporting is not evidence of idleness: the engine's idleSeconds counts it,
    the condition does not, and says Unknown while the workload's time is unmonitored now.
    `now`, `slack_seconds`: see `reporting` (0: the engine's own flags alone). `seen`: `seen_now`'s answer
    where the caller has it for this `now` already.
    """
    seen = seen or seen_now(figures, now, slack_seconds)
    if not seen.holds_gpus:
        return "False", "NotRunning"
    if seen.idle_since_second is None:
        return "False", "Active"  # a sample showed it busy: observed, whatever the other devices say
    if not seen.reporting:
        never = not figures.gpus or all(gpu.last_sample_time is None for gpu in figures.gpus)
        return "Unknown", "NotYetSampled" if never else "AgentNotReporting"
    if observed_idle_seconds is not None and observed_idle_seconds >= idle_condition_after_seconds:
        return "True", "IdleTooLong"
    return "False", "IdleBelowTimeout"


class IdleStretch(NamedTuple):
    """An idle stretch: the second it started, and since when it is observed through samples."""

    start_second: int
    observed_since: float


class IdleWatch:
    """Since when each running workload's current idle stretch has been observed: what the Idle timeout counts.

    The engine's idleSeconds runs from the later of lastActiveTime and the allocation's start,
    through time no sample covered (before the first one, agent outages). The Idle condition, its
    Events and anything that acts on idleness count from the first status cycle that saw the
    stretch through samples instead: the stretch's start when the cycle before saw the workload
    sampled (nothing unobserved lies between), else that cycle's time (an undercount of at most a
    status interval, never an overcount). An outage inside a stretch makes the condition Unknown
    while it lasts and does not restart the count: it runs from the first monitored sample of
    the current idle stretch (DESIGN §3).

    Kept in memory only. After a restart a workload whose Idle condition was written True keeps
    its stretch's start (the condition said it was observed); any other starts counting again.
    """

    def __init__(self, slack_seconds: float = 0.0) -> None:
        self.slack_seconds = slack_seconds  # see `reporting`
        self._stretch: dict[str, IdleStretch] = {}  # uid -> its current idle stretch
        self._sampled_at: dict[str, float] = {}  # uid -> the latest cycle that saw it running and sampled

    def observe(self, figures: WorkloadFigures, now: float, written_idle: bool = False,
                seen: Seen | None = None) -> float | None:
        """Seconds of the current idle stretch observed by `now`; None while active, not running or not yet seen.

        `written_idle`: the workload's Idle condition as last written was True (a restart's memory).
        `seen`: `seen_now`'s answer for this `now` and the watch's slack, where the caller has it.
        """
        uid = figures.uid
        seen = seen or seen_now(figures, now, self.slack_seconds)
        stretch, sampled = seen.idle_since_second, seen.reporting
        previous_sample = self._sampled_at.get(uid)
        if seen.holds_gpus and sampled:
            self._sampled_at[uid] = now
        elif not seen.holds_gpus:
            self._sampled_at.pop(uid, None)
        if stretch is None:
            self._stretch.pop(uid, None)
            return None
        known = self._stretch.get(uid)
        if known is not None and known.start_second == stretch:
            return now - known.observed_since
        if not sampled:  # a new stretch not seen through samples yet: nothing observed
            self._stretch.pop(uid, None)
            return None
        start = now - figures.idle_seconds
        if previous_sample is not None:
            since = max(start, previous_sample)
        elif written_idle:
            since = start
        else:
            since = now
        self._stretch[uid] = IdleStretch(stretch, since)
        return now - since

    def forget(self, uid: str) -> None:
        self._stretch.pop(uid, None)
        self._sampled_at.pop(uid, None)
