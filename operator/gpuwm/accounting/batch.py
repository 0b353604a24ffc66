"""The vectorised path of `Engine.observe_samples`: a chunk of rows that only extend device histories.

A fast path beside the plain one (each row as `observe_sample` takes a sample), kept because polls that
arrive unmerged (`snapshotMerge: 0`, or devices whose activity changes from poll to poll) are 15 rows
per device and status interval, several times the controller's CPU for a pull at 1,000 nodes row by
row. `tests/unit/accounting/test_sample_batch.py` holds the two to the same figures, to the bit.

The common case at 1 Hz: every device's rows in a pull come after its last point and in
time order, no MIG instance registers, no MIG parent shares its energy. Then the rows'
effects are independent of each other except for the sums they add to, and numpy computes
every (row, holder) piece at once with the arithmetic of `IntervalAccounting._apply_interval`
on a new point, element for element. The sums go in with `numpy.bincount`, which adds its weights in input
order, each workload's current value first: the same additions in the same order as the
row-by-row path, so the figures are the same to the bit. Window segments go in per
workload in row order (`WindowSums.add_many`). Anything else returns False before changing
anything, and the chunk takes the row-by-row path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpuwm.accounting.state import INFINITY, Gpu, SampleBatch, Stretch, Workload

if TYPE_CHECKING:
    import numpy.typing as npt


class EngineCore(Protocol):
    """What this path reads and adds to of `gpuwm.accounting.core.EngineCore` (which imports this module)."""

    gpu_records: dict[str, Gpu]
    mig_children: dict[str, list[str]]
    unattributed_samples: int
    gap_seconds: float
    threshold_percent: float

    def cuts(self, gpu: Gpu, start: float, end: float) -> list[float]: ...

    def attribution(self, gpu: Gpu, index: int, workload: Workload, start: float, end: float) -> tuple[float, bool]: ...


class BatchArrays:
    """A batch's columns as numpy arrays (made once per batch, sliced per chunk)."""

    def __init__(self, batch: SampleBatch, entry_uids: list[int], uuids: list[str]) -> None:
        import numpy

        self.t = numpy.asarray(batch.t, dtype=numpy.float64)
        self.sm = numpy.asarray(batch.sm, dtype=numpy.float64)
        self.memory = numpy.asarray(batch.memory, dtype=numpy.float64)
        self.energy = numpy.asarray(batch.energy, dtype=numpy.float64)
        #: each row's merged seconds (gpuwm.feed.merge); None: no row is merged
        self.merged = None if batch.merged is None else numpy.asarray(batch.merged, dtype=numpy.float64)
        self.device = numpy.asarray(batch.device, dtype=numpy.int64)
        pod_sm = batch.pod_sm
        self.any_per_process = list(pod_sm).count(None) != len(pod_sm)
        self.per_process = (numpy.array([value is not None for value in pod_sm], dtype=numpy.bool_)
                            if self.any_per_process else numpy.zeros(len(pod_sm), dtype=numpy.bool_))
        self.device_units = numpy.asarray(batch.device_units, dtype=numpy.float64)
        self.entry_uids = entry_uids  # index into `uuids` (physical devices) of each batch entry
        self.row_uids = numpy.asarray(entry_uids, dtype=numpy.int64)[self.device]
        self.uuids = uuids

    def rising(self, clock: float) -> list[tuple[int, float]]:
        """(row, t) of the rows whose time is past every earlier row's and `clock`: the only ones that move the clock."""
        import numpy

        before = numpy.maximum.accumulate(numpy.concatenate(([clock], self.t)))[:-1]
        rows = numpy.flatnonzero(self.t > before)
        return list(zip(rows.tolist(), self.t[rows].tolist(), strict=True))


@dataclass
class _Grouped:
    """A chunk's rows grouped by device (each device's in row order): `order[i]` is the chunk row at grouped
    position i; device `k`'s rows are positions `starts[k]` to `ends[k]` - 1."""

    order: npt.NDArray[Any]
    t: npt.NDArray[Any]
    uuids: list[str]
    starts: npt.NDArray[Any]
    ends: npt.NDArray[Any]


