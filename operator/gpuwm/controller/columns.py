"""The agent's columnar snapshot (`format=columns`, see gpuwm.agent.columns) read into numpy arrays.

Validated column by column (lengths, number types, GpuSample's ranges) instead of one
pydantic object per sample; what the engine needs goes to it as a `SampleBatch`, and only
the samples the rest of the cycle keeps (each device's latest) become GpuSample objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy
import numpy.typing as npt
from pydantic import ValidationError

from gpuwm.accounting.state import SampleBatch
from gpuwm.agent.columns import DEVICE_FIELDS, NUMBER_COLUMNS
from gpuwm.model.sample import GpuSample

Floats = npt.NDArray[numpy.float64]
Ints = npt.NDArray[numpy.int64]

#: GpuSample's bounds per number column: (minimum, maximum), None where open
_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "seq": (0.0, None), "sm_percent": (0.0, 100.0), "memory_used_bytes": (0.0, None),
    "memory_activity_percent": (0.0, 100.0), "power_watts": (0.0, None), "energy_joules": (0.0, None),
    "temperature_celsius": (None, None), "sm_clock_mhz": (0.0, None), "memory_clock_mhz": (0.0, None),
    "pcie_rx_bytes_per_second": (0.0, None), "pcie_tx_bytes_per_second": (0.0, None),
}
_PROCESS_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "pid": (0.0, None), "sm_percent": (0.0, 100.0), "memory_used_bytes": (0.0, None),
}


@dataclass
class Processes:
    """The flattened process lists: entry i belongs to sample row `row[i]`; rows in `empty` had `[]`."""

    row: Ints
    pid: Floats
    pod_uid: list[str | None]
    container: list[str | None]
    sm_percent: Floats
    memory_used_bytes: Floats
    empty: set[int]


@dataclass
class SampleColumns:
    """One agent's samples as arrays (NaN where not reported), rows in the agent's sequence order."""

    devices: list[GpuSample]  # one per `gpus` entry: its device fields (t and the figures unset)
    gpu: Ints
    t: Floats
    healthy: npt.NDArray[numpy.bool_]
    numbers: dict[str, Floats]  # every NUMBER_COLUMNS name
    errors: dict[int, str]
    processes: Processes | None

    def __len__(self) -> int:
        return len(self.t)

    @property
    def max_seq(self) -> int:
        seq = self.numbers["seq"]
        return int(numpy.nanmax(seq)) if len(seq) and not numpy.isnan(seq).all() else 0

    def time_order(self) -> Ints:
        """Rows in time order, rows of equal time in sequence order (what the engine wants)."""
        return numpy.argsort(self.t, kind="stable")

    def sample(self, row: int) -> GpuSample:
        """Row `row` as the GpuSample the agent took (the values are validated already)."""
        device = self.devices[int(self.gpu[row])]
        fields: dict[str, Any] = {name: getattr(device, name) for name in DEVICE_FIELDS}
        fields["t"] = float(self.t[row])
        for name, column in self.numbers.items():
            value = float(column[row])
            fields[name] = None if value != value else value
        if fields["seq"] is not None:
            fields["seq"] = int(fields["seq"])
        fields["healthy"] = bool(self.healthy[row])
        fields["error"] = self.errors.get(row)
        fields["processes"] = self._processes_of(row)
        return GpuSample.model_validate(fields)

    def _processes_of(self, row: int) -> list[dict[str, Any]] | None:
        processes = self.processes
        if processes is None:
            return None
        low, high = numpy.searchsorted(processes.row, [row, row + 1])
        if low == high:
            return [] if row in processes.empty else None
        return [
            {"pid": int(processes.pid[index]), "pod_uid": processes.pod_uid[index],
             "container": processes.container[index], "sm_percent": _none(processes.sm_percent[index]),
             "memory_used_bytes": _none(processes.memory_used_bytes[index])}
            for index in range(int(low), int(high))
        ]

    def batch(self, order: Ints) -> SampleBatch:
        """The engine's input for these rows in `order` (see `Engine.observe_samples`); `sample(i)` is row order[i]."""
        devices = self.devices
        sm = numpy.where(self.healthy, self.numbers["sm_percent"], numpy.nan)
        used = self.numbers["memory_used_bytes"]
        total = numpy.array([numpy.nan if d.memory_total_bytes is None else d.memory_total_bytes for d in devices])
        total = total[self.gpu] if len(devices) else numpy.full(len(self.t), numpy.nan)
        with numpy.errstate(divide="ignore", invalid="ignore"):
            memory = numpy.minimum(100.0, 100.0 * used / total)  # as GpuSample.memory_percent, NaN where unknown
        memory[~(total > 0)] = numpy.nan
        return SampleBatch(
            uuids=[device.uuid for device in devices], nodes=[device.node for device in devices],
            parent_uuids=[device.parent_uuid for device in devices],
            device_units=[device.device_units for device in devices],
            device=self.gpu[order].tolist(), t=self.t[order].tolist(), sm=sm[order].tolist(),
            memory=memory[order].tolist(), energy=self.numbers["energy_joules"][order].tolist(),
            pod_sm=self._pod_sm(order), sample=lambda index: self.sample(int(order[index])),
        )

    def _pod_sm(self, order: Ints) -> list[dict[str, float] | None]:
        """SM % per pod uid of each row, as `sample_values` derives it from the row's processes."""
        processes = self.processes
        by_row: list[dict[str, float] | None] = [None] * len(self.t)
        if processes is None:
            return by_row
        for row in processes.empty:
            by_row[row] = {}
        rows, sm = processes.row.tolist(), processes.sm_percent.tolist()
        with_sm: set[int] = set()
        for index, row in enumerate(rows):
            if sm[index] == sm[index]:
                with_sm.add(row)
        for index, row in enumerate(rows):
            if row not in with_sm:
                continue  # processes without SM: no per-process data
            pod_sm = by_row[row]
            if pod_sm is None:
                pod_sm = by_row[row] = {}
            uid = processes.pod_uid[index]
            if uid is not None and sm[index] == sm[index]:
                pod_sm[uid] = pod_sm.get(uid, 0.0) + sm[index]
        return [by_row[row] for row in order.tolist()]


