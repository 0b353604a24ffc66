"""Sliding-window sums for the utilisation windows (1m, 5m, 1h).

A workload's monitored time is recorded as segments (start, end] with constant rates
per second: monitored units, units x utilisation, memory-known units, units x memory %.
A window sum is the segments clipped to the window, pro rata to the overlap (a sample's
figures cover its whole interval evenly, DESIGN §3), so it is exact while segments are
kept as recorded. Removal (a late event rewriting history) is a segment with negative
rates. To bound memory, segments older than the 1m/5m windows are folded into aligned
buckets once a workload holds many of them: exact for window edges that fall on bucket
boundaries, pro rata otherwise.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Sequence

from gpuwm.accounting.rawcolumns import RawDoubles, doubles_from_saved

_STRIDE = 6  # start, end, units, units*util, mem_units, mem_units*mem
_HORIZON_SECONDS = 3600.0
_FINE_BUCKET_SECONDS = 5.0
_COARSE_BUCKET_SECONDS = 60.0
_EXACT_SECONDS = 70.0  # segments newer than now-70s stay exact (1m window edge)
_FINE_SECONDS = 330.0  # segments newer than now-330s go to 5 s buckets (5m window edge)
_MIN_CAPACITY_SEGMENTS = 128
#: a workload folds again once this many segments came after its last fold (not in proportion to its folded
#: size, which would keep far more segments than the hour needs)
_FOLD_AFTER_SEGMENTS = 64
#: each workload's own fold point is 64 +- this many segments (`fold_after_of`, from its uid), so that workloads
#: started together (a job array) do not fold together: their segments, and the controller's RSS, would rise
#: and fall in waves, and one maintenance would fold all of them at once
_FOLD_SPREAD_SEGMENTS = 16
_NUMPY_FROM_SEGMENTS = 24  # below this a plain loop is faster than numpy's call overhead
_WORKLOADS_PER_PASS = 128  # workloads per `windows_of` pass over segments: bounds the pass's temporaries
#: workloads per fold pass: a fold cuts each old segment into the buckets it spans and holds about a dozen
#: piece-long arrays at once, several times a window pass's per workload; the maintenance's temporaries stayed
#: resident until the cycle's trim, so fewer workloads a pass lower the controller's peak
_WORKLOADS_PER_FOLD = 32
_TRIM_FROM_SEGMENTS = 8  # segments past the hour are dropped once this many lead (see `_trim`)


def fold_after_of(uid: str) -> int:
    """The segments after which a workload folds again (see `_FOLD_SPREAD_SEGMENTS`): the same for a uid in every
    process and after every restart, so a replay gives the same figures."""
    return _FOLD_AFTER_SEGMENTS - _FOLD_SPREAD_SEGMENTS + zlib.crc32(uid.encode()) % (2 * _FOLD_SPREAD_SEGMENTS + 1)


def _capacity_after(segments: int, fold_after: int = _FOLD_AFTER_SEGMENTS) -> int:
    """How many segments a workload may hold before its next fold, holding `segments` now (the first fold, at
    `_MIN_CAPACITY_SEGMENTS`, moves with the workload's own fold point too)."""
    return max(_MIN_CAPACITY_SEGMENTS + fold_after - _FOLD_AFTER_SEGMENTS, segments + fold_after)


def _continues(segments: Sequence[float], index: int, start: float, units: float, util_units: float,
               mem_units: float, mem_mem_units: float) -> bool:
    """Whether the segment at `index` (of flat `segments`) ends at `start` with these rates: then a segment
    from `start` on with them extends it instead of following it (`add`, `add_many`)."""
    return (segments[index + 1] == start and segments[index + 2] == units and segments[index + 3] == util_units
            and segments[index + 4] == mem_units and segments[index + 5] == mem_mem_units)


class WindowSums:
    """Segments of one workload's monitored allocation over the last hour."""

    __slots__ = ("_capacity", "_data", "_fold_after")

    def __init__(self, fold_after: int = _FOLD_AFTER_SEGMENTS) -> None:
        self._data = array("d")
        self._fold_after = fold_after  # see `fold_after_of`
        self._capacity = _capacity_after(0, fold_after)

    def __len__(self) -> int:
        return len(self._data) // _STRIDE

    def add(self, start: float, end: float, units: float, util_units: float, mem_units: float, mem_mem_units: float) -> None:
        """Add rates (per second) over (start, end]; negative rates remove. Adding to the last segment (the
        same interval on another device) may make its rates the one's before, and then the two become one."""
        if end <= start:
            return
        data = self._data
        size = len(data)
        if size:
            last = size - _STRIDE
            if data[last] == start and data[last + 1] == end:  # same interval on another device
                # from here the rates are the last segment's with these added (kept in locals, not read back)
                units = data[last + 2] + units
                util_units = data[last + 3] + util_units
                mem_units = data[last + 4] + mem_units
                mem_mem_units = data[last + 5] + mem_mem_units
                if size >= 2 * _STRIDE and _continues(data, last - _STRIDE, start, units, util_units, mem_units,
                                                      mem_mem_units):
                    data[last - _STRIDE + 1] = data[last + 1]
                    del data[last:]
                    return
                data[last + 2], data[last + 3], data[last + 4], data[last + 5] = units, util_units, mem_units, mem_mem_units
                return
            if _continues(data, last, start, units, util_units, mem_units, mem_mem_units):
                data[last + 1] = end
                return
        data.extend((start, end, units, util_units, mem_units, mem_mem_units))

    def add_many(
        self, starts: list[float], ends: list[float], units: list[float], util_units: list[float],
        mem_units: list[float], mem_mem_units: list[float],
    ) -> None:
        """`add` of each segment in order, to the bit, without a call per segment (the engine's batch intake).

        `add` only ever reads and changes the last two segments: those move to a Python list
        for the loop (its items are cheaper to read and update than the array's) and back after.
        """
        data = self._data
        keep = min(len(data), 2 * _STRIDE)
        tail = data[len(data) - keep :].tolist()
        del data[len(data) - keep :]
        for start, end, unit, util, mem_unit, mem in zip(
            starts, ends, units, util_units, mem_units, mem_mem_units, strict=True
        ):
            if end <= start:
                continue
            size = len(tail)
            if size:
                last = size - _STRIDE
                if tail[last] == start and tail[last + 1] == end:  # same interval on another device
                    tail[last + 2] += unit
                    tail[last + 3] += util
                    tail[last + 4] += mem_unit
                    tail[last + 5] += mem
                    if size >= 2 * _STRIDE and _continues(
                            tail, last - _STRIDE, start, tail[last + 2], tail[last + 3], tail[last + 4], tail[last + 5]):
                        tail[last - _STRIDE + 1] = tail[last + 1]  # what `add` does
                        del tail[last:]
                    continue
                if _continues(tail, last, start, unit, util, mem_unit, mem):
                    tail[last + 1] = end
                    continue
            tail += (start, end, unit, util, mem_unit, mem)
        data.extend(tail)

    def window(self, low: float, high: float) -> tuple[float, float, float, float]:
        """Integrals over (low, high]: unit-seconds, util-unit-seconds, memory unit-seconds, memory-unit-seconds."""
        data = self._data
        units = util = mem_units = mem = 0.0
        for offset in range(0, len(data), _STRIDE):
            start = data[offset]
            end = data[offset + 1]
            if end <= low or start >= high:
                continue
            overlap = (end if end < high else high) - (start if start > low else low)
            units += data[offset + 2] * overlap
            util += data[offset + 3] * overlap
            mem_units += data[offset + 4] * overlap
            mem += data[offset + 5] * overlap
        return units, util, mem_units, mem

    def windows(self, now: float) -> tuple[list[float], list[float], list[float]]:
        """The 1m, 5m and 1h windows ending at `now` (what a report needs); see `windows_of`."""
        data = self._data
        if len(data) >= _NUMPY_FROM_SEGMENTS * _STRIDE:
            return windows_of([self], now)[0]
        minute = [0.0, 0.0, 0.0, 0.0]
        five = [0.0, 0.0, 0.0, 0.0]
        hour = [0.0, 0.0, 0.0, 0.0]
        low_minute, low_five, low_hour = now - 60.0, now - 300.0, now - 3600.0
        for offset in range(0, len(data), _STRIDE):
            start = data[offset]
            end = data[offset + 1]
            if end <= low_hour or start >= now:
                continue
            if end > now:
                end = now
            rates = data[offset + 2 : offset + 6]
            overlap = end - (start if start > low_hour else low_hour)
            for index in range(4):
                hour[index] += rates[index] * overlap
            if end > low_five:
                overlap = end - (start if start > low_five else low_five)
                for index in range(4):
                    five[index] += rates[index] * overlap
                if end > low_minute:
                    overlap = end - (start if start > low_minute else low_minute)
                    for index in range(4):
                        minute[index] += rates[index] * overlap
        return minute, five, hour

    def _trim(self, now: float) -> None:
        """Drop the segments past the hour, once a few at the front have passed it (one 60 s bucket does
        each minute): a segment past the hour adds nothing to any window, and dropping them one
        maintenance at a time read every segment of every workload twice a minute."""
        data = self._data
        horizon = now - _HORIZON_SECONDS
        front = _STRIDE * (min(len(data) // _STRIDE, _TRIM_FROM_SEGMENTS) - 1)
        if data and data[front + 1] <= horizon:
            import numpy  # here, not at the top: see `windows_of`

            table = numpy.frombuffer(data, dtype=numpy.float64).reshape(-1, _STRIDE)
            self._data = array("d", table[table[:, 1] > horizon].tobytes())
            del table  # the old array's buffer is released with the view

    def to_list(self) -> list[float]:
        return self._data.tolist()

    def to_base64(self) -> str:
        """The segments as base64 of their little-endian doubles (what the engine state saves)."""
        return RawDoubles(self._data).base64()

    def to_raw(self) -> RawDoubles:
        """The segments for a state file that carries them as raw bytes (see gpuwm.accounting.rawcolumns)."""
        return RawDoubles(self._data)

    @property
    def capacity(self) -> int:
        """The segments held when the next fold is due: saved with them, so a restored workload folds where
        it would have (`from_base64`'s `capacity`)."""
        return self._capacity

    @classmethod
    def from_base64(cls, text: str | bytes | bytearray | memoryview, fold_after: int, capacity: int) -> WindowSums:
        """Inverse of `to_base64` (or raw bytes, of `to_raw`), with the saved `capacity`; raises ValueError
        when it is not whole segments or the capacity is not a number of segments."""
        values = doubles_from_saved(text)
        if len(values) % _STRIDE:
            raise ValueError(f"saved window segments hold {len(values)} numbers, not a multiple of {_STRIDE}")
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ValueError(f"saved windows capacity {capacity!r} is not a positive number of segments")
        sums = cls(fold_after)
        sums._data, sums._capacity = values, capacity
        return sums

    @classmethod
    def from_list(cls, values: list[float]) -> WindowSums:
        sums = cls()
        sums._data = array("d", values)
        sums._capacity = _capacity_after(len(sums))
        return sums


def windows_of(many: Sequence[WindowSums], now: float) -> list[tuple[list[float], list[float], list[float]]]:
    """`WindowSums.windows(now)` of many workloads in a few numpy passes, not many small numpy calls.

    Per workload and column the products are summed in segment order, starting from 0.0, as
    the plain loop in `windows` does, so the two agree to the bit whichever computes a
    workload's figures. The passes take `_WORKLOADS_PER_PASS` workloads each, which bounds the
    copies and temporaries alive at once.
    """
    result: list[tuple[list[float], list[float], list[float]]] = []
    for low in range(0, len(many), _WORKLOADS_PER_PASS):
        result += _windows_pass(many[low : low + _WORKLOADS_PER_PASS], now)
    return result


def _windows_pass(many: Sequence[WindowSums], now: float) -> list[tuple[list[float], list[float], list[float]]]:
    # imported here: the agent's process loads this module through the CLI and must stay small
    import numpy

    sizes = [len(sums._data) // _STRIDE for sums in many]
    count = len(sizes)
    if not any(sizes):
        return [([0.0] * 4, [0.0] * 4, [0.0] * 4) for _ in range(count)]
    table = numpy.frombuffer(b"".join([sums._data for sums in many]), dtype=numpy.float64).reshape(-1, _STRIDE)
    owner = numpy.repeat(numpy.arange(count), sizes)
    starts, ends, rates = table[:, 0], numpy.minimum(table[:, 1], now), table[:, 2:]
    columns = []
    for seconds in (60.0, 300.0, 3600.0):
        low = now - seconds
        window_owner, window_starts, window_ends, window_rates = owner, starts, ends, rates
        if seconds < 3600.0:
            # the segments that reach into the window only (a small part of an hour's): one that ends before it
            # adds rate x 0.0 (+-0.0), which changes no sum (each starts at +0.0), so every bit stays the same
            inside = numpy.flatnonzero(ends > low)
            window_owner, window_starts, window_ends, window_rates = (
                owner[inside], starts[inside], ends[inside], rates[inside])
        overlap = window_ends - numpy.maximum(window_starts, low)
        numpy.maximum(overlap, 0.0, out=overlap)
        columns.append([numpy.bincount(window_owner, weights=window_rates[:, index] * overlap, minlength=count).tolist()
                        for index in range(4)])
    minute, five, hour = columns
    return [
        ([column[row] for column in minute], [column[row] for column in five], [column[row] for column in hour])
        for row in range(count)
    ]


def maintain_all(many: Sequence[WindowSums], now: float) -> None:
    """Drop what is older than the longest window from each of many workloads' sums; those that hold too
    many segments are folded a pass over `_WORKLOADS_PER_FOLD` of them at a time, not a numpy call each."""
    due = []
    for sums in many:
        sums._trim(now)
        if len(sums) > sums._capacity:
            due.append(sums)
    for low in range(0, len(due), _WORKLOADS_PER_FOLD):  # bounded temporaries (see `_WORKLOADS_PER_FOLD`)
        _fold_all(due[low : low + _WORKLOADS_PER_FOLD], now)
    for sums in due:
        sums._capacity = _capacity_after(len(sums), sums._fold_after)


def _fold_all(many: Sequence[WindowSums], now: float) -> None:
    """Each one's segments older than 70 s into aligned buckets (5 s up to 330 s old, then 60 s), the recent kept.

    A segment adds `rate x (its part of the bucket) / bucket size` to each bucket it overlaps;
    a bucket's totals are summed in segment order from 0.0, so the result is the same to the
    bit as adding piece by piece (`numpy.bincount` adds in input order). Buckets come first,
    in time order, then the recent segments as they were.
    """
    import numpy

    sizes = [len(sums._data) // _STRIDE for sums in many]
    table = numpy.frombuffer(b"".join([sums._data for sums in many]), dtype=numpy.float64).reshape(-1, _STRIDE)
    owner = numpy.repeat(numpy.arange(len(many)), sizes)
    exact = table[:, 1] > now - _EXACT_SECONDS
    old, old_owner = table[~exact], owner[~exact]
    starts, ends, rates = old[:, 0], old[:, 1], old[:, 2:]
    size = numpy.where(ends > now - _FINE_SECONDS, _FINE_BUCKET_SECONDS, _COARSE_BUCKET_SECONDS)
    # bucket k holds [k x size, (k + 1) x size): a segment covers buckets first..last (all exact integers
    # times 5 or 60, so every bound below is the number the piece-by-piece loop computed)
    first = numpy.floor_divide(starts, size)
    below_end = numpy.floor_divide(ends, size)
    last = numpy.where(below_end * size >= ends, below_end - 1, below_end)
    counts = numpy.maximum(last - first + 1, 0).astype(numpy.int64)
    counts[~(ends > starts)] = 0
    total = int(counts.sum())
    segment = numpy.repeat(numpy.arange(len(old)), counts)
    step = numpy.arange(total) - numpy.repeat(numpy.cumsum(counts) - counts, counts)
    piece_size = size[segment]
    bucket_start = (first[segment] + step) * piece_size
    bucket_end = bucket_start + piece_size
    piece_start = numpy.where(step == 0, starts[segment], bucket_start)
    fraction = (numpy.minimum(ends[segment], bucket_end) - piece_start) / piece_size
    piece_owner = old_owner[segment]
    order = numpy.lexsort((bucket_end, bucket_start, piece_owner))
    new_bucket = numpy.ones(total, dtype=numpy.bool_)
    new_bucket[1:] = ((piece_owner[order][1:] != piece_owner[order][:-1])
                      | (bucket_start[order][1:] != bucket_start[order][:-1])
                      | (bucket_end[order][1:] != bucket_end[order][:-1]))
    bucket_of = numpy.empty(total, dtype=numpy.int64)
    bucket_of[order] = numpy.cumsum(new_bucket) - 1
    buckets = int(new_bucket.sum())
    folded = numpy.empty((buckets, _STRIDE))
    folded[:, 0] = bucket_start[order][new_bucket]
    folded[:, 1] = bucket_end[order][new_bucket]
    for column in range(4):  # pieces in their input order: each bucket's sum in segment order
        folded[:, 2 + column] = numpy.bincount(bucket_of, weights=rates[segment, column] * fraction, minlength=buckets)
    # each one's buckets, then its recent segments: stable by owner, buckets before the recent ones
    rows = numpy.concatenate((folded, table[exact]))
    rows_owner = numpy.concatenate((piece_owner[order][new_bucket], owner[exact]))
    rows = rows[numpy.argsort(rows_owner, kind="stable")]
    bounds = numpy.cumsum(numpy.bincount(rows_owner, minlength=len(many))).tolist()
    raw = rows.tobytes()
    low = 0
    for sums, high in zip(many, bounds, strict=True):
        sums._data = array("d", raw[low * _STRIDE * 8 : high * _STRIDE * 8])
        low = high
