"""What the simulator knows exactly: the GPU-seconds it generated per workload, by kind.

The simulator tells this ledger every allocation it makes and every sample it emits,
with the true utilisation of each holder (not the figure the engine derives from the
sample), so comparing the engine's figures with it checks the engine's arithmetic and
the samples' encoding at once. The interval rules are DESIGN §3's: a sample covers
(previous sample, t]; an interval longer than 3 x the poll interval, before a device's
first sample, after its latest sample, or with no utilisation (a lost GPU) is unmonitored.
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

    def track(self, workload_uid: str) -> None:
        """A workload exists (from its first pod event), with or without GPUs yet."""
        self.sums.setdefault(workload_uid, _Sums())

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

    def sample(self, sample_uuid: str, t: float, utilization_by_pod: dict[str, float] | None) -> None:
        """A sample of the device at t; `utilization_by_pod` is each holder's true utilisation,
        None when the device could not be read (a lost GPU)."""
        ledger = self._devices.setdefault(sample_uuid, _DeviceLedger())
        start = ledger.last_sample
        ledger.last_sample = t
        monitored = utilization_by_pod is not None and t - start <= self.gap_seconds
        kept: list[_Holding] = []
        for holding in ledger.holdings:
            seconds = min(t, holding.end) - max(start, holding.start)
            if seconds > 0:
                unit_seconds = holding.units * seconds
                sums = self.sums[holding.workload_uid]
                sums.allocated += unit_seconds
                if monitored and utilization_by_pod is not None:
                    utilization = utilization_by_pod.get(holding.pod_uid, 0.0)
                    sums.utilization += unit_seconds * utilization
                    if utilization >= self.idle_threshold_percent:
                        sums.active += unit_seconds
                    else:
                        sums.idle += unit_seconds
                else:
                    sums.unmonitored += unit_seconds
            if holding.end > t:
                kept.append(holding)
        ledger.holdings = kept

    def add_energy(self, workload_uid: str, joules: float) -> None:
        """Energy the holder drew (power x seconds x share), known whether or not anyone measured it."""
        sums = self.sums.get(workload_uid)
        if sums is None:
            sums = self.sums[workload_uid] = _Sums()
        sums.energy += joules

    def finish(self, now: float) -> dict[str, TruthFigures]:
        """Figures as of `now`: allocated time after each device's latest sample is unmonitored."""
        result = {uid: sums.figures() for uid, sums in self.sums.items()}
        for ledger in self._devices.values():
            for holding in ledger.holdings:
                seconds = min(now, holding.end) - max(ledger.last_sample, holding.start)
                if seconds > 0:
                    unit_seconds = holding.units * seconds
                    figures = result[holding.workload_uid]
                    figures.allocated_gpu_seconds += unit_seconds
                    figures.unmonitored_gpu_seconds += unit_seconds
        return result