def observe_appending_chunk(
    core: EngineCore, batch: SampleBatch, arrays: BatchArrays, start: int, end: int,
    latest_rows: dict[str, tuple[Gpu, int]],
) -> bool:
    """Rows start..end-1 at once if each only extends its device's history; False (nothing done) otherwise."""
    import numpy

    grouped = _appending(core, batch, arrays, start, end)
    if grouped is None:
        return False
    gpus, bases, previous_t, previous_energy = _append(core, batch, arrays, start, end, grouped, latest_rows)
    order = grouped.order
    units = arrays.device_units[arrays.device[start:end][order]]
    merged = None if arrays.merged is None else arrays.merged[start:end][order]
    _apply_pieces(core, gpus, bases, grouped.starts, grouped.ends, order, grouped.t, arrays.sm[start:end][order],
                  arrays.memory[start:end][order], arrays.energy[start:end][order], previous_t, previous_energy,
                  arrays.per_process[start:end][order], merged, numpy.asarray(units, dtype=numpy.float64))
    return True


def _appending(core: EngineCore, batch: SampleBatch, arrays: BatchArrays, start: int, end: int) -> _Grouped | None:
    """The chunk's rows grouped by device, where each row only extends its device's history; None where any row
    needs the row-by-row path: late or repeated rows, a MIG instance to register, a MIG parent's rows (it shares
    each interval's energy), a device whose holders change inside an interval."""
    import numpy

    uid = arrays.row_uids[start:end]
    order = numpy.argsort(uid, kind="stable")  # chunk rows grouped by device, each device's in row order
    grouped_uid = uid[order]
    t = arrays.t[start:end][order]
    same = grouped_uid[1:] == grouped_uid[:-1]
    if (same & ~(t[1:] > t[:-1])).any():
        return None  # a device's rows out of order or twice: late rows
    cuts = numpy.flatnonzero(~same) + 1
    starts = numpy.concatenate(([0], cuts))
    ends = numpy.concatenate((cuts, [end - start]))
    records, children = core.gpu_records, core.mig_children
    device = arrays.device[start:end]
    energy = arrays.energy[start:end]
    for entry, parent in enumerate(batch.parent_uuids):
        registered = parent is None or arrays.uuids[arrays.entry_uids[entry]] in children.get(parent, ())
        if not registered and (numpy.isnan(energy) & (device == entry)).any():
            return None
    uuids = [arrays.uuids[u] for u in grouped_uid[starts].tolist()]
    for uuid, first, last in zip(uuids, t[starts].tolist(), t[ends - 1].tolist(), strict=True):
        gpu = records.get(uuid)
        if uuid in children or (gpu is not None and gpu.times and first <= gpu.times[-1]):
            return None
        if gpu is not None and len(gpu.stretches) > 1 and core.cuts(gpu, gpu.times[-1] if gpu.times else first, last):
            return None
    return _Grouped(order, t, uuids, starts, ends)


def _append(
    core: EngineCore, batch: SampleBatch, arrays: BatchArrays, start: int, end: int, grouped: _Grouped,
    latest_rows: dict[str, tuple[Gpu, int]],
) -> tuple[list[Gpu], list[int], npt.NDArray[Any], npt.NDArray[Any]]:
    """Each device's rows appended to its history (records made in order of first appearance, as row by row):
    the devices, their histories' lengths before, and each one's point before its rows (time, energy)."""
    import numpy

    records, nodes = core.gpu_records, batch.nodes
    order_list, starts, ends = grouped.order.tolist(), grouped.starts.tolist(), grouped.ends.tolist()
    device_list = arrays.device[start:end].tolist()
    for position in sorted(range(len(grouped.uuids)), key=lambda index: order_list[starts[index]]):
        uuid = grouped.uuids[position]
        if uuid not in records:
            records[uuid] = Gpu(uuid, nodes[device_list[order_list[starts[position]]]])
    # each device's rows go into its history columns as raw doubles (array.frombytes of a slice of one
    # buffer per column): no Python float per value, the same bits
    columns = [arrays.t, arrays.sm, arrays.memory, arrays.energy]
    raw = [numpy.ascontiguousarray(column[start:end][grouped.order], dtype=numpy.float64).data.cast("B")
           for column in columns]
    units = arrays.device_units[arrays.device[start:end][grouped.order]].tolist()
    merged = [0.0] * (end - start) if arrays.merged is None else arrays.merged[start:end][grouped.order].tolist()
    pod_sm = [batch.pod_sm[start + row] for row in order_list] if arrays.any_per_process else [None] * (end - start)
    previous_t = numpy.full(len(grouped.uuids), -INFINITY)
    previous_energy = numpy.full(len(grouped.uuids), numpy.nan)
    gpus, bases = [], []
    for position, uuid in enumerate(grouped.uuids):
        gpu = records[uuid]
        low, high = starts[position], ends[position]
        gpu.node = nodes[device_list[order_list[high - 1]]]
        if gpu.times:
            previous_t[position], previous_energy[position] = gpu.times[-1], gpu.energy[-1]
        bases.append(len(gpu.times))
        for history, column in zip((gpu.times, gpu.sm, gpu.memory, gpu.energy), raw, strict=True):
            history.frombytes(column[8 * low:8 * high])
        gpu.pod_sm.extend(pod_sm[low:high])
        gpu.device_units.extend(units[low:high])
        gpu.merged.extend(merged[low:high])
        latest_rows[uuid] = (gpu, start + order_list[high - 1])
        gpus.append(gpu)
    return gpus, bases, previous_t, previous_energy


