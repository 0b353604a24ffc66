"""The engine's internal records: GPU sample history, allocation stretches, pods and workloads.

Plain classes with __slots__: the engine absorbs hundreds of thousands of samples a
second, and pydantic validation per record would cost more than the accounting itself.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Iterator, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from gpuwm.accounting.rawcolumns import RawDoubles, doubles_from_saved
from gpuwm.accounting.windows import WindowSums, fold_after_of
from gpuwm.config import DEFAULT_IDLE_THRESHOLD_PERCENT, Settings
from gpuwm.model import GpuSample, LatestSample, PodEvent, WorkloadEvent

if TYPE_CHECKING:
    import numpy.typing as npt

INFINITY = math.inf


@dataclass(frozen=True)
class EngineConfig:
    """What the accounting depends on besides its input."""

    interval_seconds: float = 1.0
    idle_threshold_percent: float = DEFAULT_IDLE_THRESHOLD_PERCENT
    project_label: str = "gpuwm.io/project"
    late_event_window_seconds: float = 120.0
    #: a GPU that has sent no sample for this long and that no pod holds is forgotten: a node the
    #: autoscaler removed, a MIG layout replaced. Kept, it would count in the cluster's GPUs and
    #: units for ever, and its record would stay in memory (autoscaled fleets see new GPUs daily).
    gpu_gone_seconds: float = 3600.0
    quota_annotation: str = "gpuwm.io/gpu-quota"

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineConfig:
        """The engine's configuration as every verb reads it from the one settings object."""
        return cls(
            interval_seconds=settings.interval,
            idle_threshold_percent=settings.idle_threshold_percent,
            project_label=settings.project_label,
            late_event_window_seconds=settings.late_event_window,
        )

    @property
    def gap_seconds(self) -> float:
        """A sample interval longer than this is unmonitored (DESIGN §3: 3 x the poll interval)."""
        return 3.0 * self.interval_seconds


NOTHING = math.nan  # "not reported" inside the float arrays of a GPU's history


#: (t, sm %, memory %, energy J, SM % per pod uid, device units, merged seconds): one point of a GPU's history
SampleValues = tuple[float, float, float, float, dict[str, float] | None, float, float]


def sample_values(sample: GpuSample) -> SampleValues:
    """A sample's `SampleValues`; NaN where not reported. The per-pod SM map is None without per-process
    data; `processes: []` says "no processes" (an empty map); a list whose processes carry no SM is none."""
    pod_sm: dict[str, float] | None = None
    processes = sample.processes
    if processes is not None:
        with_sm = [process for process in processes if process.sm_percent is not None]
        if with_sm or not processes:
            pod_sm = {}
            for process in with_sm:
                if process.pod_uid is not None:
                    pod_sm[process.pod_uid] = pod_sm.get(process.pod_uid, 0.0) + (process.sm_percent or 0.0)
    used, total = sample.memory_used_bytes, sample.memory_total_bytes
    if used is None or not total:
        memory = NOTHING
    else:
        memory = 100.0 * used / total
        if not memory < 100.0:  # min(100.0, memory), without the call
            memory = 100.0
    sm = sample.sm_percent
    if sm is None or not sample.healthy:
        sm = NOTHING
    energy = sample.energy_joules
    if energy is None:
        energy = NOTHING
    return sample.t, sm, memory, energy, pod_sm, sample.device_units, sample.merged_seconds or 0.0


@dataclass(frozen=True)
class SampleBatch:
    """Samples as columns for `Engine.observe_samples`: one agent snapshot without a GpuSample per sample.

    A row is one sample; its device-constant fields live once per device entry (`device[row]`
    indexes `uuids`, `nodes`, `parent_uuids`, `device_units`). The float columns hold what
    `sample_values` derives: NaN where not reported, `sm` NaN also for an unhealthy device,
    `memory` already a percent. `sample(row)` builds the row's sample; the engine asks only
    for the rows that end up as a device's latest (the reports read those).
    """

    uuids: Sequence[str]
    nodes: Sequence[str]
    parent_uuids: Sequence[str | None]
    device_units: Sequence[float]
    device: Sequence[int] | npt.NDArray[Any]  # the per-row columns: lists, or numpy arrays (int64, float64)
    t: Sequence[float] | npt.NDArray[Any]
    sm: Sequence[float] | npt.NDArray[Any]
    memory: Sequence[float] | npt.NDArray[Any]
    energy: Sequence[float] | npt.NDArray[Any]
    pod_sm: Sequence[dict[str, float] | None]
    sample: Callable[[int], LatestSample]
    #: each row's `merged_seconds` (0 for a single poll); None: every row is a single poll
    merged: Sequence[float] | npt.NDArray[Any] | None = None

    def __len__(self) -> int:
        return len(self.t)


