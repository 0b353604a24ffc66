"""How the embedded store packs metric values into bytes: fixed per-metric resolution, then compression.

Values are kept as integers in a fixed unit per metric (`RESOLUTION`): 0.000001 % for
percentages, 1 byte, 1 mW, 1 mJ, 0.001 degC, 0.001 MHz, 1 byte/s, 1 millicore, 1e-6 GPU
units, 1 ms. That is NVML's own resolution (mW, mJ, MiB, whole percent and degrees) or finer,
and far below what any figure shows; a value with at most that many decimals (2.1 cores,
12.345 W, 37.5 %) reads back as exactly the same float, since decoding divides by a power of
ten. A missing value (None) is kept as missing, never as 0. Roll-ups (the coarser tiers) keep
their means, and the gauges' min and max (`EXTREMES`), at declared coarser resolutions
(`COLUMN_QUANTUM`, `COLUMN_DIGITS`), each value within half its quantum of the exact one.

Two encodings:
- a head block: one interval, `BLOCK` series slots x all metrics, int64 with `MISSING` for
  absent values, byte-planes compressed with zlib level 1 (written every interval: cheap);
- a chunk: one series, all metrics, `n` points on a fixed grid. Per metric: missing points
  are filled with the previous value and flagged in a presence bitmap; first differences
  (second differences for cumulative counters), divided by their greatest common divisor,
  zigzagged, split into byte planes of which only the non-zero ones are kept, then zlib
  (level 6 for the finest tier, 9 for roll-ups: any level decodes the same way).
  A constant metric costs a few bytes per chunk.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gpuwm.store.base import METRICS, Rollup

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: series per head block: the head row of one interval holds this many series slots
BLOCK = 64
#: an absent value in a quantized array
MISSING = np.iinfo(np.int64).min
METRIC_COUNT = len(METRICS)

#: integer units per metric unit: the stored resolution is 1 / RESOLUTION of the metric's unit
_RESOLUTION_BY_UNIT = {
    "percent": 1_000_000.0,
    "bytes": 1.0,
    "watts": 1_000.0,
    "joules": 1_000.0,
    "celsius": 1_000.0,
    "MHz": 1_000.0,
    "bytes/s": 1.0,
    "GPU units": 1_000_000.0,
    "seconds": 1_000.0,
    "cores": 1_000.0,
    "GPU-seconds": 1_000.0,
}
RESOLUTION: FloatArray = np.array([_RESOLUTION_BY_UNIT[metric.unit] for metric in METRICS], dtype=np.float64)
#: the declared resolution of the roll-ups' means (every tier but the finest), in stored units:
#: (absolute quantum, significant digits; 0 digits = the absolute quantum only). A 5-minute mean's
#: last digits are the simulator's or the GPU's noise, which compresses worst of all. Energy (a
#: counter) at 100 J is a third of a watt over 5 minutes; a rate's noise grows with it, hence digits.
#: A mean is rounded once, to the nearest multiple of its quantum (ties to even, numpy's rint).
_ROLLUP_RESOLUTION_BY_UNIT: dict[str, tuple[int, int]] = {
    "percent": (100_000, 0),
    "bytes": (2**20, 0),  # 1 MiB: NVML's own unit for device memory
    "watts": (100, 0),
    "joules": (100_000, 0),
    "celsius": (100, 0),
    "MHz": (1_000, 0),
    "bytes/s": (1, 3),
    "GPU units": (15_625, 0),
    "seconds": (1_000, 0),
    "cores": (10, 0),
    "GPU-seconds": (1, 0),  # the engine's counters: every tier keeps them exactly (`Rollup.LAST`)
}
ROLLUP_QUANTUM: IntArray = np.array(
    [_ROLLUP_RESOLUTION_BY_UNIT[metric.unit][0] for metric in METRICS], dtype=np.int64
)
ROLLUP_DIGITS: IntArray = np.array([_ROLLUP_RESOLUTION_BY_UNIT[metric.unit][1] for metric in METRICS], dtype=np.int64)
#: zlib level of the roll-up tiers' whole chunks, each written once per coarse span: fewer bytes than 6 on
#: the 5 min tier (same format); the pieces before them go at FINE_ZLIB_LEVEL (see `ChunkWriter._store`)
ROLLUP_ZLIB_LEVEL = 9
#: zlib level of the finest tier's chunks and of the roll-ups' pieces (compaction of every series each hour:
#: CPU matters): less CPU than level 6 for slightly bigger chunks (bench/README.md, "The store's choices")
FINE_ZLIB_LEVEL = 3
#: metrics kept as second differences: counters and durations that grow by about the same each step
_SECOND_ORDER_METRIC: BoolArray = np.array([metric.rollup in (Rollup.MAX, Rollup.LAST) for metric in METRICS],
                                           dtype=np.bool_)
#: the engine's cumulative figures: a roll-up keeps each bucket's last value as it is, never rounded, so the
#: difference of two buckets' values is the exact sum of the intervals between them
LAST: BoolArray = np.array([metric.rollup is Rollup.LAST for metric in METRICS], dtype=np.bool_)
#: a chunk holds one *part* of a series' metrics (schema 4). Part 0 (`WHOLE`): every metric, what
#: schema 3 wrote. The others split the metrics by what series share: a one-GPU pod's device figures
#: are its GPU series', its workload's and its workload_node's; its pod stats its workload's. Kept
#: apart, identical parts are stored once (schema.py `payloads`) where whole chunks differed by a
#: column (idle seconds, pod stats), a large share of the chunk bytes (bench/api.py's size run). Never
#: reorder or renumber: the file names parts by number.
WHOLE = 0
#: the metrics schemas 3 and 4 kept (the first ones of METRICS): a whole chunk of schema 3 holds these,
#: and so does a head row written before schema 5
SCHEMA4_METRIC_COUNT = 19
#: the metrics schema 5 kept: a head row written before schema 6 holds these
SCHEMA5_METRIC_COUNT = 28
PARTS: dict[int, npt.NDArray[np.intp]] = {
    WHOLE: np.arange(SCHEMA4_METRIC_COUNT, dtype=np.intp),
    # 1: the device figures: utilisation, memory, power, temperature, clocks, PCIe
    1: np.array([0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11], dtype=np.intp),
    # 2: energy (a device's counter, a workload's or project's own total: rarely the same points)
    2: np.array([6], dtype=np.intp),
    # 3: GPU units held and idle seconds
    3: np.array([12, 13], dtype=np.intp),
    # 4: the pods' own stats (CPU, memory, network, ephemeral storage)
    4: np.array([14, 15, 16, 17, 18], dtype=np.intp),
    # 5 (schema 5): the pods' requests, limits, use of them, and disk rates
    5: np.arange(SCHEMA4_METRIC_COUNT, SCHEMA5_METRIC_COUNT, dtype=np.intp),
    # 6 (schema 6): the engine's cumulative figures (workload, project and cluster series only)
    6: np.arange(SCHEMA5_METRIC_COUNT, METRIC_COUNT, dtype=np.intp),
}
#: the parts schema 6 writes, each metric in exactly one of them
SPLIT_PARTS: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
#: the gauges whose roll-ups keep each bucket's min and max (`Metric.rollup_extremes`): a roll-up keeps every
#: bucket's mean in the metric's own column and, from schema 7, these gauges' min and max in columns of their own
#: after the metrics (`ROLLUP_COLUMN_COUNT`). The other gauges keep their mean only, and the finest tier
#: neither: there a point's min and max are the point
EXTREMES: npt.NDArray[np.intp] = np.array([index for index, metric in enumerate(METRICS) if metric.rollup_extremes],
                                          dtype=np.intp)
#: the columns of a roll-up: the metrics, then each EXTREMES metric's minimum (in its order), then its maximum
ROLLUP_COLUMN_COUNT = METRIC_COUNT + 2 * len(EXTREMES)
#: the metric each column of a roll-up holds a figure of (its unit, resolution and quantum are the metric's)
COLUMN_METRIC: npt.NDArray[np.intp] = np.concatenate([np.arange(METRIC_COUNT, dtype=np.intp), EXTREMES, EXTREMES])


#: each EXTREMES metric's position in it
_EXTREMES_POSITION: dict[int, int] = {int(metric): position for position, metric in enumerate(EXTREMES)}


def minimum_column(metric: int) -> int:
    """The roll-up column of a bucket's minimum of a metric that keeps extremes (`EXTREMES`)."""
    return METRIC_COUNT + _EXTREMES_POSITION[int(metric)]


