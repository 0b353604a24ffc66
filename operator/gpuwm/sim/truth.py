"""What the simulator knows exactly: the GPU-seconds it generated per workload, by kind.

The simulator tells this ledger every allocation it makes and every sample it emits,
with the true utilisation of each holder (not the figure the engine derives from the
sample), so comparing the engine's figures with it checks the engine's arithmetic and
the samples' encoding at once. The interval rules are DESIGN §3's: a sample covers
(previous sample, t]; an interval longer than 3 x the poll interval, before a device's
first sample, after its latest sample, or with no utilisation (a lost GPU) is unmonitored.

It also keeps what the simulator did with each workload object: when it was created,
the GPU units it asked for, when Kueue held it back and admitted it, and when it ran. Queued and
wait seconds follow from those times alone, never from the events the engine reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pydantic import BaseModel, Field


class TruthFigures(BaseModel):
    """One workload's generated GPU-seconds (units x seconds) and energy."""

    allocated_gpu_seconds: float = 0.0
    active_gpu_seconds: float = 0.0
    idle_gpu_seconds: float = 0.0
    unmonitored_gpu_seconds: float = 0.0
    energy_joules: float = Field(default=0.0, description="Power drawn x seconds x the holder's share of the GPU.")
    utilization_unit_seconds: float = Field(default=0.0, description="Monitored unit-seconds x utilisation percent.")
    requested_gpus: float | None = Field(default=None, description="Units its pods ask for; None: its object is not watched.")
    queued_seconds: float = Field(default=0.0, description="Seconds held back by Kueue since creation.")
    wait_seconds: float = Field(default=0.0, description="Creation to its first run, and every stretch between runs since.")

    @property
    def lifetime_utilization_percent(self) -> float | None:
        monitored = self.active_gpu_seconds + self.idle_gpu_seconds
        return None if monitored <= 0 else self.utilization_unit_seconds / monitored


@dataclass(slots=True)
class _Sums:
    """The ledger's running sums (a plain class: pydantic's attribute hooks cost too much per sample)."""

    allocated: float = 0.0
    active: float = 0.0
    idle: float = 0.0
    unmonitored: float = 0.0
    energy: float = 0.0
    utilization: float = 0.0

    def figures(self) -> TruthFigures:
        return TruthFigures(
            allocated_gpu_seconds=self.allocated, active_gpu_seconds=self.active, idle_gpu_seconds=self.idle,
            unmonitored_gpu_seconds=self.unmonitored, energy_joules=self.energy,
            utilization_unit_seconds=self.utilization,
        )


@dataclass(slots=True)
class _Holding:
    workload_uid: str
    pod_uid: str
    units: float
    start: float
    end: float = math.inf


@dataclass(slots=True)
class _Life:
    """One workload object's life as the simulator lived it: created, held back, admitted, run, ended."""

    created: float
    requested_gpus: float | None
    held_since: float | None  # held back by Kueue since (None: not held now)
    held_seconds: float = 0.0  # of earlier stretches held back
    runs: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of ended runs
    running_since: float | None = None
    ended: float | None = None

    def queued_seconds(self, now: float) -> float:
        stop = now if self.ended is None else min(now, self.ended)
        held = 0.0 if self.held_since is None else max(0.0, stop - self.held_since)
        return self.held_seconds + held

    def wait_seconds(self, now: float) -> float:
        """Creation to the first run; then every stretch between one run and the next (or now): the
        simulator ends a run early only by preempting the workload, which then waits to run again."""
        stop = now if self.ended is None else min(now, self.ended)
        starts = [start for start, _end in self.runs]
        ends = [end for _start, end in self.runs]
        if self.running_since is not None:
            starts.append(self.running_since)
        if not starts:
            return max(0.0, stop - self.created)
        wait = starts[0] - self.created
        for end, following in zip(ends, starts[1:], strict=False):
            wait += following - end
        if self.running_since is None and self.ended is None:
            wait += stop - ends[-1]  # preempted and not running again yet
        return wait


@dataclass(slots=True)
class _DeviceLedger:
    last_sample: float = -math.inf
    holdings: list[_Holding] = field(default_factory=list)