@dataclass
class _Pieces:
    """Every (appended row, holder of its device) pair of a chunk, in the row-by-row order (rows in order, a
    row's holders in the device's stretch order): the piece of the row's interval the holder held."""

    stretches: list[Stretch]
    workloads: list[Workload]
    stretch: npt.NDArray[Any]  # each pair's index into `stretches`
    position: npt.NDArray[Any]  # its row's grouped position
    group: npt.NDArray[Any]  # its device's index into the chunk's devices
    workload: npt.NDArray[Any]  # its holder's index into `workloads`
    units: npt.NDArray[Any]
    start: npt.NDArray[Any]
    end: npt.NDArray[Any]
    valid: npt.NDArray[Any]  # a piece of some length
    monitored: npt.NDArray[Any]  # its interval is monitored (a piece of no length is neither)
    unit_seconds: npt.NDArray[Any]
    rate: npt.NDArray[Any]  # its interval's energy, joules a second (NaN where not reported)


def _apply_pieces(
    core: EngineCore, gpus: list[Gpu], bases: list[int], group_start: npt.NDArray[Any], group_end: npt.NDArray[Any],
    order: npt.NDArray[Any], t: npt.NDArray[Any], sm: npt.NDArray[Any], memory: npt.NDArray[Any],
    energy: npt.NDArray[Any], previous_t: npt.NDArray[Any], previous_energy: npt.NDArray[Any],
    per_process: npt.NDArray[Any], merged: npt.NDArray[Any] | None, device_units: npt.NDArray[Any],
) -> None:
    """What `IntervalAccounting._apply_interval` does for each appended row (grouped by device) on its holders,
    in row order, element for element."""
    import numpy

    pieces = _pieces(core, gpus, group_start, group_end, order, t, sm, energy, previous_t, previous_energy, merged)
    if pieces is None:
        return
    index = numpy.array(bases, dtype=numpy.int64)[pieces.group] + (pieces.position - group_start[pieces.group])
    utilization, unattributed = _utilizations(core, gpus, pieces, index, sm, per_process, device_units)
    memory_known = pieces.monitored & ~numpy.isnan(memory[pieces.position])
    pair_memory = memory[pieces.position]
    active = pieces.monitored & (utilization >= core.threshold_percent)
    _add_sums(pieces, utilization, unattributed, active, memory_known, pair_memory)
    if unattributed.any():
        core.unattributed_samples += len(numpy.unique(pieces.position[pieces.monitored & unattributed]))
    if active.any():
        latest_active = numpy.full(len(pieces.stretches), -INFINITY)
        numpy.maximum.at(latest_active, pieces.stretch[active], pieces.end[active])
        for stretch, value in zip(pieces.stretches, latest_active.tolist(), strict=True):
            if value > stretch.last_active:
                stretch.last_active = value
    windowed = numpy.flatnonzero(pieces.monitored)
    if not len(windowed):
        return
    by_workload = windowed[numpy.argsort(pieces.workload[windowed], kind="stable")]
    segment_units = pieces.units[by_workload]
    known = memory_known[by_workload]
    rates = numpy.stack((
        segment_units, segment_units * utilization[by_workload], numpy.where(known, segment_units, 0.0),
        numpy.where(known, segment_units * pair_memory[by_workload], 0.0),
    ), axis=1)
    _add_segments(pieces.workloads, pieces.workload[by_workload], pieces.start[by_workload], pieces.end[by_workload],
                  rates)