def maximum_column(metric: int) -> int:
    """The roll-up column of a bucket's maximum of a metric that keeps extremes (`EXTREMES`)."""
    return METRIC_COUNT + len(EXTREMES) + _EXTREMES_POSITION[int(metric)]


def _extremes_of(part: int) -> npt.NDArray[np.intp]:
    """The columns of the minima, then the maxima, of the metrics of `part` that keep extremes."""
    kept = [int(metric) for metric in PARTS[part] if metric in EXTREMES]
    return np.array([minimum_column(metric) for metric in kept] + [maximum_column(metric) for metric in kept],
                    dtype=np.intp)


#: schema 7: the roll-ups' extremes as parts of their own, one beside each part that holds metrics keeping them
#: (of 1: device figures, 3: units, 4: pod stats, 5: requests and limits), so that series sharing a part's
#: means (a one-GPU pod's device figures) share its extremes' bytes too; a part with no such metric has none
EXTREME_PARTS: dict[int, int] = {extremes: means for extremes, means in {7: 1, 8: 3, 9: 4, 10: 5}.items()
                                 if np.isin(PARTS[means], EXTREMES).any()}
PARTS.update({part: _extremes_of(means) for part, means in EXTREME_PARTS.items()})
#: columns kept as second differences (a gauge's extremes never are)
_SECOND_ORDER: BoolArray = _SECOND_ORDER_METRIC[COLUMN_METRIC]
#: the declared resolution of a bucket's min and max, as `_ROLLUP_RESOLUTION_BY_UNIT` declares the
#: mean's, ten times coarser: a bucket's extreme is one noisy sample where its mean averages the noise out, so
#: at the mean's resolution the extremes cost more bytes than the means themselves (bench/README.md, "The
#: store's choices"); they say how far a spike or dip went, to 1 %, 1 W, 64 MiB, 2 significant digits of a rate
_EXTREME_RESOLUTION_BY_UNIT: dict[str, tuple[int, int]] = {
    "percent": (1_000_000, 0),
    "bytes": (2**26, 0),
    "watts": (1_000, 0),
    "joules": (100_000, 0),  # no gauge: energy is a counter
    "celsius": (1_000, 0),
    "MHz": (10_000, 0),
    "bytes/s": (1, 2),
    "GPU units": (15_625, 0),
    "seconds": (1_000, 0),  # no gauge: idle seconds are a peak
    "cores": (100, 0),
    "GPU-seconds": (1, 0),  # no gauge: the engine's counters
}
#: the absolute quantum and significant digits of each roll-up column: the metrics', then the extremes'
COLUMN_QUANTUM: IntArray = np.concatenate(
    [ROLLUP_QUANTUM, np.array([_EXTREME_RESOLUTION_BY_UNIT[METRICS[metric].unit][0] for metric in EXTREMES] * 2,
                              dtype=np.int64)])
