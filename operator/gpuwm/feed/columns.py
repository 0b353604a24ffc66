"""One agent's samples as columns: numpy arrays (NaN where not reported) and the device table they index.

What `gpuwm.feed.arrays` reads a columnar answer into (`SampleColumns`); what the engine takes of it
(`SampleColumns.batch`, a `SampleBatch`); and the few samples the rest of the cycle keeps (each device's
latest) as DeviceReading records (`SampleColumns.samples`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy
import numpy.typing as npt

from gpuwm.accounting import SampleBatch
from gpuwm.feed.schema import NUMBER_COLUMNS
from gpuwm.model import DeviceReading, ProcessSample

Floats = npt.NDArray[numpy.float64]
Ints = npt.NDArray[numpy.int64]


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

    def select(self, entries: Ints, position: Ints, empty: set[int]) -> Processes:
        """The `entries` in that order, their rows renumbered by `position` (old row -> new row), with `empty`."""
        listed = entries.tolist()
        return Processes(
            position[self.row[entries]], self.pid[entries], [self.pod_uid[index] for index in listed],
            [self.container[index] for index in listed], self.sm_percent[entries], self.memory_used_bytes[entries], empty,
        )


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    """A `gpus` entry's device fields (DEVICE_FIELDS, in that order), validated as GpuSample validates them.

    Kept for every device between pulls (`_DEVICES`): a tenth of a GpuSample of the same fields
    (with every other field's default) in memory.
    """

    uuid: str
    node: str
    index: int | None
    model: str | None
    parent_uuid: str | None
    mig_profile: str | None
    device_units: float
    memory_total_bytes: float | None
    power_limit_watts: float | None


#: the number columns `SampleColumns.samples` unpacks, in that order
_UNPACKED_NUMBERS = (
    "seq", "sm_percent", "memory_used_bytes", "memory_activity_percent", "power_watts", "energy_joules",
    "temperature_celsius", "sm_clock_mhz", "memory_clock_mhz", "pcie_rx_bytes_per_second", "pcie_tx_bytes_per_second",
    "merged_seconds",
)
if NUMBER_COLUMNS != _UNPACKED_NUMBERS:
    raise ImportError("the feed's number columns changed: update SampleColumns.samples")


@dataclass
class SampleColumns:
    """One agent's samples as arrays (NaN where not reported), rows in the agent's sequence order."""

    devices: list[DeviceEntry]  # one per `gpus` entry
    gpu: Ints
    t: Floats
    healthy: npt.NDArray[numpy.bool_]
    numbers: dict[str, Floats]  # every NUMBER_COLUMNS name
    errors: dict[int, str]
    processes: Processes | None
    #: `max_seq` and `in_time_order()` where they were found for many agents' rows at once (`parse_columns_many`)
    known_max_seq: int | None = None
    known_in_time_order: bool | None = None
    #: rows the agent sent that were dropped for a number that is not finite (see `without`)
    rejected_rows: int = 0

    def __len__(self) -> int:
        return len(self.t)

    @property
    def max_seq(self) -> int:
        if self.known_max_seq is not None:
            return self.known_max_seq
        seq = self.numbers["seq"]
        return int(numpy.nanmax(seq)) if len(seq) and not numpy.isnan(seq).all() else 0

    def time_order(self) -> Ints:
        """Rows in time order, rows of equal time in sequence order (what the engine wants)."""
        return numpy.argsort(self.t, kind="stable")

    def in_time_order(self) -> bool:
        """Whether the rows are in time order already (`time_order` is then every row in place)."""
        if self.known_in_time_order is not None:
            return self.known_in_time_order
        return bool((self.t[1:] >= self.t[:-1]).all())

    def take(self, order: Ints) -> SampleColumns:
        """The rows in `order` (a permutation), the device table as it is."""
        position = numpy.empty_like(order)
        position[order] = numpy.arange(len(order))  # old row -> new row
        processes = self.processes
        if processes is not None:
            by_row = numpy.argsort(position[processes.row], kind="stable")  # a row's processes keep their order
            processes = processes.select(by_row, position, {int(position[row]) for row in processes.empty})
        return SampleColumns(
            devices=self.devices, gpu=self.gpu[order], t=self.t[order], healthy=self.healthy[order],
            numbers={name: column[order] for name, column in self.numbers.items()},
            errors={int(position[row]): error for row, error in self.errors.items()}, processes=processes,
        )

    def without(self, dropped: npt.NDArray[numpy.bool_]) -> SampleColumns:
        """The rows not marked in `dropped` (and their processes, errors, empty process lists), in their order;
        `rejected_rows` counts the others."""
        kept = numpy.flatnonzero(~dropped)
        position = numpy.full(len(self.t), -1, dtype=numpy.int64)
        position[kept] = numpy.arange(len(kept))  # old row -> new row
        processes = self.processes
        if processes is not None:
            kept_rows = {int(position[row]) for row in processes.empty if not dropped[row]}
            processes = processes.select(numpy.flatnonzero(~dropped[processes.row]), position, kept_rows)
        return SampleColumns(
            devices=self.devices, gpu=self.gpu[kept], t=self.t[kept], healthy=self.healthy[kept],
            numbers={name: column[kept] for name, column in self.numbers.items()},
            errors={int(position[row]): error for row, error in self.errors.items() if not dropped[row]},
            processes=processes, rejected_rows=self.rejected_rows + len(self.t) - len(kept),
        )

    def sample(self, row: int) -> DeviceReading:
        """Row `row` as the sample the agent took (the values are validated already)."""
        return self.samples([row])[0]

    def samples(self, rows: list[int]) -> list[DeviceReading]:
        """`sample` of each row, the columns read once for all of them."""
        index = numpy.asarray(rows, dtype=numpy.int64)
        gpus, times, healthy = self.gpu[index].tolist(), self.t[index].tolist(), self.healthy[index].tolist()
        values = numpy.stack([self.numbers[name][index] for name in NUMBER_COLUMNS], axis=1)
        reported = values.astype(object)
        reported[numpy.isnan(values)] = None  # null where not reported
        figures = reported.tolist()
        devices, errors, processes = self.devices, self.errors, self.processes
        built = []
        for row, gpu, t, ok, numbers in zip(rows, gpus, times, healthy, figures, strict=True):
            device = devices[gpu]
            seq, sm, used, activity, power, energy, temperature, sm_clock, memory_clock, rx, tx, merged = numbers
            listed = None if processes is None else self._processes_of(row)
            built.append(DeviceReading(
                t=t, node=device.node, uuid=device.uuid, seq=None if seq is None else int(seq), index=device.index,
                model=device.model, parent_uuid=device.parent_uuid, mig_profile=device.mig_profile,
                device_units=device.device_units, healthy=ok, error=errors.get(row), sm_percent=sm,
                memory_used_bytes=used, memory_total_bytes=device.memory_total_bytes,
                memory_activity_percent=activity, power_watts=power, power_limit_watts=device.power_limit_watts,
                energy_joules=energy, temperature_celsius=temperature, sm_clock_mhz=sm_clock,
                memory_clock_mhz=memory_clock, pcie_rx_bytes_per_second=rx, pcie_tx_bytes_per_second=tx,
                processes=None if listed is None else [ProcessSample.model_validate(item) for item in listed],
                merged_seconds=merged,
            ))
        return built

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
            device=self.gpu[order], t=self.t[order], sm=sm[order], memory=memory[order],
            energy=self.numbers["energy_joules"][order], pod_sm=self._pod_sm(order),
            merged=self._merged(order),
            sample=lambda index: self.sample(int(order[index])),
        )

    def _merged(self, order: Ints) -> Floats | None:
        """Each row's `merged_seconds`, 0 for a single poll; None when no row is merged (the engine's cheaper path)."""
        merged = self.numbers["merged_seconds"]
        return None if numpy.isnan(merged).all() else numpy.nan_to_num(merged[order], nan=0.0)

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


def join(parts: list[SampleColumns]) -> SampleColumns:
    """The parts' rows one after the other, each part's device table kept (entries renumbered)."""
    if len(parts) == 1:
        return parts[0]
    row_offsets = numpy.cumsum([0] + [len(part.t) for part in parts[:-1]]).tolist()
    device_offsets = numpy.cumsum([0] + [len(part.devices) for part in parts[:-1]]).tolist()
    errors = {row + offset: error for part, offset in zip(parts, row_offsets, strict=True)
              for row, error in part.errors.items()}
    with_processes = [(part.processes, offset) for part, offset in zip(parts, row_offsets, strict=True)
                      if part.processes is not None]
    processes = None
    if with_processes:
        processes = Processes(
            numpy.concatenate([listed.row + offset for listed, offset in with_processes]),
            numpy.concatenate([listed.pid for listed, _ in with_processes]),
            [uid for listed, _ in with_processes for uid in listed.pod_uid],
            [name for listed, _ in with_processes for name in listed.container],
            numpy.concatenate([listed.sm_percent for listed, _ in with_processes]),
            numpy.concatenate([listed.memory_used_bytes for listed, _ in with_processes]),
            {row + offset for listed, offset in with_processes for row in listed.empty},
        )
    return SampleColumns(
        devices=[device for part in parts for device in part.devices],
        gpu=numpy.concatenate([part.gpu + offset for part, offset in zip(parts, device_offsets, strict=True)]),
        t=numpy.concatenate([part.t for part in parts]),
        healthy=numpy.concatenate([part.healthy for part in parts]),
        numbers={name: numpy.concatenate([part.numbers[name] for part in parts]) for name in parts[0].numbers},
        errors=errors, processes=processes, rejected_rows=sum(part.rejected_rows for part in parts),
    )