def _pieces(
    core: EngineCore, gpus: list[Gpu], group_start: npt.NDArray[Any], group_end: npt.NDArray[Any],
    order: npt.NDArray[Any], t: npt.NDArray[Any], sm: npt.NDArray[Any], energy: npt.NDArray[Any],
    previous_t: npt.NDArray[Any], previous_energy: npt.NDArray[Any], merged: npt.NDArray[Any] | None,
) -> _Pieces | None:
    """The chunk's pairs of an appended row and a holder of its device; None where no device is held."""
    import numpy

    combo_group: list[int] = []
    stretches: list[Stretch] = []
    workload_ids: dict[Workload, int] = {}
    combo_workload: list[int] = []
    for position, gpu in enumerate(gpus):
        for stretch in gpu.stretches:
            combo_group.append(position)
            stretches.append(stretch)
            combo_workload.append(workload_ids.setdefault(stretch.workload, len(workload_ids)))
    if not stretches:
        return None
    groups = numpy.array(combo_group, dtype=numpy.int64)
    sizes = (group_end - group_start)[groups]
    pair_combo = numpy.repeat(numpy.arange(len(stretches)), sizes)
    offset = numpy.arange(int(sizes.sum())) - numpy.repeat(numpy.cumsum(sizes) - sizes, sizes)
    pair_position = group_start[groups][pair_combo] + offset  # grouped position of each pair's row
    by_row = numpy.lexsort((pair_combo, order[pair_position]))  # the row-by-row order
    pair_combo, pair_position = pair_combo[by_row], pair_position[by_row]
    # each row's interval (previous point, this point]; a device's first row continues its history
    start_t = numpy.empty_like(t)
    start_t[1:] = t[:-1]
    start_t[group_start] = previous_t
    start_energy = numpy.empty_like(energy)
    start_energy[1:] = energy[:-1]
    start_energy[group_start] = previous_energy
    with numpy.errstate(invalid="ignore", divide="ignore"):
        judged = t - start_t if merged is None else t - merged - start_t  # merged polls: the gap before the first
        monitored = numpy.isfinite(start_t) & ~numpy.isnan(sm) & (judged <= core.gap_seconds)
        rate = numpy.maximum(0.0, energy - start_energy) / (t - start_t)  # NaN where either is not reported
    stretch_start = numpy.array([stretch.start for stretch in stretches])[pair_combo]
    stretch_end = numpy.array([stretch.end for stretch in stretches])[pair_combo]
    units = numpy.array([stretch.units for stretch in stretches])[pair_combo]
    low, high = start_t[pair_position], t[pair_position]
    piece_start = numpy.where(low > stretch_start, low, stretch_start)
    piece_end = numpy.where(high < stretch_end, high, stretch_end)
    valid = piece_end > piece_start
    return _Pieces(
        stretches, list(workload_ids), pair_combo, pair_position, groups[pair_combo],
        numpy.array(combo_workload, dtype=numpy.int64)[pair_combo], units, piece_start, piece_end, valid,
        monitored[pair_position] & valid, units * (piece_end - piece_start), rate[pair_position],
    )