def _none(value: float) -> float | None:
    return None if value != value else float(value)


def concat(first: SampleColumns, second: SampleColumns) -> SampleColumns:
    """`first`'s rows then `second`'s (pages of one pull)."""
    count = len(first.t)
    errors = {**first.errors, **{row + count: error for row, error in second.errors.items()}}
    processes = first.processes
    if second.processes is not None:
        later = second.processes
        moved = Processes(later.row + count, later.pid, later.pod_uid, later.container, later.sm_percent,
                          later.memory_used_bytes, {row + count for row in later.empty})
        processes = moved if processes is None else Processes(
            numpy.concatenate([processes.row, moved.row]), numpy.concatenate([processes.pid, moved.pid]),
            processes.pod_uid + moved.pod_uid, processes.container + moved.container,
            numpy.concatenate([processes.sm_percent, moved.sm_percent]),
            numpy.concatenate([processes.memory_used_bytes, moved.memory_used_bytes]), processes.empty | moved.empty,
        )
    return SampleColumns(
        devices=first.devices + second.devices,
        gpu=numpy.concatenate([first.gpu, second.gpu + len(first.devices)]),
        t=numpy.concatenate([first.t, second.t]),
        healthy=numpy.concatenate([first.healthy, second.healthy]),
        numbers={name: numpy.concatenate([first.numbers[name], second.numbers[name]]) for name in first.numbers},
        errors=errors, processes=processes,
    )


# ----------------------------------------------------------------------------- parsing


