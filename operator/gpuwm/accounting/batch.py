"""The vectorised path of `Engine.observe_samples`: a chunk of rows that only extend device histories.

The common case at 1 Hz: every device's rows in a pull come after its last point and in
time order, no MIG instance registers, no MIG parent shares its energy. Then the rows'
effects are independent of each other except for the sums they add to, and numpy computes
every (row, holder) piece at once with the arithmetic of `EngineCore._apply_appended`,
element for element. The sums go in with `numpy.bincount`, which adds its weights in input
order, each workload's current value first: the same additions in the same order as the
row-by-row path, so the figures are the same to the bit. Window segments go in per
workload in row order (`WindowSums.add_many`). Anything else returns False before changing
anything, and the chunk takes the row-by-row path.
"""

from __future__ import annotations

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


def observe_appending_chunk(
    core: EngineCore, batch: SampleBatch, arrays: BatchArrays, start: int, end: int,
    latest_rows: dict[str, tuple[Gpu, int]],
) -> bool:
    """Rows start..end-1 at once if each only extends its device's history; False (nothing done) otherwise."""
    import numpy

    count = end - start
    uid = arrays.row_uids[start:end]
    order = numpy.argsort(uid, kind="stable")  # chunk rows grouped by device, each device's in row order
    grouped_uid = uid[order]
    t = arrays.t[start:end][order]
    same = grouped_uid[1:] == grouped_uid[:-1]
    if (same & ~(t[1:] > t[:-1])).any():
        return False  # a device's rows out of order or twice: late rows
    cuts = numpy.flatnonzero(~same) + 1
    group_start = numpy.concatenate(([0], cuts))
    group_end = numpy.concatenate((cuts, [count]))
    records, children = core.gpu_records, core.mig_children
    device = arrays.device[start:end]
    energy = arrays.energy[start:end]
    for entry, parent in enumerate(batch.parent_uuids):  # a MIG instance to register: row by row
        registered = parent is None or arrays.uuids[arrays.entry_uids[entry]] in children.get(parent, ())
        if not registered and (numpy.isnan(energy) & (device == entry)).any():
            return False
    uuids = [arrays.uuids[u] for u in grouped_uid[group_start].tolist()]
    first_times = t[group_start].tolist()
    for uuid, first in zip(uuids, first_times, strict=True):
        if uuid in children:
            return False  # a MIG parent shares each interval's energy: row by row
        gpu = records.get(uuid)
        if gpu is not None and gpu.times and first <= gpu.times[-1]:
            return False
    last_times = t[group_end - 1].tolist()
    for uuid, first, last in zip(uuids, first_times, last_times, strict=True):
        gpu = records.get(uuid)
        if gpu is not None and len(gpu.stretches) > 1:  # holders that change inside an interval: cut row by row
            low = gpu.times[-1] if gpu.times else first
            if core.cuts(gpu, low, last):
                return False
    # --- from here on the chunk is taken: append every device's rows
    order_list = order.tolist()
    starts, ends = group_start.tolist(), group_end.tolist()
    nodes = batch.nodes
    device_list = device.tolist()
    for position in sorted(range(len(uuids)), key=lambda index: order_list[starts[index]]):
        if uuids[position] not in records:  # created in order of first appearance, as row by row
            records[uuids[position]] = Gpu(uuids[position], nodes[device_list[order_list[starts[position]]]])
    sm = arrays.sm[start:end][order]
    memory = arrays.memory[start:end][order]
    energy = energy[order]
    merged = None if arrays.merged is None else arrays.merged[start:end][order]
    merged_list = [0.0] * count if merged is None else merged.tolist()
    # each device's rows go into its history columns as raw doubles (array.frombytes of a slice of one
    # buffer per column): no Python float per value, the same bits
    t_bytes, sm_bytes, memory_bytes, energy_bytes = (
        numpy.ascontiguousarray(column, dtype=numpy.float64).data.cast("B") for column in (t, sm, memory, energy)
    )
    units_list = arrays.device_units[device[order]].tolist()
    pod_sm = batch.pod_sm
    pod_sm_list = [pod_sm[start + row] for row in order_list] if arrays.any_per_process else [None] * count
    gpus: list[Gpu] = []
    previous_t = numpy.full(len(uuids), -INFINITY)
    previous_energy = numpy.full(len(uuids), numpy.nan)
    bases = []
    for position, uuid in enumerate(uuids):
        gpu = records[uuid]
        low, high = starts[position], ends[position]
        gpu.node = nodes[device_list[order_list[high - 1]]]
        if gpu.times:
            previous_t[position] = gpu.times[-1]
            previous_energy[position] = gpu.energy[-1]
        bases.append(len(gpu.times))
        low_byte, high_byte = 8 * low, 8 * high
        gpu.times.frombytes(t_bytes[low_byte:high_byte])
        gpu.sm.frombytes(sm_bytes[low_byte:high_byte])
        gpu.memory.frombytes(memory_bytes[low_byte:high_byte])
        gpu.energy.frombytes(energy_bytes[low_byte:high_byte])
        gpu.pod_sm.extend(pod_sm_list[low:high])
        gpu.device_units.extend(units_list[low:high])
        gpu.merged.extend(merged_list[low:high])
        latest_rows[uuid] = (gpu, start + order_list[high - 1])
        gpus.append(gpu)
    _apply_pieces(core, gpus, bases, group_start, group_end, order, t, sm, memory, energy, previous_t,
                  previous_energy, arrays.per_process[start:end][order], merged,
                  numpy.asarray(units_list, dtype=numpy.float64))
    return True


