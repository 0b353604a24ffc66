"""Generated histories for the period tests: workloads whose per-interval figures are drawn, recorded into
a store as the engine's cumulative figures, with a reference that sums the per-interval figures directly.

Each workload holds a drawn number of units from its first interval to its last, changing now and then;
its allocated GPU-seconds grow by units x the interval (or, between two intervals, by a short pod's
seconds while it holds none at either), split at random into active, idle and unmonitored (the engine
sometimes takes unmonitored time back as active once late samples come), with energy and a lifetime
utilisation of its own. After its last interval it is reported ended, its figures frozen.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from hypothesis import strategies as st

from gpuwm.model.figures import ClusterFigures, ProjectFigures, Windows, WorkloadFigures
from gpuwm.store import PeriodSums, WorkloadGroup
from gpuwm.store.embedded import EmbeddedStore

from .store_data import workload

STEP = 15.0
NAMESPACES = ("team-a", "team-b")
PROJECTS = ("alpha", "beta")
FIGURES = ("allocated_gpu_seconds", "active_gpu_seconds", "idle_gpu_seconds", "unmonitored_gpu_seconds",
           "utilized_gpu_seconds", "energy_joules")


@dataclass
class Plan:
    """One workload's drawn history: per interval, the units held then and what it accrued in it."""

    name: str
    namespace: str
    project: str
    first: int  # its first interval
    units: list[float]  # per interval from `first`: units held at the interval
    accrued: list[tuple[float, float, float, float]]  # per interval: allocated, active, idle, energy
    taken_back: list[float]  # per interval: unmonitored seconds turned active then
    utilization: float  # its lifetime utilisation, percent
    totals: list[list[float]] = field(default_factory=list)  # per interval from `first`: cumulative FIGURES
    first_time: float = 0.0  # its first interval's time, once recorded
    #: intervals it is still reported, ended, before the controller forgets it (None: to the end)
    forgotten_after: int | None = None

    def began(self, t: float) -> float:
        """When it began: within its first interval (so it brings no opening)."""
        return (self.first_time or t) - 5.0

    @property
    def uid(self) -> str:
        return f"uid-{self.name}"

    def interval_sums(self) -> list[list[float]]:
        """The per-interval figures (FIGURES order), the differences of the cumulative ones."""
        before = [0.0] * len(FIGURES)
        result = []
        for total in self.totals:
            result.append([now - then for now, then in zip(total, before, strict=True)])
            before = total
        return result


@dataclass
class History:
    start: float
    plans: list[Plan]
    intervals: int

    def times(self) -> list[float]:
        return [self.start + STEP * index for index in range(self.intervals)]


@st.composite
def plans(draw: st.DrawFn, intervals: int, name: str) -> Plan:
    first = draw(st.integers(0, intervals - 1))
    length = draw(st.integers(1, intervals - first))
    units: list[float] = []
    level = draw(st.sampled_from([0.5, 1.0, 2.0, 4.0]))
    accrued: list[tuple[float, float, float, float]] = []
    taken_back: list[float] = []
    for index in range(length):
        if index and draw(st.integers(0, 5)) == 0:
            level = draw(st.sampled_from([0.0, 0.25, 1.0, 3.0]))
        units.append(level)
        seconds = level * STEP if level else draw(st.sampled_from([0.0, 0.0, 4.5]))  # a short pod between intervals
        active = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])) * seconds
        idle = draw(st.sampled_from([0.0, 0.5, 1.0])) * (seconds - active)
        accrued.append((seconds, active, idle, draw(st.sampled_from([0.0, 150.5, 3000.25])) * level))
        taken_back.append(draw(st.sampled_from([0.0, 0.0, 2.5])))
    return Plan(name=name, namespace=draw(st.sampled_from(NAMESPACES)), project=draw(st.sampled_from(PROJECTS)),
                first=first, units=units, accrued=accrued, taken_back=taken_back,
                utilization=draw(st.sampled_from([0.0, 12.5, 50.0, 100.0])),
                forgotten_after=draw(st.sampled_from([None, None, 0, 2])))


@st.composite
def histories(draw: st.DrawFn, max_intervals: int = 40, max_workloads: int = 4) -> History:
    intervals = draw(st.integers(2, max_intervals))
    count = draw(st.integers(1, max_workloads))
    # starts on a multiple of the coarse tiers' steps or anywhere within one, the records on the step or not
    start = 1_800_000_000.0 + draw(st.integers(0, 20)) * STEP + draw(st.sampled_from([0.0, 0.0, 7.0]))
    return History(start=start, plans=[draw(plans(intervals, f"w{index}")) for index in range(count)],
                   intervals=intervals)


def _advance(plan: Plan, position: int) -> None:
    """The plan's cumulative totals after its interval `position` (called once per interval, in order)."""
    seconds, active, idle, energy = plan.accrued[position]
    before = plan.totals[-1] if plan.totals else [0.0] * len(FIGURES)
    back = min(plan.taken_back[position], before[3])  # unmonitored time the engine takes back as active
    allocated, active_total, idle_total = before[0] + seconds, before[1] + active + back, before[2] + idle
    utilized = (active_total + idle_total) * plan.utilization / 100.0
    plan.totals.append([allocated, active_total, idle_total, allocated - active_total - idle_total, utilized,
                        before[5] + energy])