def parse_columns(payload: Mapping[str, Any]) -> SampleColumns:
    """The samples of a `format=columns` snapshot; raises ValueError naming the field and the row at fault."""
    raw_devices = payload.get("gpus") or []
    raw = payload.get("columns")
    if not isinstance(raw_devices, list) or not isinstance(raw, dict):
        raise ValueError("'gpus' must be a list and 'columns' an object")
    devices = []
    for position, entry in enumerate(raw_devices):
        if not isinstance(entry, dict):
            raise ValueError(f"gpus[{position}]: expected an object")
        try:
            devices.append(GpuSample.model_validate({name: entry.get(name) for name in DEVICE_FIELDS
                                                     if entry.get(name) is not None} | {"t": 0.0}))
        except ValidationError as error:
            first = error.errors()[0]
            raise ValueError(f"gpus[{position}].{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    t_list = raw.get("t")
    if not isinstance(t_list, list):
        raise ValueError("column 't': expected a list")
    count = len(t_list)
    gpu = _integers(raw.get("gpu"), "gpu", count)
    outside = numpy.flatnonzero((gpu < 0) | (gpu >= len(devices)))
    if len(outside):
        row = int(outside[0])
        raise ValueError(f"column 'gpu' row {row}: {int(gpu[row])} is not an entry of 'gpus' ({len(devices)})")
    t = _floats(t_list, "t", count)
    not_finite = numpy.flatnonzero(~numpy.isfinite(t))
    if len(not_finite):
        raise ValueError(f"column 't' row {int(not_finite[0])}: {t_list[int(not_finite[0])]!r} is not a finite time")
    healthy_list = raw.get("healthy")
    healthy = numpy.ones(count, dtype=numpy.bool_)
    if healthy_list is not None:
        given: npt.NDArray[Any] = numpy.array(healthy_list) if isinstance(healthy_list, list) else numpy.zeros(0)
        if len(given) != count or given.dtype != numpy.bool_:
            raise ValueError(f"column 'healthy': expected {count} booleans")
        healthy = given
    numbers = {name: _checked(raw.get(name), name, count, _BOUNDS[name]) for name in NUMBER_COLUMNS}
    seq = numbers["seq"]
    fractional = numpy.flatnonzero(seq != numpy.floor(seq))  # NaN (no seq) compares unequal to itself: not here
    fractional = fractional[~numpy.isnan(seq[fractional])]
    if len(fractional):
        raise ValueError(f"column 'seq' row {int(fractional[0])}: expected an integer")
    return SampleColumns(devices, gpu, t, healthy, numbers, _errors(payload.get("errors"), count),
                         _processes(payload.get("processes"), count))


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
    rows = _integers(rows_list, "processes.row", size)
    if len(rows) and (rows[0] < 0 or rows[-1] >= count or (numpy.diff(rows) < 0).any()):
        raise ValueError(f"column 'processes.row': expected rows in order, each below {count}")
    pid = _checked(raw.get("pid"), "processes.pid", size, _PROCESS_BOUNDS["pid"])
    missing = numpy.flatnonzero(numpy.isnan(pid) | (pid != numpy.floor(pid)))
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
    values = _floats(raw, name, count)
    low, high = bounds
    for bad, says in ((values < low if low is not None else None, f"below {low:g}" if low is not None else ""),
                      (values > high if high is not None else None, f"above {high:g}" if high is not None else "")):
        if bad is not None and bad.any():
            row = int(numpy.flatnonzero(bad)[0])
            raise ValueError(f"column {name!r} row {row}: {values[row]:g} is {says}")
    return values


def _integers(raw: Any, name: str, count: int) -> Ints:
    values = _floats(raw, name, count)
    bad = numpy.flatnonzero(numpy.isnan(values) | (values != numpy.floor(values)))
    if len(bad):
        raise ValueError(f"column {name!r} row {int(bad[0])}: {raw[int(bad[0])]!r} is not an integer")
    return values.astype(numpy.int64)