class GroundTruth:
    """Per workload uid: allocated = active + idle + unmonitored GPU-seconds, as generated."""

    def __init__(self, interval_seconds: float, idle_threshold_percent: float = 1.0) -> None:
        self.gap_seconds = 3.0 * interval_seconds
        self.idle_threshold_percent = idle_threshold_percent
        self.sums: dict[str, _Sums] = {}
        self._devices: dict[str, _DeviceLedger] = {}
        self._open: dict[tuple[str, str], _Holding] = {}  # (sample uuid, pod uid) -> open holding
        self._lives: dict[str, _Life] = {}

    def created(self, workload_uid: str, created: float, requested_gpus: float | None, held: bool) -> None:
        """A workload created at `created`, asking for `requested_gpus` (None: its object is not watched),
        held back by Kueue from its creation when `held`."""
        self.sums.setdefault(workload_uid, _Sums())
        self._lives[workload_uid] = _Life(created, requested_gpus, created if held else None)

    def held(self, workload_uid: str, t: float) -> None:
        """Kueue holds it back from t on (preempted)."""
        life = self._lives[workload_uid]
        if life.held_since is None:
            life.held_since = t

    def admitted(self, workload_uid: str, t: float) -> None:
        life = self._lives[workload_uid]
        if life.held_since is not None:
            life.held_seconds += t - life.held_since
            life.held_since = None

    def run_started(self, workload_uid: str, t: float) -> None:
        self._lives[workload_uid].running_since = t

    def run_ended(self, workload_uid: str, t: float) -> None:
        life = self._lives[workload_uid]
        if life.running_since is not None:
            life.runs.append((life.running_since, t))
            life.running_since = None

    def ended(self, workload_uid: str, t: float) -> None:
        self.run_ended(workload_uid, t)
        self._lives[workload_uid].ended = t

    def allocate(self, sample_uuid: str, workload_uid: str, pod_uid: str, units: float, t: float) -> None:
        """Pod `pod_uid` holds `units` of the device sampled as `sample_uuid` from t on."""
        holding = _Holding(workload_uid, pod_uid, units, t)
        self._devices.setdefault(sample_uuid, _DeviceLedger()).holdings.append(holding)
        self._open[(sample_uuid, pod_uid)] = holding
        self.sums.setdefault(workload_uid, _Sums())

    def release(self, sample_uuid: str, pod_uid: str, t: float) -> None:
        holding = self._open.pop((sample_uuid, pod_uid), None)
        if holding is not None:
            holding.end = t

    def sample(
        self, sample_uuid: str, t: float, device_percent: float | None, device_units: float = 1.0,
        process_percent_by_pod: dict[str, float] | None = None,
    ) -> None:
        """A sample of the device at t: its SM % (None when it could not be read: a lost GPU), its size,
        and the SM % of the processes the agent saw per pod (None: no per-process data)."""
        ledger = self._devices.setdefault(sample_uuid, _DeviceLedger())
        start = ledger.last_sample
        ledger.last_sample = t
        monitored = device_percent is not None and t - start <= self.gap_seconds
        covering = [holding for holding in ledger.holdings if min(t, holding.end) > max(start, holding.start)]
        for holding in ledger.holdings:
            seconds = min(t, holding.end) - max(start, holding.start)
            if seconds > 0:
                unit_seconds = holding.units * seconds
                sums = self.sums[holding.workload_uid]
                sums.allocated += unit_seconds
                if monitored and device_percent is not None:
                    utilization = self._attributed(holding, covering, device_percent, device_units, process_percent_by_pod)
                    sums.utilization += unit_seconds * utilization
                    if utilization >= self.idle_threshold_percent:
                        sums.active += unit_seconds
                    else:
                        sums.idle += unit_seconds
                else:
                    sums.unmonitored += unit_seconds
        ledger.holdings = [holding for holding in ledger.holdings if holding.end > t]

    def _attributed(
        self, holding: _Holding, covering: list[_Holding], device_percent: float, device_units: float,
        process_percent_by_pod: dict[str, float] | None,
    ) -> float:
        """The holder's utilisation by DESIGN §3's attribution rule (activity is never lost to attribution).

        Written apart from the engine's (`IntervalAccounting.attribution`) so that the two check each other:
        a sole holding workload takes the device's SM % over its share; on a shared device the
        processes split it, unless there are none to read or they cannot explain a busy device.
        """
        own = [other for other in covering if other.workload_uid == holding.workload_uid]
        share = sum(other.units for other in own) / device_units
        if len(own) == len(covering):
            return min(100.0, device_percent / share)
        if process_percent_by_pod is None:
            return device_percent
        holders = sum(process_percent_by_pod.get(pod, 0.0) for pod in {other.pod_uid for other in covering})
        if device_percent >= self.idle_threshold_percent and holders < self.idle_threshold_percent:
            return device_percent
        used = sum(process_percent_by_pod.get(pod, 0.0) for pod in {other.pod_uid for other in own})
        return min(100.0, used / share)

    def add_energy(self, workload_uid: str, joules: float) -> None:
        """Energy the holder drew (power x seconds x share), known whether or not anyone measured it."""
        self.sums.setdefault(workload_uid, _Sums()).energy += joules

    def finish(self, now: float) -> dict[str, TruthFigures]:
        """Figures as of `now`: allocated time after each device's latest sample is unmonitored."""
        result = {uid: sums.figures() for uid, sums in self.sums.items()}
        for uid, life in self._lives.items():
            figures = result[uid]
            figures.requested_gpus = life.requested_gpus
            figures.queued_seconds = life.queued_seconds(now)
            figures.wait_seconds = life.wait_seconds(now)
        for ledger in self._devices.values():
            for holding in ledger.holdings:
                seconds = min(now, holding.end) - max(ledger.last_sample, holding.start)
                if seconds > 0:
                    unit_seconds = holding.units * seconds
                    figures = result[holding.workload_uid]
                    figures.allocated_gpu_seconds += unit_seconds
                    figures.unmonitored_gpu_seconds += unit_seconds
        return result