def _utilizations(
    core: EngineCore, gpus: list[Gpu], pieces: _Pieces, index: npt.NDArray[Any], sm: npt.NDArray[Any],
    per_process: npt.NDArray[Any], device_units: npt.NDArray[Any],
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Each pair's utilisation and whether it was unattributed (`IntervalAccounting.attribution`; `index`: each
    pair's point in its device's history).

    A device's sole stretch without per-process data takes the device's SM % over its share, computed here
    for every such pair at once as `attribution` computes it; any other pair asks `attribution` itself.
    """
    import numpy

    group_sizes = numpy.array([len(gpu.stretches) for gpu in gpus], dtype=numpy.int64)
    with numpy.errstate(invalid="ignore", divide="ignore"):
        utilization = numpy.minimum(100.0, sm[pieces.position] / (pieces.units / device_units[pieces.position]))
    unattributed = numpy.zeros(len(pieces.stretch), dtype=numpy.bool_)
    asking = numpy.flatnonzero(pieces.monitored & ((group_sizes[pieces.group] > 1) | per_process[pieces.position]))
    cached: tuple[Any, ...] | None = None
    value, flag = 0.0, False
    for pair, gpu_position, point, start, end in zip(
        asking.tolist(), pieces.group[asking].tolist(), index[asking].tolist(),
        pieces.start[asking].tolist(), pieces.end[asking].tolist(), strict=True,
    ):
        workload = pieces.stretches[int(pieces.stretch[pair])].workload
        key = (gpu_position, point, workload, start, end)
        if key != cached:
            cached = key
            value, flag = core.attribution(gpus[gpu_position], point, workload, start, end)
        utilization[pair] = value
        unattributed[pair] = flag
    return utilization, unattributed


def _add_sums(
    pieces: _Pieces, utilization: npt.NDArray[Any], unattributed: npt.NDArray[Any], active: npt.NDArray[Any],
    memory_known: npt.NDArray[Any], memory: npt.NDArray[Any],
) -> None:
    """The pairs' seconds, energy and utilisation added to their workloads' sums: per workload in pair order,
    after its current value (`numpy.bincount` adds its weights in input order), as row by row."""
    import numpy

    workloads = pieces.workloads
    count = len(workloads)
    every = numpy.arange(count)
    unit_seconds = pieces.unit_seconds

    def summed(attribute: str, mask: npt.NDArray[Any], values: npt.NDArray[Any]) -> None:
        if not mask.any():
            return
        initial = numpy.array([getattr(workload, attribute) for workload in workloads])
        sums = numpy.bincount(numpy.concatenate((every, pieces.workload[mask])),
                              weights=numpy.concatenate((initial, values[mask])), minlength=count).tolist()
        for workload, value in zip(workloads, sums, strict=True):
            setattr(workload, attribute, value)

    with numpy.errstate(invalid="ignore"):
        summed("energy_joules", pieces.valid & ~numpy.isnan(pieces.rate), pieces.rate * unit_seconds)
        summed("unmonitored_gpu_seconds", pieces.valid & ~pieces.monitored, unit_seconds)
        summed("unattributed_gpu_seconds", pieces.monitored & unattributed, unit_seconds)
        summed("active_gpu_seconds", active, unit_seconds)
        summed("idle_gpu_seconds", pieces.monitored & ~active, unit_seconds)
        summed("life_units", pieces.monitored, unit_seconds)
        summed("life_util", pieces.monitored, unit_seconds * utilization)
        summed("life_mem_units", memory_known, unit_seconds)
        summed("life_mem", memory_known, unit_seconds * memory)


def _add_segments(
    workloads: list[Workload], owners: npt.NDArray[Any], starts: npt.NDArray[Any], ends: npt.NDArray[Any],
    rates: npt.NDArray[Any],
) -> None:
    """`windows.add` of each piece, per workload in order, with the segments `add` would leave, to the bit.

    Within a workload, pieces of one interval in a row (one per device) are a group: `add` sums
    their rates into one segment (in order: a cumsum along the group), and a group continues the
    segment before it when it is contiguous with equal rates. That holds unless a group's first
    piece, or a partial sum, equals the rates of the segment before it (then `add` would extend
    or merge early), or a group's interval is that of the merged segment before it: such
    workloads, and one whose first piece has the interval of its last segment, go piece by
    piece through `WindowSums.add_many`.
    """
    import numpy

    groups = _SegmentGroups(workloads, owners, starts, ends, rates)
    boundary = groups.first | ~groups.extends
    run_first = numpy.flatnonzero(boundary)
    run_last = numpy.append(run_first[1:], len(groups.owner)) - 1
    runs = numpy.column_stack((groups.start[run_first], groups.end[run_last], groups.sums[run_first]))
    run_flat = runs.ravel().tolist()  # six numbers a segment, as WindowSums keeps them
    run_owner = groups.owner[run_first].tolist()
    run_extends = groups.continues[run_first].tolist()
    cuts = numpy.flatnonzero(numpy.diff(groups.owner[run_first]) != 0) + 1
    pieces = numpy.flatnonzero(numpy.diff(owners) != 0) + 1
    piece_ranges = zip(numpy.append(0, pieces).tolist(), numpy.append(pieces, len(owners)).tolist(), strict=True)
    for low, high in zip(numpy.append(0, cuts).tolist(), numpy.append(cuts, len(run_first)).tolist(), strict=True):
        workload_id = run_owner[low]
        piece_low, piece_high = next(piece_ranges)
        windows = workloads[workload_id].windows
        if workload_id in groups.piece_by_piece:
            columns = (starts[piece_low:piece_high].tolist(), ends[piece_low:piece_high].tolist(),
                       *(rates[piece_low:piece_high, index].tolist() for index in range(4)))
            windows.add_many(*columns)
            continue
        data = windows._data
        if run_extends[low]:
            data[len(data) - 5] = run_flat[6 * low + 1]  # the last segment now ends where the run ends
            low += 1
        data.extend(run_flat[6 * low : 6 * high])


class _SegmentGroups:
    """The pieces' groups (one interval of one workload, a piece per device) and how each meets the segment
    before it (see `_add_segments`)."""

    def __init__(
        self, workloads: list[Workload], owners: npt.NDArray[Any], starts: npt.NDArray[Any], ends: npt.NDArray[Any],
        rates: npt.NDArray[Any],
    ) -> None:
        import numpy

        count = len(owners)
        new_group = numpy.ones(count, dtype=numpy.bool_)
        new_group[1:] = (owners[1:] != owners[:-1]) | (starts[1:] != starts[:-1]) | (ends[1:] != ends[:-1])
        group_first = numpy.flatnonzero(new_group)
        group_of = numpy.cumsum(new_group) - 1
        groups = len(group_first)
        self.sizes = numpy.diff(numpy.append(group_first, count))
        padded = numpy.zeros((groups, int(self.sizes.max()), 4))
        padded[group_of, numpy.arange(count) - group_first[group_of]] = rates
        self.partial = numpy.cumsum(padded, axis=1)  # in order along each group: (a1 + a2) + a3 ...; + 0.0 after
        self.sums = self.partial[numpy.arange(groups), self.sizes - 1]
        self.owner = owners[group_first]
        self.start, self.end = starts[group_first], ends[group_first]
        self.first = numpy.ones(groups, dtype=numpy.bool_)
        self.first[1:] = self.owner[1:] != self.owner[:-1]
        #: workloads that go piece by piece (`WindowSums.add_many`)
        self.piece_by_piece: set[int] = set()
        before_rates, before_end, last_start = self._before(workloads)
        contiguous = before_end == self.start
        self._early(contiguous, rates[group_first], before_rates)
        self.extends = contiguous & (self.sums == before_rates).all(axis=1)
        # a group whose interval is that of the merged segment before it (from the run's start): `add` sums into it
        self.continues = self.first & self.extends  # a workload's first run going on from its last segment
        boundary = self.first | ~self.extends
        run_first = numpy.flatnonzero(boundary)
        run_start = numpy.where(self.continues, last_start, self.start)[run_first][numpy.cumsum(boundary) - 1]
        same = numpy.zeros(groups, dtype=numpy.bool_)
        same[1:] = ~self.first[1:] & (self.start[1:] == run_start[:-1]) & (self.end[1:] == self.end[:-1])
        self.piece_by_piece.update(self.owner[same].tolist())

    def _before(self, workloads: list[Workload]) -> tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]]:
        """The segment before each group (the previous group's, or its workload's last one now; NaN: none):
        its rates, its end, and where a workload's last segment starts."""
        import numpy

        groups = len(self.owner)
        before_rates = numpy.empty((groups, 4))
        before_rates[1:] = self.sums[:-1]
        before_end = numpy.empty(groups)
        before_end[1:] = self.end[:-1]
        last_start = numpy.full(groups, numpy.nan)
        for group, workload_id in zip(numpy.flatnonzero(self.first).tolist(), self.owner[self.first].tolist(),
                                      strict=True):
            data = workloads[workload_id].windows._data
            if data:
                last = data[len(data) - 6 :].tolist()
                last_start[group], before_end[group], before_rates[group] = last[0], last[1], last[2:]
                if last[0] == self.start[group] and last[1] == self.end[group]:
                    self.piece_by_piece.add(workload_id)
            else:
                before_end[group], before_rates[group] = numpy.nan, numpy.nan
        return before_rates, before_end, last_start

    def _early(self, contiguous: npt.NDArray[Any], first_rates: npt.NDArray[Any], before: npt.NDArray[Any]) -> None:
        """Workloads where a group's first piece, or a partial sum, equals the segment before: `add` would
        extend or merge before the group's end."""
        early = contiguous & (self.sizes >= 2) & (first_rates == before).all(axis=1)
        for step in range(1, int(self.sizes.max()) - 1):  # partial sums after 2..k-1 pieces
            early |= contiguous & (step < self.sizes - 1) & (self.partial[:, step] == before).all(axis=1)
        self.piece_by_piece.update(self.owner[early].tolist())
