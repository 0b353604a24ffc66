"""The feed's decoder of samples: a columnar answer (`format=columns`, see gpuwm.feed.encode) read into numpy arrays.

Validated column by column (lengths, number types, GpuSample's ranges) instead of one
pydantic object per sample, into `gpuwm.feed.columns.SampleColumns`.

In the arrays NaN stands for null (not reported). A number that is not finite is something
else: the reader of the agent's JSON turns `NaN` and `±Infinity` into infinity (see
`gpuwm.feed.decode`), JSON's overflowing numbers (1e999) are infinite already, and a
row with an infinite value in any of its numbers or its processes' is dropped, the others
kept (`SampleColumns.rejected_rows` counts them): one such figure would make every sum it
enters infinite or NaN.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy
import numpy.typing as npt
from pydantic import ValidationError

from gpuwm.feed.columns import DeviceEntry, Floats, Ints, Processes, SampleColumns
from gpuwm.feed.schema import DEVICE_FIELDS, NUMBER_COLUMNS
from gpuwm.model import GpuSample

#: GpuSample's bounds per number column: (minimum, maximum), None where open
_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "seq": (0.0, None), "sm_percent": (0.0, 100.0), "memory_used_bytes": (0.0, None),
    "memory_activity_percent": (0.0, 100.0), "power_watts": (0.0, None), "energy_joules": (0.0, None),
    "temperature_celsius": (None, None), "sm_clock_mhz": (0.0, None), "memory_clock_mhz": (0.0, None),
    "pcie_rx_bytes_per_second": (0.0, None), "pcie_tx_bytes_per_second": (0.0, None), "merged_seconds": (0.0, None),
}
_PROCESS_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "pid": (0.0, None), "sm_percent": (0.0, 100.0), "memory_used_bytes": (0.0, None),
}



#: validated `gpus` entries by their values: agents repeat the same entries in every pull
_DEVICES: dict[tuple[Any, ...], DeviceEntry] = {}
_DEVICES_KEPT = 20_000  # a fleet with more distinct entries re-validates (as without the cache)
#: the fast path's table rows: `gpu`, `t`, then NUMBER_COLUMNS
_TABLE = ("gpu", "t", *NUMBER_COLUMNS)
_TABLE_AND_HEALTHY = (*_TABLE, "healthy")
#: each row's bounds; an open bound is the largest finite float, so the same comparisons find infinities
_FLOAT_MAX = float(numpy.finfo(numpy.float64).max)
_LOW = numpy.array([0.0, -_FLOAT_MAX] + [-_FLOAT_MAX if _BOUNDS[name][0] is None else _BOUNDS[name][0]
                                         for name in NUMBER_COLUMNS])
_HIGH = numpy.array([_FLOAT_MAX, _FLOAT_MAX] + [_FLOAT_MAX if _BOUNDS[name][1] is None else _BOUNDS[name][1]
                                                for name in NUMBER_COLUMNS])


def parse_columns(payload: Mapping[str, Any]) -> SampleColumns:
    """The samples of a `format=columns` snapshot; raises ValueError naming the field and the row at fault.

    The columns are read in one numpy call and checked at once; where that finds anything
    wrong (or cannot read them), each column is read on its own to name the field and the row.
    """
    raw_devices = payload.get("gpus") or []
    raw = payload.get("columns")
    if not isinstance(raw_devices, list) or not isinstance(raw, dict):
        raise ValueError("'gpus' must be a list and 'columns' an object")
    devices = device_entries(raw_devices)
    t_list = raw.get("t")
    if not isinstance(t_list, list):
        raise ValueError("column 't': expected a list")
    count = len(t_list)
    healthy_list = raw.get("healthy")
    healthy = numpy.ones(count, dtype=numpy.bool_)
    if healthy_list is not None:
        given: npt.NDArray[Any] = numpy.array(healthy_list) if isinstance(healthy_list, list) else numpy.zeros(0)
        if len(given) != count or given.dtype != numpy.bool_:
            raise ValueError(f"column 'healthy': expected {count} booleans")
        healthy = given
    table = _table(raw, count, len(devices))
    if table is not None:  # the common case: every value in range and finite, no errors or processes to read
        gpu, t = table[0].astype(numpy.int64), table[1]
        numbers = {name: table[index] for index, name in enumerate(NUMBER_COLUMNS, start=2)}
        processes = _processes(payload.get("processes"), count)
        columns = SampleColumns(devices, gpu, t, healthy, numbers, _errors(payload.get("errors"), count), processes)
        if processes is None:
            return columns
        dropped = _rows_of_infinite_processes(processes, count)
        return columns.without(dropped) if dropped.any() else columns
    # column by column, to name what is wrong; rows with a number that is not finite are left out of the checks
    # and dropped at the end
    gpu_values, t = _floats(raw.get("gpu"), "gpu", count), _floats(t_list, "t", count)
    numbers = {name: _checked(raw.get(name), name, count, _BOUNDS[name]) for name in NUMBER_COLUMNS}
    processes = _processes(payload.get("processes"), count)
    dropped = numpy.isinf(gpu_values) | numpy.isinf(t)
    for column in numbers.values():
        dropped |= numpy.isinf(column)
    dropped |= _rows_of_infinite_processes(processes, count)
    gpu = _integers(numpy.where(dropped, 0.0, gpu_values), raw.get("gpu"), "gpu")
    outside = numpy.flatnonzero(((gpu < 0) | (gpu >= len(devices))) & ~dropped)
    if len(outside):
        row = int(outside[0])
        raise ValueError(f"column 'gpu' row {row}: {int(gpu[row])} is not an entry of 'gpus' ({len(devices)})")
    missing = numpy.flatnonzero(numpy.isnan(t))
    if len(missing):
        raise ValueError(f"column 't' row {int(missing[0])}: {t_list[int(missing[0])]!r} is not a finite time")
    seq = numbers["seq"]
    fractional = numpy.flatnonzero(seq != numpy.floor(seq))  # NaN (no seq) compares unequal to itself: not here
    fractional = fractional[~numpy.isnan(seq[fractional]) & ~dropped[fractional]]
    if len(fractional):
        raise ValueError(f"column 'seq' row {int(fractional[0])}: expected an integer")
    columns = SampleColumns(devices, gpu, t, healthy, numbers, _errors(payload.get("errors"), count), processes)
    return columns.without(dropped) if dropped.any() else columns


def parse_columns_many(payloads: Sequence[Mapping[str, Any]]) -> list[SampleColumns | ValueError]:
    """`parse_columns` of each payload: its SampleColumns, or the ValueError it raises (naming the field and row).

    A pull is a thousand small snapshots of a few dozen rows each; reading and checking each
    one's table on its own paid numpy's fixed cost per agent. Payloads of the same
    plain shape (the same columns present, no `errors` or `processes`, every column a list
    of the row count) are read as one table and checked at once; each gets a view of its
    rows. Where that table cannot be read or any check fails, each of those payloads is read
    on its own, so a bad one is named and the others are still taken. Either way every
    payload's result is what `parse_columns` gives it.
    """
    results: list[SampleColumns | ValueError | None] = [None] * len(payloads)
    together: list[tuple[int, list[DeviceEntry], Mapping[str, Any]]] = []
    shape: tuple[bool, ...] | None = None
    for position, payload in enumerate(payloads):
        raw = payload.get("columns")
        key = _plain_shape(payload, raw)
        if key is None or (shape is not None and key != shape):
            results[position] = _parsed_or_error(payload)
            continue
        try:
            devices = device_entries(payload["gpus"] or [])
        except ValueError as error:
            results[position] = error
            continue
        shape = key
        together.append((position, devices, cast(Mapping[str, Any], raw)))
    if together and shape is not None:
        read = _read_together(together, shape)
        for index, (position, _, _) in enumerate(together):
            results[position] = read[index] if read is not None else _parsed_or_error(payloads[position])
    return cast(list[SampleColumns | ValueError], results)


def _parsed_or_error(payload: Mapping[str, Any]) -> SampleColumns | ValueError:
    """`parse_columns`, its failure as a ValueError (saying what `parse_snapshot` says of it)."""
    try:
        return parse_columns(payload)
    except ValueError as error:  # pydantic's ValidationError is one too
        return error
    except (TypeError, AttributeError) as error:
        return ValueError(str(error))


def _plain_shape(payload: Mapping[str, Any], raw: Any) -> tuple[bool, ...] | None:
    """Which table columns (and `healthy`) a payload has, if it can be read with others; None if it cannot."""
    if (not isinstance(raw, dict) or not isinstance(payload.get("gpus") or [], list)
            or payload.get("errors") is not None or payload.get("processes") is not None):
        return None
    t = raw.get("t")
    if type(t) is not list or not t:  # no rows: read on its own (an empty `healthy` is not booleans there)
        return None
    count = len(t)
    shape = []
    for name in _TABLE_AND_HEALTHY:
        values = raw.get(name)
        if values is None:
            shape.append(False)
        elif type(values) is list and len(values) == count:
            shape.append(True)
        else:
            return None
    return tuple(shape) if shape[0] else None  # `gpu` and `t` (present: above) in every table


def _read_together(
    together: list[tuple[int, list[DeviceEntry], Mapping[str, Any]]], shape: tuple[bool, ...]
) -> list[SampleColumns] | None:
    """One table for the payloads' rows, checked as `_table` checks each; None where anything is off."""
    raws = [raw for _, _, raw in together]
    counts = [len(raw["t"]) for raw in raws]
    total = sum(counts)
    present = [index for index in range(len(_TABLE)) if shape[index]]
    flat: list[Any] = []
    for index in present:
        name = _TABLE[index]
        for raw in raws:
            flat += raw[name]
    table = numpy.full((len(_TABLE), total), numpy.nan)
    try:
        table[present] = numpy.array(flat, dtype=numpy.float64).reshape(len(present), total)
    except (TypeError, ValueError):
        return None
    healthy: npt.NDArray[numpy.bool_] = numpy.ones(total, dtype=numpy.bool_)
    if shape[-1]:
        flags: list[Any] = []
        for raw in raws:
            flags += raw["healthy"]
        given = numpy.array(flags)
        if given.dtype != numpy.bool_:
            return None
        healthy = given
    if _wrong(table, numpy.repeat([len(devices) for _, devices, _ in together], counts)):
        return None
    gpu, t, seq = table[0], table[1], table[2]
    gpu_indexes = gpu.astype(numpy.int64)
    sizes: Ints = numpy.asarray(counts, dtype=numpy.int64)
    ends: Ints = numpy.cumsum(sizes)
    starts: Ints = ends - sizes
    # per payload: its highest seq (fmax skips NaN: no seq; all NaN gives NaN, read as 0) and whether its times
    # never go back (each payload has rows: see `_plain_shape`)
    highest = numpy.fmax.reduceat(seq, starts)
    max_seqs = numpy.where(numpy.isnan(highest), 0.0, highest).astype(numpy.int64).tolist()
    back = numpy.zeros(total, dtype=numpy.int64)
    back[1:] = t[1:] < t[:-1]
    back[starts] = 0  # a payload's first row follows the row of the one before it
    ordered = (numpy.add.reduceat(back, starts) == 0).tolist()
    parts = []
    for position, (_, devices, _) in enumerate(together):
        low, high = int(starts[position]), int(ends[position])
        numbers = {name: table[index, low:high] for index, name in enumerate(NUMBER_COLUMNS, start=2)}
        parts.append(SampleColumns(devices, gpu_indexes[low:high], t[low:high], healthy[low:high], numbers, {}, None,
                                   max_seqs[position], ordered[position]))
    return parts