COLUMN_DIGITS: IntArray = np.concatenate(
    [ROLLUP_DIGITS, np.array([_EXTREME_RESOLUTION_BY_UNIT[METRICS[metric].unit][1] for metric in EXTREMES] * 2,
                             dtype=np.int64)])
#: the parts a roll-up's chunk is written in: SPLIT_PARTS, then the extremes
ROLLUP_PARTS: tuple[int, ...] = SPLIT_PARTS + tuple(EXTREME_PARTS)
#: the smallest value that reaches byte plane k (plane 0: any value above 0)
_PLANE_FLOOR = np.array([1] + [256**k for k in range(1, 8)], dtype=np.uint64)
#: the largest magnitude a quantized value may have (leaves room for differences without overflow)
_LIMIT = float(2**58)


def quantize(values: FloatArray) -> IntArray:
    """Float values (NaN = missing) of shape [..., METRIC_COUNT] to integers in each metric's resolution."""
    scaled = np.rint(values * RESOLUTION)
    missing = ~np.isfinite(scaled)
    np.clip(scaled, -_LIMIT, _LIMIT, out=scaled)
    scaled[missing] = 0.0
    result = scaled.astype(np.int64)
    result[missing] = MISSING
    return result


def dequantize(values: IntArray, metrics: npt.NDArray[np.intp] | None = None) -> FloatArray:
    """Integers (last axis: metrics, or the `metrics` given) back to floats; missing -> NaN."""
    resolution = RESOLUTION if metrics is None else RESOLUTION[metrics]
    result = values.astype(np.float64) / resolution
    result[values == MISSING] = np.nan
    return result