@dataclass(slots=True, eq=False)
class Stretch:
    """Pod `pod_uid` holding `units` of device `uuid` over (start, end]; end is inf while it runs.

    Compared by identity (`eq=False`): two stretches with the same figures are still two holdings.
    """

    workload: Workload
    pod_uid: str
    uuid: str
    node: str | None
    units: float
    container: str | None
    start: float
    end: float = INFINITY
    #: end of the latest active piece applied to this stretch
    last_active: float = field(default=-INFINITY, init=False)


T = TypeVar("T")


class UniformColumn(Generic[T]):
    """A history column kept as one value and a length while every sample has the same value.

    A device's size never changes, most GPUs never report per-process figures and most polls
    are not merged, so these columns are mostly repeats of one value.
    The first differing value turns the column into the full sequence `materialize` builds.
    With `adopt`, an empty uniform column takes its first value as the repeated one (a MIG
    slice's 3/7); without, only `value` repeats (None: no per-process data).
    """

    __slots__ = ("_adopt", "_items", "_materialize", "_size", "_value")

    def __init__(self, value: T, materialize: Callable[[Iterable[T]], MutableSequence[T]], *, adopt: bool) -> None:
        self._value = value
        self._size = 0
        self._items: MutableSequence[T] | None = None
        self._materialize = materialize
        self._adopt = adopt

    @property
    def uniform(self) -> bool:
        """Whether the column is still one repeated value (then `self[0]` is every value)."""
        return self._items is None

    def _repeats(self, value: T) -> bool:
        """Whether `value` can join the uniform column (adopting it when the column is empty)."""
        if value is self._value or (value is not None and value == self._value):
            return True
        if self._adopt and self._size == 0:
            self._value = value
            return True
        return False

    def _expand(self) -> MutableSequence[T]:
        items = self._items
        if items is None:
            items = self._items = self._materialize([self._value] * self._size)
        return items

    def _check(self, index: int) -> None:
        if not -self._size <= index < self._size:
            raise IndexError("history column index out of range")

    def __len__(self) -> int:
        return self._size if self._items is None else len(self._items)

    def __iter__(self) -> Iterator[T]:
        if self._items is None:
            return iter([self._value] * self._size)
        return iter(self._items)

    def __getitem__(self, index: int) -> T:
        items = self._items
        if items is not None:
            return items[index]
        if not -self._size <= index < self._size:  # as `_check` (read for every sample: one call less)
            raise IndexError("history column index out of range")
        return self._value

    def __setitem__(self, index: int, value: T) -> None:
        if self._items is None:
            self._check(index)
            if self._size == 1 and self._adopt:
                self._value = value
                return
            if value is self._value or (value is not None and value == self._value):
                return
        self._expand()[index] = value

    def __delitem__(self, index: slice) -> None:
        items = self._items
        if items is None:
            self._size -= len(range(self._size)[index])
            return
        del items[index]
        # once the differing samples have aged out, the column is one value again
        first = items[0] if items else self._value
        if (self._adopt or first is self._value) and items.count(first) == len(items):
            self._value, self._size, self._items = first, len(items), None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, UniformColumn | list | array):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def append(self, value: T) -> None:
        if self._items is None and self._repeats(value):
            self._size += 1
        else:
            self._expand().append(value)

    def extend(self, values: Sequence[T]) -> None:
        if not values:
            return
        if self._items is None and self._repeats(values[0]) and values.count(self._value) == len(values):
            self._size += len(values)
        else:
            self._expand().extend(values)

    def insert(self, index: int, value: T) -> None:
        if self._items is None and self._repeats(value):
            self._size += 1
        else:
            self._expand().insert(index, value)

    def count(self, value: T) -> int:
        if self._items is None:
            return self._size if value is self._value or value == self._value else 0
        return self._items.count(value)


def _float_column(values: Iterable[float]) -> array[float]:
    return array("d", values)