def _table(raw: Mapping[str, Any], count: int, devices: int) -> Floats | None:
    """`gpu`, `t` and the number columns as one float table (NaN for null), or None if anything is off."""
    present = [index for index, name in enumerate(_TABLE) if raw.get(name) is not None]
    lists = [raw[_TABLE[index]] for index in present]
    if present[:2] != [0, 1] or not all(type(values) is list and len(values) == count for values in lists):
        return None
    table = numpy.full((len(_TABLE), count), numpy.nan)
    try:
        table[present] = numpy.array(lists, dtype=numpy.float64)
    except (TypeError, ValueError):
        return None
    return None if _wrong(table, devices) else table


def _wrong(table: Floats, devices: int | Ints) -> bool:
    """Whether a table of `_TABLE` rows breaks GpuSample's bounds: a number out of range or infinite (a row to
    drop: `parse_columns` finds it; see `_LOW` and `_HIGH`), a time that is not finite, a `gpu` that is not an
    entry of its `gpus` (`devices`: their count, or each row's), a fractional seq."""
    with numpy.errstate(invalid="ignore"):
        gpu, t, seq = table[0], table[1], table[2]
        return bool(
            (table < _LOW[:, None]).any() or (table > _HIGH[:, None]).any() or not numpy.isfinite(t).all()
            or (gpu != numpy.floor(gpu)).any() or (gpu >= devices).any()
            or ((seq != numpy.floor(seq)) & ~numpy.isnan(seq)).any()
        )