# -- head blocks ---------------------------------------------------------------------------------


def encode_head(block: IntArray) -> bytes:
    """One interval of one block: [BLOCK, METRIC_COUNT] int64 -> compressed byte-planes.

    (Dropping zero planes as chunks do measured slower here and no smaller: a block mixes byte
    counts and energy counters that need 5-6 planes with percentages.)"""
    planes = np.ascontiguousarray(block).view(np.uint8).reshape(-1, 8).T
    return zlib.compress(planes.tobytes(), 1)


def decode_head(data: bytes) -> IntArray:
    """The inverse of `encode_head`: [BLOCK, METRIC_COUNT] int64. A row written with fewer metrics
    (before schema 5) has the later ones MISSING: its width is in its length."""
    planes = np.frombuffer(zlib.decompress(data), dtype=np.uint8).reshape(8, -1)
    block = np.ascontiguousarray(planes.T).view(np.int64).reshape(BLOCK, -1)
    if block.shape[1] == METRIC_COUNT:
        return block
    wider = np.full((BLOCK, METRIC_COUNT), MISSING, dtype=np.int64)
    wider[:, : block.shape[1]] = block
    return wider


# -- chunks --------------------------------------------------------------------------------------


def _divide_out(deltas: IntArray) -> tuple[IntArray, IntArray]:
    """Differences divided by each row's greatest common divisor (a value with 0.01 % steps kept at
    1e-6 % costs no more than at 0.01 %). The gcd of the first points decides most rows at once: where
    it is 1, so is the row's. Elsewhere the whole row is reduced, including a row whose first points
    are all 0 (a series that starts inside the chunk, gaps filled with 0)."""
    head = np.gcd.reduce(deltas[:, :, :16], axis=2)
    divisor = head.copy()
    wide = (head != 1) & deltas[:, :, 16:].any(axis=2)
    if wide.any() and deltas.shape[2] > 16:
        divisor[wide] = np.gcd(head[wide], np.gcd.reduce(deltas[wide][:, 16:], axis=1))
    divisor[divisor == 0] = 1
    return deltas // divisor[:, :, None], divisor


def _members(part: int | None) -> npt.NDArray[np.intp]:
    """The metrics a chunk of `part` holds (None: every metric, in a chunk no file names as a part)."""
    return np.arange(METRIC_COUNT, dtype=np.intp) if part is None else PARTS[part]