def _apply_pieces(
    core: EngineCore, gpus: list[Gpu], bases: list[int], group_start: npt.NDArray[Any], group_end: npt.NDArray[Any],
    order: npt.NDArray[Any], t: npt.NDArray[Any], sm: npt.NDArray[Any], memory: npt.NDArray[Any],
    energy: npt.NDArray[Any], previous_t: npt.NDArray[Any], previous_energy: npt.NDArray[Any],
    per_process: npt.NDArray[Any], merged: npt.NDArray[Any] | None, device_units: npt.NDArray[Any],
) -> None:
    """`_apply_appended` of every appended row (grouped by device) on its holders, in row order."""
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
        return
    groups = numpy.array(combo_group, dtype=numpy.int64)
    sizes = (group_end - group_start)[groups]
    total = int(sizes.sum())
    pair_combo = numpy.repeat(numpy.arange(len(stretches)), sizes)
    offset = numpy.arange(total) - numpy.repeat(numpy.cumsum(sizes) - sizes, sizes)
    pair_position = group_start[groups][pair_combo] + offset  # grouped position of each pair's row
    # the row-by-row order: rows in order, a row's holders in the device's stretch order
    by_row = numpy.lexsort((pair_combo, order[pair_position]))
    pair_combo, pair_position = pair_combo[by_row], pair_position[by_row]
    # each row's interval (previous point, this point]; a device's first row continues its history
    start_t = numpy.empty_like(t)
    start_t[1:] = t[:-1]
    start_t[group_start] = previous_t
    start_energy = numpy.empty_like(energy)
    start_energy[1:] = energy[:-1]
    start_energy[group_start] = previous_energy
    has_previous = numpy.isfinite(start_t)
    with numpy.errstate(invalid="ignore", divide="ignore"):
        judged = t - start_t if merged is None else t - merged - start_t  # merged polls: the gap before the first
        monitored = has_previous & ~numpy.isnan(sm) & (judged <= core.gap_seconds)
        rate = numpy.maximum(0.0, energy - start_energy) / (t - start_t)  # NaN where either is not reported
    stretch_start = numpy.array([stretch.start for stretch in stretches])[pair_combo]
    stretch_end = numpy.array([stretch.end for stretch in stretches])[pair_combo]
    units = numpy.array([stretch.units for stretch in stretches])[pair_combo]
    low, high = start_t[pair_position], t[pair_position]
    piece_start = numpy.where(low > stretch_start, low, stretch_start)
    piece_end = numpy.where(high < stretch_end, high, stretch_end)
    valid = piece_end > piece_start
    unit_seconds = units * (piece_end - piece_start)
    pair_workload = numpy.array(combo_workload, dtype=numpy.int64)[pair_combo]
    pair_rate = rate[pair_position]
    pair_monitored = monitored[pair_position] & valid
    # DESIGN §3 (EngineCore.attribution): a device's sole stretch without per-process data takes the
    # device's SM % over its share, computed here for every such pair at once, as `attribution` does
    # it; any other pair (several holders, or per-process data) asks `attribution` itself
    group_sizes = numpy.array([len(gpu.stretches) for gpu in gpus], dtype=numpy.int64)
    pair_group = groups[pair_combo]
    with numpy.errstate(invalid="ignore", divide="ignore"):
        utilization = numpy.minimum(100.0, sm[pair_position] / (units / device_units[pair_position]))
    unattributed = numpy.zeros(len(pair_combo), dtype=numpy.bool_)
    asking = numpy.flatnonzero(pair_monitored & ((group_sizes[pair_group] > 1) | per_process[pair_position]))
    if len(asking):
        index = numpy.array(bases, dtype=numpy.int64)[pair_group] + (pair_position - group_start[pair_group])
        cached: tuple[Any, ...] | None = None
        value, flag = 0.0, False
        for pair, gpu_position, point, start, end in zip(
            asking.tolist(), pair_group[asking].tolist(), index[asking].tolist(),
            piece_start[asking].tolist(), piece_end[asking].tolist(), strict=True,
        ):
            stretch = stretches[int(pair_combo[pair])]
            key = (gpu_position, point, stretch.workload, start, end)
            if key != cached:
                cached = key
                value, flag = core.attribution(gpus[gpu_position], point, stretch.workload, start, end)
            utilization[pair] = value
            unattributed[pair] = flag
    active = pair_monitored & (utilization >= core.threshold_percent)
    idle = pair_monitored & ~(utilization >= core.threshold_percent)
    memory_known = pair_monitored & ~numpy.isnan(memory[pair_position])
    pair_memory = memory[pair_position]
    workloads = list(workload_ids)
    count = len(workloads)
    every = numpy.arange(count)

    def summed(attribute: str, mask: npt.NDArray[Any], values: npt.NDArray[Any]) -> None:
        if not mask.any():
            return
        initial = numpy.array([getattr(workload, attribute) for workload in workloads])
        sums = numpy.bincount(numpy.concatenate((every, pair_workload[mask])),
                              weights=numpy.concatenate((initial, values[mask])), minlength=count).tolist()
        for workload, value in zip(workloads, sums, strict=True):
            setattr(workload, attribute, value)

    with numpy.errstate(invalid="ignore"):
        summed("energy_joules", valid & ~numpy.isnan(pair_rate), pair_rate * unit_seconds)
        summed("unmonitored_gpu_seconds", valid & ~monitored[pair_position], unit_seconds)
        summed("unattributed_gpu_seconds", pair_monitored & unattributed, unit_seconds)
        summed("active_gpu_seconds", active, unit_seconds)
        summed("idle_gpu_seconds", idle, unit_seconds)
        summed("life_units", pair_monitored, unit_seconds)
        summed("life_util", pair_monitored, unit_seconds * utilization)
        summed("life_mem_units", memory_known, unit_seconds)
        summed("life_mem", memory_known, unit_seconds * pair_memory)
    if unattributed.any():
        core.unattributed_samples += len(numpy.unique(pair_position[pair_monitored & unattributed]))
    if active.any():
        latest_active = numpy.full(len(stretches), -INFINITY)
        numpy.maximum.at(latest_active, pair_combo[active], piece_end[active])
        for stretch, value in zip(stretches, latest_active.tolist(), strict=True):
            if value > stretch.last_active:
                stretch.last_active = value
    windowed = numpy.flatnonzero(pair_monitored)
    if not len(windowed):
        return
    by_workload = windowed[numpy.argsort(pair_workload[windowed], kind="stable")]
    segment_units = units[by_workload]
    known = memory_known[by_workload]
    rates = numpy.stack((
        segment_units, segment_units * utilization[by_workload], numpy.where(known, segment_units, 0.0),
        numpy.where(known, segment_units * pair_memory[by_workload], 0.0),
    ), axis=1)
    _add_segments(workloads, pair_workload[by_workload], piece_start[by_workload], piece_end[by_workload], rates)


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

    count = len(owners)
    new_group = numpy.ones(count, dtype=numpy.bool_)
    new_group[1:] = (owners[1:] != owners[:-1]) | (starts[1:] != starts[:-1]) | (ends[1:] != ends[:-1])
    group_first = numpy.flatnonzero(new_group)
    group_of = numpy.cumsum(new_group) - 1
    groups = len(group_first)
    sizes = numpy.diff(numpy.append(group_first, count))
    place = numpy.arange(count) - group_first[group_of]
    padded = numpy.zeros((groups, int(sizes.max()), 4))
    padded[group_of, place] = rates
    partial = numpy.cumsum(padded, axis=1)  # in order along each group: (a1 + a2) + a3 ...; + 0.0 after its end
    sums = partial[numpy.arange(groups), sizes - 1]
    owner = owners[group_first]
    start, end = starts[group_first], ends[group_first]
    first = numpy.ones(groups, dtype=numpy.bool_)
    first[1:] = owner[1:] != owner[:-1]
    # the segment before each group: the previous group's, or the workload's last one now (NaN: none)
    before_rates = numpy.empty((groups, 4))
    before_rates[1:] = sums[:-1]
    before_end = numpy.empty(groups)
    before_end[1:] = end[:-1]
    firsts = numpy.flatnonzero(first).tolist()
    piece_by_piece: set[int] = set()
    last_start = numpy.full(groups, numpy.nan)  # a workload's first group: where its last segment starts
    for group, workload_id in zip(firsts, owner[first].tolist(), strict=True):
        data = workloads[workload_id].windows._data
        if data:
            last = data[len(data) - 6 :].tolist()
            last_start[group], before_end[group], before_rates[group] = last[0], last[1], last[2:]
            if last[0] == start[group] and last[1] == end[group]:
                piece_by_piece.add(workload_id)
        else:
            before_end[group], before_rates[group] = numpy.nan, numpy.nan
    contiguous = before_end == start
    early = contiguous & (sizes >= 2) & (rates[group_first] == before_rates).all(axis=1)
    for step in range(1, int(sizes.max()) - 1):  # partial sums after 2..k-1 pieces
        early |= contiguous & (step < sizes - 1) & (partial[:, step] == before_rates).all(axis=1)
    piece_by_piece.update(owner[early].tolist())
    extends = contiguous & (sums == before_rates).all(axis=1)
    boundary = first | ~extends
    run_first = numpy.flatnonzero(boundary)
    # a group whose interval is that of the merged segment before it (from the run's start): `add` sums into it
    continues = first & extends  # a workload's first run going on from its last segment: that one's start
    run_start = numpy.where(continues, last_start, start)[run_first][numpy.cumsum(boundary) - 1]
    same = numpy.zeros(groups, dtype=numpy.bool_)
    same[1:] = ~first[1:] & (start[1:] == run_start[:-1]) & (end[1:] == end[:-1])
    piece_by_piece.update(owner[same].tolist())
    run_last = numpy.append(run_first[1:], groups) - 1
    runs = numpy.column_stack((start[run_first], end[run_last], sums[run_first]))
    run_flat = runs.ravel().tolist()  # six numbers a segment, as WindowSums keeps them
    run_owner = owner[run_first].tolist()
    run_extends = continues[run_first].tolist()
    cuts = numpy.flatnonzero(numpy.diff(owner[run_first]) != 0) + 1
    pieces = numpy.flatnonzero(numpy.diff(owners) != 0) + 1
    piece_ranges = zip(numpy.append(0, pieces).tolist(), numpy.append(pieces, count).tolist(), strict=True)
    for low, high in zip(numpy.append(0, cuts).tolist(), numpy.append(cuts, len(run_first)).tolist(), strict=True):
        workload_id = run_owner[low]
        piece_low, piece_high = next(piece_ranges)
        windows = workloads[workload_id].windows
        if workload_id in piece_by_piece:
            columns = (starts[piece_low:piece_high].tolist(), ends[piece_low:piece_high].tolist(),
                       *(rates[piece_low:piece_high, index].tolist() for index in range(4)))
            windows.add_many(*columns)
            continue
        data = windows._data
        if run_extends[low]:
            data[len(data) - 5] = run_flat[6 * low + 1]  # the last segment now ends where the run ends
            low += 1
        data.extend(run_flat[6 * low : 6 * high])