def device_entries(raw: Any) -> list[DeviceEntry]:
    """A payload's `gpus`, validated (ValueError naming the entry at fault); what `parse_columns` then takes as they are."""
    if not isinstance(raw, list):
        raise ValueError("'gpus' must be a list")
    return [_device(position, entry) for position, entry in enumerate(raw)]


def _device(position: int, entry: Any) -> DeviceEntry:
    """A `gpus` entry, validated as GpuSample validates those fields (once per distinct entry); one validated
    already (`device_entries`: JSON cannot give one) as it is."""
    if type(entry) is DeviceEntry:
        return entry
    if not isinstance(entry, dict):
        raise ValueError(f"gpus[{position}]: expected an object")
    try:
        key = tuple(map(entry.get, DEVICE_FIELDS))
        known = _DEVICES.get(key)
    except TypeError:  # a value that is not hashable: not valid either, validation says why
        key, known = (), None
    if known is not None:
        return known
    try:
        validated = GpuSample.model_validate({name: entry.get(name) for name in DEVICE_FIELDS
                                              if entry.get(name) is not None} | {"t": 0.0})
    except ValidationError as error:
        first = error.errors()[0]
        raise ValueError(f"gpus[{position}].{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    # the device's UUID, node and model: the interpreter's one copy, shared with the engine's and the holders'
    device = DeviceEntry(
        uuid=sys.intern(validated.uuid), node=sys.intern(validated.node), index=validated.index,
        model=_interned(validated.model), parent_uuid=_interned(validated.parent_uuid),
        mig_profile=_interned(validated.mig_profile), device_units=validated.device_units,
        memory_total_bytes=validated.memory_total_bytes, power_limit_watts=validated.power_limit_watts,
    )
    if key:
        if len(_DEVICES) >= _DEVICES_KEPT:
            _DEVICES.clear()
        _DEVICES[tuple(sys.intern(value) if type(value) is str else value for value in key)] = device
    return device


def _interned(text: str | None) -> str | None:
    return None if text is None else sys.intern(text)


def _errors(raw: Any, count: int) -> dict[int, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError("'errors': expected an object of row -> message")
    errors = {}
    for key, message in raw.items():
        row = int(key) if isinstance(key, str) and key.isdigit() else -1
        if not 0 <= row < count or not isinstance(message, str):
            raise ValueError(f"errors[{key!r}]: expected a row below {count} and a message")
        errors[row] = message
    return errors


def _processes(raw: Any, count: int) -> Processes | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("'processes': expected an object of columns")
    rows_list = raw.get("row")
    size = len(rows_list) if isinstance(rows_list, list) else 0
    rows = _integers(_floats(rows_list, "processes.row", size), rows_list, "processes.row")
    if len(rows) and (rows[0] < 0 or rows[-1] >= count or (numpy.diff(rows) < 0).any()):
        raise ValueError(f"column 'processes.row': expected rows in order, each below {count}")
    pid = _checked(raw.get("pid"), "processes.pid", size, _PROCESS_BOUNDS["pid"])
    missing = numpy.flatnonzero(numpy.isnan(pid) | ((pid != numpy.floor(pid)) & ~numpy.isinf(pid)))
    if len(missing):
        raise ValueError(f"column 'processes.pid' row {int(missing[0])}: expected an integer")
    names = {name: _strings(raw.get(name), f"processes.{name}", size) for name in ("pod_uid", "container")}
    empty = raw.get("empty") or []
    if not isinstance(empty, list) or not all(type(row) is int and 0 <= row < count for row in empty):
        raise ValueError(f"'processes.empty': expected rows below {count}")
    return Processes(
        rows, pid, names["pod_uid"], names["container"],
        _checked(raw.get("sm_percent"), "processes.sm_percent", size, _PROCESS_BOUNDS["sm_percent"]),
        _checked(raw.get("memory_used_bytes"), "processes.memory_used_bytes", size,
                 _PROCESS_BOUNDS["memory_used_bytes"]),
        set(empty),
    )


def _rows_of_infinite_processes(processes: Processes | None, count: int) -> npt.NDArray[numpy.bool_]:
    """Which of `count` rows list a process with an infinite number."""
    rows = numpy.zeros(count, dtype=numpy.bool_)
    if processes is not None and len(processes.row):
        infinite = numpy.isinf(processes.pid) | numpy.isinf(processes.sm_percent) | numpy.isinf(
            processes.memory_used_bytes)
        rows[processes.row[infinite]] = True
    return rows


def _strings(raw: Any, name: str, count: int) -> list[str | None]:
    if raw is None:
        return [None] * count
    if not isinstance(raw, list) or len(raw) != count:
        raise ValueError(f"column {name!r}: expected {count} values")
    for row, value in enumerate(raw):
        if value is not None and type(value) is not str:
            raise ValueError(f"column {name!r} row {row}: {value!r} is not a string")
    return raw


def _floats(raw: Any, name: str, count: int) -> Floats:
    """A JSON array of numbers or nulls as float64 (NaN for null); a column left out is all null."""
    if raw is None:
        return numpy.full(count, numpy.nan)
    if not isinstance(raw, list) or len(raw) != count:
        size = len(raw) if isinstance(raw, list) else type(raw).__name__
        raise ValueError(f"column {name!r}: {size} values for {count} rows")
    values = numpy.array(raw)
    if values.dtype.kind in "fiu" and values.ndim == 1:
        return values.astype(numpy.float64)
    for row, value in enumerate(raw):  # nulls, or something that is not a number: find the row
        if value is not None and type(value) not in (int, float, bool):
            raise ValueError(f"column {name!r} row {row}: {value!r} is not a number")
    return numpy.array([numpy.nan if value is None else value for value in raw], dtype=numpy.float64)


def _checked(raw: Any, name: str, count: int, bounds: tuple[float | None, float | None]) -> Floats:
    """A number column checked against its bounds; an infinite value is not checked (its row is dropped)."""
    values = _floats(raw, name, count)
    low, high = bounds
    finite = ~numpy.isinf(values)
    for bad, says in ((values < low if low is not None else None, f"below {low:g}" if low is not None else ""),
                      (values > high if high is not None else None, f"above {high:g}" if high is not None else "")):
        if bad is not None:
            bad &= finite
        if bad is not None and bad.any():
            row = int(numpy.flatnonzero(bad)[0])
            raise ValueError(f"column {name!r} row {row}: {values[row]:g} is {says}")
    return values


def _integers(values: Floats, raw: Any, name: str) -> Ints:
    """`values` (read from the JSON array `raw`) as integers; ValueError naming the first row that is not one."""
    bad = numpy.flatnonzero(~numpy.isfinite(values) | (values != numpy.floor(values)))
    if len(bad):
        raise ValueError(f"column {name!r} row {int(bad[0])}: {raw[int(bad[0])]!r} is not an integer")
    return values.astype(numpy.int64)