def encode_chunks(values: IntArray, level: int = FINE_ZLIB_LEVEL, part: int | None = None) -> list[bytes]:
    """Series x metrics x points (int64, MISSING = absent) -> one compressed chunk per series.

    With `part`, `values` holds only that part's metrics (`PARTS[part]`, in that order) and so
    does each chunk: the same layout, narrower.

    Layout before zlib: presence bitmap (metrics x points bits), the divisor of each metric
    (int64), a bitmap of which (byte plane, metric) rows follow, then those rows (`points` bytes
    each, least significant plane first). All-zero planes are left out, so a small or constant
    metric costs one or two rows at most. The arithmetic runs on the whole block at once; only
    the selection of rows and zlib run per series.
    """
    series, metrics, points = values.shape
    members = _members(part)
    if metrics != len(members):
        raise ValueError(f"part {part} has {len(members)} metrics, values have {metrics}")
    second_order = _SECOND_ORDER[members]
    present = values != MISSING
    filled = np.where(present, values, 0)
    counts = present.sum(axis=2)
    partial: BoolArray = (counts > 0) & (counts < points)
    if partial.any():
        # fill each gap with the previous present value (0 before the first), so gaps cost no difference
        rows = values[partial]
        row_present = present[partial]
        index = np.where(row_present, np.arange(points), 0)
        np.maximum.accumulate(index, axis=1, out=index)
        gap_filled = np.take_along_axis(rows, index, axis=1)
        gap_filled[~np.take_along_axis(row_present, index, axis=1)] = 0
        filled[partial] = gap_filled
    deltas = np.diff(filled, axis=2, prepend=0)
    deltas[:, second_order, :] = np.diff(deltas[:, second_order, :], axis=2, prepend=0)
    quotient, divisor = _divide_out(deltas)
    zigzag = ((quotient << 1) ^ (quotient >> 63)).view(np.uint64)
    planes = zigzag.view(np.uint8).reshape(series, metrics, points, 8).transpose(0, 3, 1, 2)  # [S, 8, M, n]
    # plane k of a row is kept when the row's largest value reaches it (zero planes below stay, as zeros)
    largest = zigzag.max(axis=2) if points else np.zeros((series, metrics), dtype=np.uint64)
    needed: BoolArray = largest[:, None, :] >= _PLANE_FLOOR[None, :, None]  # [S, 8, M]
    needed_bits = np.packbits(needed.reshape(series, -1), axis=1)
    bitmap = np.packbits(present.reshape(series, -1), axis=1)
    header = divisor.astype("<i8")
    return [
        zlib.compress(b"".join((bitmap[position].tobytes(), header[position].tobytes(),
                                needed_bits[position].tobytes(),
                                np.ascontiguousarray(planes[position][needed[position]]).tobytes())), level)
        for position in range(series)
    ]


def decode_chunk(
    data: bytes, points: int, metrics: npt.NDArray[np.intp] | None = None, part: int | None = None
) -> IntArray:
    """One chunk back to [metrics, points] int64 (MISSING = absent); only the `metrics` asked for are rebuilt.

    `metrics` are positions within the chunk's `part` (for the whole part, metric indices)."""
    width = len(_members(part))
    raw = zlib.decompress(data)
    offset = (width * points + 7) // 8
    present = np.unpackbits(np.frombuffer(raw, dtype=np.uint8, count=offset))[: width * points]
    present = present.reshape(width, points).astype(np.bool_)
    divisor = np.frombuffer(raw, dtype="<i8", count=width, offset=offset)
    offset += 8 * width
    needed_bytes = (8 * width + 7) // 8
    needed_bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8, count=needed_bytes, offset=offset))
    needed = needed_bits[: 8 * width].reshape(8, width).astype(np.bool_)
    offset += needed_bytes
    planes = np.zeros((8, width, points), dtype=np.uint8)
    planes[needed] = np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(-1, points)
    chosen = np.arange(width) if metrics is None else metrics
    zigzag = np.ascontiguousarray(planes[:, chosen, :].transpose(1, 2, 0)).view(np.uint64)[:, :, 0]
    quotient = (zigzag >> np.uint64(1)).view(np.int64) ^ -(zigzag & np.uint64(1)).view(np.int64)
    deltas = quotient * divisor[chosen][:, None]
    second = _SECOND_ORDER[_members(part)][chosen]
    deltas[second] = np.cumsum(deltas[second], axis=1)
    result = np.cumsum(deltas, axis=1)
    result[~present[chosen]] = MISSING
    return result