class Gpu:
    """One physical GPU or MIG instance: its recent sample history and the stretches on it.

    The history is kept as parallel float arrays (NaN where a figure was not reported):
    a Python object per value would cost several times what the arrays do at a fleet's size.
    Sample i describes the interval (times[i-1], times[i]].
    """

    __slots__ = ("device_units", "energy", "latest", "memory", "merged", "node", "pod_sm", "pruned", "sm", "stretches",
                 "times", "uuid")

    def __init__(self, uuid: str, node: str | None) -> None:
        self.uuid = uuid
        self.node = node
        self.times = array("d")
        self.sm = array("d")
        self.memory = array("d")
        self.energy = array("d")
        self.device_units: UniformColumn[float] = UniformColumn(1.0, _float_column, adopt=True)
        self.pod_sm: UniformColumn[dict[str, float] | None] = UniformColumn(None, list, adopt=False)
        #: how much of each interval merged polls cover (gpuwm.feed.merge): 0 for a single poll
        self.merged: UniformColumn[float] = UniformColumn(0.0, _float_column, adopt=False)
        self.latest: LatestSample | None = None
        self.stretches: list[Stretch] = []
        self.pruned = False  # whether older samples were forgotten (the first kept is then not the first sample)

    @property
    def last_time(self) -> float | None:
        return self.times[-1] if self.times else None

    def point(self, index: int) -> SampleValues:
        """Point `index` of the history, as `append` took it (NaN where not reported)."""
        return (self.times[index], self.sm[index], self.memory[index], self.energy[index], self.pod_sm[index],
                self.device_units[index], self.merged[index])

    def append(self, values: SampleValues) -> None:
        """Add a point after the last. A uniform column's value almost always repeats: that case, once per
        sample, is one length increment here (`UniformColumn.append` would take two calls)."""
        t, sm, memory, energy, pod_sm, device_units, merged = values
        self.times.append(t)
        self.sm.append(sm)
        self.memory.append(memory)
        self.energy.append(energy)
        column = self.pod_sm
        if pod_sm is None and column._items is None and column._value is None:
            column._size += 1
        else:
            column.append(pod_sm)
        units_column = self.device_units
        if units_column._items is None and device_units == units_column._value:
            units_column._size += 1
        else:
            units_column.append(device_units)
        merged_column = self.merged
        if merged_column._items is None and merged == merged_column._value:
            merged_column._size += 1
        else:
            merged_column.append(merged)

    def _columns(self) -> tuple[Any, ...]:
        """The columns in SampleValues' order (`insert`, `replace`, `forget_before`; `append` writes them out)."""
        return self.times, self.sm, self.memory, self.energy, self.pod_sm, self.device_units, self.merged

    def insert(self, index: int, values: SampleValues) -> None:
        for column, value in zip(self._columns(), values, strict=True):
            column.insert(index, value)

    def replace(self, index: int, values: SampleValues) -> None:
        for column, value in zip(self._columns(), values, strict=True):
            column[index] = value

    def forget_before(self, index: int) -> None:
        """Drop samples 0..index-1 (their intervals are final)."""
        for column in self._columns():
            del column[:index]
        self.pruned = True

    def columns(self, raw: bool = False) -> dict[str, Any]:
        """The history as JSON-able columns (a few strings per GPU, not a list per sample): each float
        column base64 of its little-endian doubles (NaN kept). `podSm` is null when no sample carried
        per-process data; `units` (a device's size) is a plain number when every sample has the same.

        `raw` (the controller's state file, see gpuwm.accounting.rawcolumns): t, sm, memory,
        energy (and merged, where any point is) as one `RawDoubles` of the columns one after the
        other ("floats", with "floatColumns": 5 when merged is there). One piece per GPU, not five:
        with many GPUs of short histories a save costs per piece more than per byte.
        """
        units, pod_sm, merged = self.device_units, self.pod_sm, self.merged
        merged_any = merged.count(0.0) != len(merged)  # left out while no point is merged
        constant_units = units[0] if units and units.count(units[0]) == len(units) else None
        columns: dict[str, Any]
        encode: Callable[[array[float]], Any]
        if raw:
            encode = RawDoubles
            floats = [getattr(self, attribute) for _, attribute in _COLUMNS[:-1]]
            if merged_any:
                floats.append(array("d", merged))
            columns = {"floats": RawDoubles(b"".join(floats))}
            if merged_any:
                columns["floatColumns"] = len(floats)
        else:
            encode = _encode
            columns = {name: _encode(getattr(self, attribute)) for name, attribute in _COLUMNS[:-1]}
        columns["units"] = encode(array("d", units)) if constant_units is None else constant_units
        columns["podSm"] = None if pod_sm.count(None) == len(pod_sm) else list(pod_sm)
        if merged_any and not raw:  # raw: among the floats
            columns["merged"] = _encode(array("d", merged))
        return columns

    def load_columns(self, columns: dict[str, Any]) -> None:
        """Inverse of `columns`, into a new Gpu's empty history; raises ValueError when the columns disagree in length."""
        merged: array[float] | None = None
        if "floats" in columns:  # raw: t, sm, memory, energy (and merged) one after the other
            floats = _decode(columns["floats"])
            count = columns.get("floatColumns", len(_COLUMNS) - 1)
            if count not in (len(_COLUMNS) - 1, len(_COLUMNS)):
                raise ValueError(f"GPU {self.uuid}: saved history names {count!r} float columns, not 4 or 5")
            size, left = divmod(len(floats), count)
            if left:
                raise ValueError(f"GPU {self.uuid}: saved history holds {len(floats)} numbers, not {count} equal columns")
            for position, (_, attribute) in enumerate(_COLUMNS[:-1]):
                setattr(self, attribute, floats[position * size:(position + 1) * size])
            if count == len(_COLUMNS):
                merged = floats[(count - 1) * size:]
        else:
            for name, attribute in _COLUMNS[:-1]:
                setattr(self, attribute, _decode(columns[name]))
            if columns.get("merged") is not None:
                merged = _decode(columns["merged"])
        size = len(self.times)
        units = columns["units"]
        self.device_units.extend([float(units)] * size if isinstance(units, int | float) else _decode(units))
        pod_sm = columns["podSm"]
        self.pod_sm.extend([None] * size if pod_sm is None else [None if value is None else dict(value) for value in pod_sm])
        self.merged.extend([0.0] * size if merged is None else merged)
        if any(len(column) != size for column in self._columns()):
            raise ValueError(f"GPU {self.uuid}: saved history columns differ in length")