def _figures(plan: Plan, t: float, units: float, running: bool) -> WorkloadFigures:
    """The plan's figures as the engine reports them at `t`: its latest totals, `units` held now."""
    total = plan.totals[-1]
    began = plan.began(t) if running else 0.0
    figures = workload(plan.name, [("gpu-" + plan.name, units, 50.0)] if units else [], namespace=plan.namespace,
                       project=plan.project, created=began - 10)
    return figures.model_copy(update={
        "allocated_gpus": units, "allocated_gpu_seconds": total[0], "active_gpu_seconds": total[1],
        "idle_gpu_seconds": total[2], "unmonitored_gpu_seconds": total[3], "energy_joules": total[5],
        "utilization": Windows(lifetime=plan.utilization if total[1] + total[2] else None),
        "phase": "Running" if running else "Succeeded", "end_time": None if running else t,
    })


def intervals(history: History) -> Iterator[tuple[float, list[WorkloadFigures], list[ProjectFigures]]]:
    """Every interval of `history` as the controller reports it: (time, every workload it knows, an ended one
    with its figures frozen, the projects)."""
    for index, t in enumerate(history.times()):
        reported: list[WorkloadFigures] = []
        for plan in history.plans:
            position = index - plan.first
            ended_for = position - len(plan.units)
            if position < 0 or (plan.forgotten_after is not None and ended_for > plan.forgotten_after):
                continue
            running = position < len(plan.units)
            if running:
                _advance(plan, position)
                plan.first_time = plan.first_time if position else t
            reported.append(_figures(plan, t, plan.units[position] if running else 0.0, running))
        projects = [ProjectFigures(name=name, allocated_gpus=sum(w.allocated_gpus for w in reported if w.project == name))
                    for name in PROJECTS]
        yield t, reported, projects


def record(store: EmbeddedStore, history: History) -> None:
    """Record every interval of `history`."""
    for t, reported, projects in intervals(history):
        store.record(t, [], reported, projects, ClusterFigures())


def record_frozen(store: EmbeddedStore, history: History, times: Sequence[float]) -> None:
    """More intervals after the history: every workload reported ended, its figures as they were."""
    for t in times:
        store.record(t, [], [_figures(plan, t, 0.0, False) for plan in history.plans if plan.forgotten_after is None],
                     [], ClusterFigures())


def snap(x: float, earliest: float, latest: float) -> float:
    """A period edge as the store takes it, a bound of buckets (those below it count before the edge):
    everything at or after the latest, nothing at or before the earliest, else x's bucket."""
    if x >= latest:
        return math.inf
    if x <= earliest:
        return -math.inf
    return math.floor(x / STEP) * STEP


def reference(history: History, start: float, end: float) -> dict[str, PeriodSums]:
    """Per workload whose figures changed in [start, end): the sum of its per-interval figures recorded there,
    as the store snaps the edges."""
    times = history.times()
    low, high = (snap(x, times[0], times[-1]) for x in (start, end))
    sums: dict[str, PeriodSums] = {}
    for plan in history.plans:
        total = [0.0] * len(FIGURES)
        for position, figures in enumerate(plan.interval_sums()):
            bucket = math.floor(times[plan.first + position] / STEP) * STEP
            if low <= bucket < high:
                total = [a + b for a, b in zip(total, figures, strict=True)]
        if any(abs(value) > 1e-9 for value in total):  # any figure of it changed in the period
            sums[plan.uid] = PeriodSums(**dict(zip(FIGURES, total, strict=True)))
    return sums


def members(history: History, group: WorkloadGroup) -> list[str]:
    """The UIDs of the history's workloads that `group` chooses."""
    return [plan.uid for plan in history.plans if group.holds(plan.namespace, plan.project)]


def label_groups(namespaces: Sequence[str] = NAMESPACES) -> dict[str, WorkloadGroup]:
    """Every project's, every namespace's, a project's within a namespace a reader sees, and the whole fleet's."""
    return {"all": WorkloadGroup(), **{f"project:{name}": WorkloadGroup(project=name) for name in PROJECTS},
            **{f"namespace:{name}": WorkloadGroup(namespaces=frozenset({name})) for name in namespaces},
            "alpha seen from team-a": WorkloadGroup(project="alpha", namespaces=frozenset({"team-a"}))}


def reference_peak(history: History, start: float, end: float, uids: Sequence[str]) -> float:
    """The most units `uids` held together at one interval recorded in [start, end)."""
    times = history.times()
    low, high = (snap(x, times[0], times[-1]) for x in (start, end))
    peak = 0.0
    for index, t in enumerate(times):
        if low <= math.floor(t / STEP) * STEP < high:
            held = sum(plan.units[index - plan.first] for plan in history.plans if plan.uid in uids
                       and 0 <= index - plan.first < len(plan.units))
            peak = max(peak, held)
    return peak