def decode_chunks(payloads: Sequence[bytes], points: int, part: int) -> IntArray:
    """Many chunks of one `part` and length, at once: [chunks, the part's metrics, points], each as
    `decode_chunk` decodes it (the plain version, one at a time; tests/unit/store/test_store_codec_batch.py
    holds the two equal). Only the byte planes are laid out chunk by chunk; the arithmetic runs on all of
    them together, which a period's edges (thousands of chunks read for a point or two each) pay for."""
    count = len(payloads)
    width = len(_members(part))
    present_bytes = (width * points + 7) // 8
    needed_bytes = (8 * width + 7) // 8
    header = present_bytes + 8 * width + needed_bytes
    raws = [zlib.decompress(data) for data in payloads]
    heads = np.frombuffer(b"".join(raw[:header] for raw in raws), dtype=np.uint8).reshape(count, header)
    present = np.unpackbits(heads[:, :present_bytes], axis=1)[:, : width * points].reshape(count, width, points)
    divisor = np.ascontiguousarray(heads[:, present_bytes : present_bytes + 8 * width]).view("<i8")
    needed = np.unpackbits(heads[:, present_bytes + 8 * width :], axis=1)[:, : 8 * width].reshape(count, 8, width)
    needed = needed.astype(np.bool_)
    planes = np.zeros((count, 8, width, points), dtype=np.uint8)
    for index, raw in enumerate(raws):
        planes[index][needed[index]] = np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(-1, points)
    zigzag = np.ascontiguousarray(planes.transpose(0, 2, 3, 1)).view(np.uint64)[..., 0]
    quotient = (zigzag >> np.uint64(1)).view(np.int64) ^ -(zigzag & np.uint64(1)).view(np.int64)
    deltas = quotient * divisor[:, :, None]
    second = _SECOND_ORDER[_members(part)]
    deltas[:, second] = np.cumsum(deltas[:, second], axis=2)
    result = np.cumsum(deltas, axis=2)
    result[present == 0] = MISSING
    return result


#: series encoded in one pass, so that a compaction's whole block does not keep all its temporaries alive
#: together. Each series' chunk is its own, so the bytes do not depend on the passes
ENCODE_SERIES_PER_PASS = 16


def parts_of(columns: int) -> tuple[int, ...]:
    """The parts a chunk of `columns` columns is written in: the finest tier's metrics (`SPLIT_PARTS`), or
    a roll-up's columns (`ROLLUP_PARTS`)."""
    if columns not in (METRIC_COUNT, ROLLUP_COLUMN_COUNT):
        raise ValueError(f"chunks hold {METRIC_COUNT} or {ROLLUP_COLUMN_COUNT} columns, not {columns}")
    return SPLIT_PARTS if columns == METRIC_COUNT else ROLLUP_PARTS


def encode_parts(values: IntArray, level: int = FINE_ZLIB_LEVEL) -> list[list[bytes | None]]:
    """Series x columns x points -> for each series, one chunk per part of `parts_of` its columns (None
    where the series has no point of that part's columns)."""
    if values.shape[0] > ENCODE_SERIES_PER_PASS:
        return [chunks for low in range(0, values.shape[0], ENCODE_SERIES_PER_PASS)
                for chunks in encode_parts(values[low : low + ENCODE_SERIES_PER_PASS], level)]
    result: list[list[bytes | None]] = [[] for _ in range(values.shape[0])]
    for part in parts_of(values.shape[1]):
        columns = np.ascontiguousarray(values[:, PARTS[part], :])
        present = (columns != MISSING).any(axis=(1, 2))
        chosen = np.flatnonzero(present)
        encoded = iter(encode_chunks(columns[chosen], level, part) if len(chosen) else [])
        for index in range(values.shape[0]):
            result[index].append(next(encoded) if present[index] else None)
    return result


def decode_parts(
    parts: Sequence[tuple[int, bytes]], points: int, metrics: npt.NDArray[np.intp] | None = None
) -> IntArray:
    """A chunk's parts ((part, bytes) of those it has) back to [metrics, points] (every metric
    without `metrics`; a roll-up's extremes by their columns, `ROLLUP_COLUMN_COUNT`); a metric in none of
    them is MISSING throughout."""
    wanted = np.arange(METRIC_COUNT, dtype=np.intp) if metrics is None else metrics
    result = np.full((len(wanted), points), MISSING, dtype=np.int64)
    for part, data in parts:
        members = PARTS[part]
        # rows of `result` this part fills, and each one's position within the part
        rows = np.flatnonzero(np.isin(wanted, members))
        if not len(rows):
            continue
        result[rows] = decode_chunk(data, points, np.searchsorted(members, wanted[rows]), part)
    return result


