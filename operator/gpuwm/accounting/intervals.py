"""The accounting arithmetic (`IntervalAccounting`): a GPU's sample intervals applied to the stretches that hold it.

How time is cut (DESIGN §3): GPU g's sample at t_k covers (t_{k-1}, t_k]; the stretch before g's
first sample, and any interval longer than 3 x the poll interval, is unmonitored. A sample that
stands for a run of merged polls (`merged_seconds`, see gpuwm.feed.merge) is judged by the gap
before the run's first poll, t_k - merged - t_{k-1}. A pod holding devices is a set of *stretches*
(pod, device, units, start, end]: accounting is the overlap of stretches with sample intervals,
applied (sign 1) or taken back (sign -1) when late input changes an interval.
"""

from __future__ import annotations

import bisect
from itertools import pairwise

from gpuwm.accounting.state import INFINITY, EngineConfig, Gpu, Stretch, Workload


class IntervalAccounting:
    """The engine's GPU records and the arithmetic over them; `EngineCore` adds what feeds them."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.gpu_records: dict[str, Gpu] = {}
        # MIG parent uuid -> instances whose samples carry no energy counter: the parent's
        # own samples' energy is split among the workloads on those instances
        self.mig_children: dict[str, list[str]] = {}
        #: samples whose busy device the processes seen could not explain, so that some holder took the
        #: device's figure (DESIGN §3's attribution rule); counted once, when a sample is first accounted
        self.unattributed_samples = 0
        #: an interval longer than this is unmonitored (DESIGN §3: 3 x the poll interval)
        self.gap_seconds = config.gap_seconds
        #: a holder at or above this utilisation is active (DESIGN §3, `idleThresholdPercent`)
        self.threshold_percent = config.idle_threshold_percent

    # ------------------------------------------------------------ MIG energy

    def _register_mig_child(self, parent_uuid: str, child_uuid: str) -> None:
        children = self.mig_children.setdefault(parent_uuid, [])
        if child_uuid not in children:
            children.append(child_uuid)
            parent = self.gpu_records.get(parent_uuid)
            child = self.gpu_records.get(child_uuid)
            if parent is not None and child is not None and child.stretches:
                # intervals of the parent seen before we knew: account them now
                self._apply_parent_energy(parent, -INFINITY, INFINITY, list(child.stretches), 1.0)

    def _child_stretches(self, parent_uuid: str) -> list[Stretch]:
        children = (self.gpu_records.get(child_uuid) for child_uuid in self.mig_children.get(parent_uuid, ()))
        return [stretch for child in children if child is not None for stretch in child.stretches]

    def _energy_parent(self, gpu: Gpu) -> Gpu | None:
        """The MIG parent whose energy this instance's holders share, if its own samples carry none."""
        latest = gpu.latest
        if latest is None or latest.parent_uuid is None or gpu.uuid not in self.mig_children.get(latest.parent_uuid, ()):
            return None
        return self.gpu_records.get(latest.parent_uuid)

    def _apply_parent_energy(
        self, parent: Gpu, low: float, high: float, stretches: list[Stretch], sign: float
    ) -> None:
        """Energy of the parent's intervals in (low, high] to instance stretches, by units."""
        if not stretches:
            return
        times = parent.times
        energies = parent.energy
        index = max(1, bisect.bisect_right(times, low))
        while index < len(times):
            start = times[index - 1]
            if start >= high:
                break
            end = times[index]
            energy, previous = energies[index], energies[index - 1]
            if energy == energy and previous == previous:  # neither is NaN (not reported)
                rate = max(0.0, energy - previous) / (end - start)
                cut_start, cut_end = max(start, low), min(end, high)
                for stretch in stretches:
                    piece = min(cut_end, stretch.end) - max(cut_start, stretch.start)
                    if piece > 0:
                        stretch.workload.energy_joules += sign * rate * piece * stretch.units
            index += 1

    # ------------------------------------------------------------ arithmetic

    def _apply_range(self, gpu: Gpu, low: float, high: float, stretches: list[Stretch], sign: float) -> None:
        """Apply (sign=1) or take back (sign=-1) the intervals of `gpu` within (low, high]."""
        if not stretches:
            return
        times = gpu.times
        index = bisect.bisect_right(times, low)
        while index < len(times):
            start = times[index - 1] if index > 0 else -INFINITY
            if start >= high:
                break
            self._apply_interval(gpu, index, low, high, stretches, sign)
            index += 1

    def _monitored(self, gpu: Gpu, index: int) -> bool:
        """Whether g's sample `index` (>= 1) leaves its interval monitored: SM reported (not NaN), and at most
        the gap since the sample before; a sample of merged polls by the gap before its run's first poll,
        t - merged - previous t (`batch._apply_pieces` is the vectorised twin)."""
        sm, times = gpu.sm[index], gpu.times
        return sm == sm and times[index] - gpu.merged[index] - times[index - 1] <= self.gap_seconds

    @staticmethod
    def cuts(gpu: Gpu, start: float, end: float) -> list[float]:
        """Times strictly inside (start, end) where g's holders change: its stretches' starts and ends.

        Between two cuts every stretch of g either covers the whole piece or none of it, so a
        workload's share and whether it holds g alone are constant there (DESIGN §3 judges each
        stretch of time by who holds g in it). A piece taken back later is cut the same way.
        """
        stretches = gpu.stretches
        if len(stretches) < 2:
            return []
        cuts: set[float] = set()
        for stretch in stretches:
            if start < stretch.start < end:
                cuts.add(stretch.start)
            if start < stretch.end < end:
                cuts.add(stretch.end)
        return sorted(cuts)

    def attribution(self, gpu: Gpu, index: int, workload: Workload, start: float, end: float) -> tuple[float, bool]:
        """W's utilisation on g over (start, end] within interval `index`, and whether it was *unattributed*.

        DESIGN §3's attribution rule: activity is never lost to attribution. NVML's process list
        can be empty or unattributable while a GPU computes (an agent in another PID namespace,
        MIG instances whose processes are hidden, a lost cgroup mapping), so:
        - W holds g alone (no other workload's stretch covers the piece): g's device SM % over
          W's share of g (capped at 100), whatever the process list says;
        - g is shared: the SM % of W's pods' processes over W's share (capped at 100), unless
          there is no per-process data, or g is busy (SM >= threshold) while its holders'
          processes sum below the threshold: then every holder gets g's device SM %.
        W's share = W's units on g (its stretches covering the piece) / g's `device_units`.
        *Unattributed*: g was busy and its figure came from the device because the processes
        seen could not explain it (counted, and said on the workload's Sampling condition).
        (start, end] must lie between two of `_cuts`, so the holders are the same all along it.
        """
        sm = gpu.sm[index]
        if sm != sm:  # NaN: not reported (the interval is unmonitored; callers do not ask)
            return 0.0, False
        units = 0.0
        own: list[str] = []
        others: list[str] = []
        for stretch in gpu.stretches:
            if stretch.start < end and stretch.end > start:
                if stretch.workload is workload:
                    units += stretch.units
                    if stretch.pod_uid not in own:
                        own.append(stretch.pod_uid)
                elif stretch.pod_uid not in others:
                    others.append(stretch.pod_uid)
        if units <= 0:
            return 0.0, False
        share = units / gpu.device_units[index]
        pod_sm = gpu.pod_sm[index]
        threshold = self.threshold_percent
        busy = sm >= threshold
        if not others:
            explained = pod_sm is None or not busy or sum(pod_sm.get(uid, 0.0) for uid in own) >= threshold
            return min(100.0, sm / share), not explained
        if pod_sm is None:
            return sm, busy
        used = sum((pod_sm.get(uid, 0.0) for uid in own), 0.0)
        if busy and used + sum(pod_sm.get(uid, 0.0) for uid in others) < threshold:
            return sm, True
        return min(100.0, used / share), False

    def _account(
        self, stretch: Stretch, units: float, piece_start: float, piece_end: float, utilization: float,
        memory: float, sign: float,
    ) -> None:
        """Add (sign=1) or take back (sign=-1, `units` negative) one monitored piece of a stretch."""
        workload = stretch.workload
        unit_seconds = units * (piece_end - piece_start)
        if utilization >= self.threshold_percent:
            workload.active_gpu_seconds += unit_seconds
            if sign > 0 and piece_end > stretch.last_active:
                stretch.last_active = piece_end
        else:
            workload.idle_gpu_seconds += unit_seconds
        workload.life_units += unit_seconds
        workload.life_util += unit_seconds * utilization
        if memory != memory:  # NaN: memory not reported
            workload.windows.add(piece_start, piece_end, units, units * utilization, 0.0, 0.0)
        else:
            workload.life_mem_units += unit_seconds
            workload.life_mem += unit_seconds * memory
            workload.windows.add(piece_start, piece_end, units, units * utilization, units, units * memory)

    def _apply_interval(
        self, gpu: Gpu, index: int, low: float, high: float, stretches: list[Stretch], sign: float
    ) -> None:
        times = gpu.times
        end = times[index]
        energy: float | None = None
        if index == 0:
            start = -INFINITY
            monitored = False
        else:
            start = times[index - 1]
            monitored = self._monitored(gpu, index)
            joules, previous_joules = gpu.energy[index], gpu.energy[index - 1]
            if joules == joules and previous_joules == previous_joules:
                energy = max(0.0, joules - previous_joules) / (end - start)  # joules per second
        cut_start = start if start > low else low
        cut_end = end if end < high else high
        cuts = self.cuts(gpu, cut_start, cut_end) if monitored else []
        memory = gpu.memory[index]
        counted = False
        for stretch in stretches:
            piece_start = cut_start if cut_start > stretch.start else stretch.start
            piece_end = cut_end if cut_end < stretch.end else stretch.end
            if piece_end <= piece_start:
                continue
            workload = stretch.workload
            units = stretch.units * sign
            unit_seconds = units * (piece_end - piece_start)
            if energy is not None:
                workload.energy_joules += energy * unit_seconds
            if not monitored:
                workload.unmonitored_gpu_seconds += unit_seconds
                continue
            inner = [cut for cut in cuts if piece_start < cut < piece_end] if cuts else []
            for sub_start, sub_end in pairwise([piece_start, *inner, piece_end]):
                utilization, unattributed = self.attribution(gpu, index, workload, sub_start, sub_end)
                if unattributed:
                    workload.unattributed_gpu_seconds += units * (sub_end - sub_start)
                    counted = True
                self._account(stretch, units, sub_start, sub_end, utilization, memory, sign)
        if counted and sign > 0 and low == -INFINITY and high == INFINITY:  # a new point, not a re-accounting
            self.unattributed_samples += 1

    def _settle_last_active(self, gpu: Gpu, stretches: list[Stretch], low: float, high: float = INFINITY) -> None:
        """After taking back (low, high]: recompute last_active of stretches whose latest activity was in it."""
        for stretch in stretches:
            if stretch.last_active <= low or stretch.last_active > high:
                continue
            found = -INFINITY
            times = gpu.times
            index = bisect.bisect_left(times, min(low, stretch.end))
            index = min(index, len(times) - 1)
            while index >= 1:
                end = times[index]
                start = times[index - 1]
                if end <= stretch.start:
                    break
                if start < low and self._monitored(gpu, index):
                    piece_start, piece_end = max(start, stretch.start), min(end, low, stretch.end)
                    if piece_end > piece_start:
                        bounds = [piece_start, *self.cuts(gpu, piece_start, piece_end), piece_end]
                        for position in range(len(bounds) - 1, 0, -1):  # the latest active piece first
                            utilization = self.attribution(
                                gpu, index, stretch.workload, bounds[position - 1], bounds[position]
                            )[0]
                            if utilization >= self.threshold_percent:
                                found = bounds[position]
                                break
                        if found > -INFINITY:
                            break
                index -= 1
            if found == -INFINITY and gpu.pruned and times and times[0] > stretch.start:
                found = min(stretch.last_active, times[0])  # beyond the kept history: best known bound
            stretch.last_active = found