#: saved column name -> Gpu attribute ("units" last: saved as one number when constant)
_COLUMNS = (("t", "times"), ("sm", "sm"), ("memory", "memory"), ("energy", "energy"), ("units", "device_units"))


def _encode(column: array[float]) -> str:
    return RawDoubles(column).base64()


_decode = doubles_from_saved  # base64 text, or raw bytes from the controller's state file


class Pod:
    """A GPU pod: its state timeline (a later event replaces the state from its time on)."""

    __slots__ = ("labels", "moved_in", "name", "namespace", "stretches", "timeline", "uid", "workload")

    def __init__(self, uid: str, workload: Workload, event: PodEvent) -> None:
        self.uid = uid
        self.workload = workload
        self.name = event.name
        self.namespace = event.namespace
        self.labels: dict[str, str] = event.labels  # the frozen event's own: never changed here
        self.timeline: list[tuple[float, PodEvent]] = []
        self.stretches: list[Stretch] = []
        #: when the pod moved to this workload from another (its owner changed); -inf: it began here
        self.moved_in = -INFINITY

    @property
    def current(self) -> PodEvent:
        return self.timeline[-1][1]


class Workload:
    """A workload's pods, stretches and the figures applied so far."""

    __slots__ = (
        "active_gpu_seconds",
        "api_version",
        "created",
        "energy_joules",
        "first_run_start",
        "first_seen",
        "idle_gpu_seconds",
        "kind",
        "labels",
        "labels_key",
        "life_mem",
        "life_mem_units",
        "life_units",
        "life_util",
        "name",
        "namespace",
        "pods",
        "retired_last_active",
        "retired_runs",
        "revision",
        "stretches",
        "timeline",
        "uid",
        "unattributed_gpu_seconds",
        "unmonitored_gpu_seconds",
        "windows",
    )

    def __init__(self, uid: str, event: PodEvent | WorkloadEvent) -> None:
        """From the first event that names it: a pod's (its `workload`) or the workload object's own."""
        self.uid = uid
        self.namespace = event.namespace
        if isinstance(event, PodEvent):
            self.name = event.workload.name
            self.kind = event.workload.kind
            self.api_version = event.workload.api_version
            self.created = event.workload.created
        else:
            self.name = event.name
            self.kind = event.kind
            self.api_version = event.api_version
            self.created = event.created
        self.first_seen = event.t
        self.labels: dict[str, str] = event.labels  # of the newest pod event, for the project (not a copy)
        self.labels_key = (event.t, event.uid)  # which pod event `labels` came from
        #: the workload object's own states (WorkloadEvent), each from its time on; empty when only pods name it
        self.timeline: list[tuple[float, WorkloadEvent]] = []
        self.pods: dict[str, Pod] = {}
        self.stretches: list[Stretch] = []
        self.active_gpu_seconds = 0.0  # unit-seconds, as are idle and unmonitored
        self.idle_gpu_seconds = 0.0
        self.unmonitored_gpu_seconds = 0.0
        #: monitored unit-seconds whose utilisation came from the device because the processes seen could
        #: not explain a busy GPU (DESIGN §3's attribution rule)
        self.unattributed_gpu_seconds = 0.0
        self.energy_joules = 0.0
        self.life_units = 0.0  # monitored unit-seconds
        self.life_util = 0.0  # monitored unit-seconds x utilisation %
        self.life_mem_units = 0.0  # unit-seconds with memory known
        self.life_mem = 0.0  # those x memory %
        self.windows = WindowSums(fold_after_of(self.uid))
        self.first_run_start: float | None = None
        self.retired_runs: list[tuple[float, float]] = []  # merged runs of stretches no longer tracked
        self.retired_last_active = -INFINITY
        self.revision = 0  # bumped by every pod event of the workload (reports reuse figures of settled ones)