def rollup_quantum(values: FloatArray) -> FloatArray:
    """The quantum each roll-up value is rounded to ([..., columns, points], stored units; the columns of a
    roll-up, or its first ones): the metric's absolute quantum, or for a metric kept to significant digits,
    the larger of that and the power of ten that keeps ROLLUP_DIGITS digits of the value."""
    shape = (1,) * (values.ndim - 2) + (-1, 1)
    columns = values.shape[-2]
    absolute = np.broadcast_to(COLUMN_QUANTUM[:columns].astype(np.float64).reshape(shape), values.shape)
    digits = COLUMN_DIGITS[:columns].reshape(shape)
    relative: BoolArray = np.broadcast_to(digits > 0, values.shape)
    if not relative.any():
        return np.array(absolute)
    with np.errstate(invalid="ignore", divide="ignore"):
        magnitude = np.where(np.isfinite(values), np.abs(values), 0.0)
        exponent = np.floor(np.log10(np.maximum(magnitude, 1.0))) - (digits - 1)
    significant = 10.0 ** np.maximum(exponent, 0.0)
    return np.where(relative, np.maximum(absolute, significant), absolute)


def round_to_rollup(values: FloatArray) -> FloatArray:
    """Values ([..., columns, points], stored units, NaN = missing) rounded to the roll-ups' declared
    resolution (`COLUMN_QUANTUM`, `COLUMN_DIGITS`); the error is at most half a quantum."""
    quantum = rollup_quantum(values)
    return np.rint(values / quantum) * quantum


def roll_up(values: IntArray, factor: int) -> IntArray:
    """Coarser points from [..., metrics, points] to [..., ROLLUP_COLUMN_COUNT, points / factor]: of each run
    of `factor` points, over the present ones, the mean (the max for counters, `Rollup.MAX`) in the metric's
    column and, for each metric that keeps extremes (`EXTREMES`), the min and max in its extremes' columns,
    each rounded once to the roll-ups' declared resolution (`round_to_rollup`); the engine's figures (`Rollup.LAST`) keep the last present
    point, exactly; MISSING where none is. Series by series in passes (`ENCODE_SERIES_PER_PASS`):
    each series' points are its own, and a whole block's temporaries at once would make a needless peak."""
    if values.ndim == 3 and values.shape[0] > ENCODE_SERIES_PER_PASS:
        return np.concatenate([roll_up(values[low : low + ENCODE_SERIES_PER_PASS], factor)
                               for low in range(0, values.shape[0], ENCODE_SERIES_PER_PASS)])
    shape = values.shape
    grouped = values.reshape(*shape[:-1], shape[-1] // factor, factor)
    present = grouped != MISSING
    count = present.sum(axis=-1)
    total = np.where(present, grouped, 0).astype(np.float64).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
    maximum = np.where(present, grouped, MISSING).max(axis=-1)
    second_order = _SECOND_ORDER_METRIC
    mean[..., second_order, :] = maximum[..., second_order, :]
    kept = grouped[..., EXTREMES, :, :]
    minimum = np.where(present[..., EXTREMES, :, :], kept, np.iinfo(np.int64).max).min(axis=-1)
    value = np.concatenate([mean, minimum.astype(np.float64), maximum[..., EXTREMES, :].astype(np.float64)], axis=-2)
    counted = np.concatenate([count, count[..., EXTREMES, :], count[..., EXTREMES, :]], axis=-2)
    value[counted == 0] = 0.0
    result = round_to_rollup(value).astype(np.int64)
    result[..., :METRIC_COUNT, :][..., LAST, :] = _last_present(grouped[..., LAST, :, :], present[..., LAST, :, :])
    result[counted == 0] = MISSING
    return np.asarray(result, dtype=np.int64)


def _last_present(grouped: IntArray, present: BoolArray) -> IntArray:
    """The last present value of each run ([..., runs, factor] -> [..., runs]; any value where none is)."""
    factor = grouped.shape[-1]
    last_index = factor - 1 - np.argmax(present[..., ::-1], axis=-1)
    return np.take_along_axis(grouped, last_index[..., None], axis=-1)[..., 0]
