"""Save and restore the engine's whole state as plain JSON-able data.

The controller saves this each interval and restores it after a restart, so cumulative
figures are not lost and results afterwards are identical to an engine that never
stopped (the order of every list is kept: float sums depend on it).
"""

from __future__ import annotations

import binascii
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, overload

from pydantic import TypeAdapter

from gpuwm.accounting.rawcolumns import RawJson
from gpuwm.accounting.state import INFINITY, Gpu, Pod, Stretch, Workload
from gpuwm.accounting.windows import WindowSums, fold_after_of
from gpuwm.model import DeviceReading, GpuSample, LatestSample, NamespaceEvent, PodEvent, WorkloadEvent

STATE_VERSION = 2
#: a device's latest reading as JSON: GpuSample's fields in its order, as a validated sample saves
_READING = TypeAdapter(DeviceReading)


class StateError(ValueError):
    """Saved engine state that cannot be restored (wrong version, missing or bad field)."""


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else value


class LazyEntries(Sequence[dict[str, Any]]):
    """A saved list whose entries are built when read: `save_state(core, lazy=True)`'s big lists.

    The controller streams the state to its file a batch of entries at a time, so only a batch
    is alive, not the whole state (dicts and base64 strings, more than the file): that would
    make the controller's peak RSS. Reading an entry twice builds the same entry twice.
    """

    __slots__ = ("_build", "_items")

    def __init__(self, items: list[Any], build: Callable[[Any], dict[str, Any]]) -> None:
        self._items = items
        self._build = build

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [self._build(item) for item in self._items[index]]
        return self._build(self._items[index])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self._build(item) for item in self._items)


def save_state(core: Any, lazy: bool = False, raw: bool = False) -> dict[str, Any]:
    """The engine's state; with `lazy`, its workloads, pods and GPUs are `LazyEntries`, built from the
    engine's records when read; with `raw`, window segments and GPU histories are `RawDoubles` (the columns
    themselves, for the controller's state file, which writes them as bytes), not base64 text. Either must
    be encoded before the engine changes again.
    """
    entries = _Entries(core, raw)

    def listed(records: list[Any], build: Callable[[Any], dict[str, Any]]) -> Sequence[dict[str, Any]]:
        return LazyEntries(records, build) if lazy else [build(record) for record in records]

    return {
        "version": STATE_VERSION,
        "clock": _finite(core.clock),
        "lastMaintenance": _finite(core._last_maintenance),
        "lateSamplesDropped": core.late_samples_dropped,
        "unattributedSamples": core.unattributed_samples,
        "namespaces": [event.model_dump(by_alias=True, mode="json") for event in core.namespaces.values()],
        "migChildren": core.mig_children,
        "workloads": listed(entries.workload_records, entries.workload),
        "pods": listed(entries.pod_records, entries.pod),
        "gpus": listed(entries.gpu_records, entries.gpu),
        # lazy too: the controller's state file makes each lazy list a section it restores an entry at a time
        "stretches": LazyEntries(entries.stretches, _same) if lazy else entries.stretches,
    }


class _Entries:
    """The saved entries of one engine's records. Stretches are saved once and named by their position
    (`stretch_ids`), in the order the workloads, pods and GPUs name them: the same ids however the lazy
    entries are read."""

    def __init__(self, core: Any, raw: bool) -> None:
        self.raw = raw
        self.workload_records: list[Workload] = list(core.workload_records.values())
        self.pod_records: list[Pod] = list(core.pods.values())
        self.gpu_records: list[Gpu] = list(core.gpu_records.values())
        # a pod that moved to another workload keeps its old record under another key (EngineCore._rehome)
        self.pod_keys = {id(pod): key for key, pod in core.pods.items()}
        self.stretch_ids: dict[int, int] = {}
        self.stretches: list[dict[str, Any]] = []
        for records in (self.workload_records, self.pod_records, self.gpu_records):
            for record in records:
                for stretch in record.stretches:
                    self._name(stretch)

    def _name(self, stretch: Stretch) -> None:
        if id(stretch) in self.stretch_ids:
            return
        self.stretch_ids[id(stretch)] = len(self.stretches)
        self.stretches.append({
            "workload": stretch.workload.uid, "pod": stretch.pod_uid, "uuid": stretch.uuid, "node": stretch.node,
            "units": stretch.units, "container": stretch.container, "start": stretch.start,
            "end": _finite(stretch.end), "lastActive": _finite(stretch.last_active),
        })

    def _ids(self, stretches: list[Stretch]) -> list[int]:
        return [self.stretch_ids[id(stretch)] for stretch in stretches]

    def workload(self, workload: Workload) -> dict[str, Any]:
        return {
            "uid": workload.uid,
            "namespace": workload.namespace,
            "name": workload.name,
            "kind": workload.kind,
            "apiVersion": workload.api_version,
            "created": workload.created,
            "firstSeen": workload.first_seen,
            "labels": workload.labels,
            "labelsKey": list(workload.labels_key),
            "activeSeconds": workload.active_gpu_seconds,
            "idleSeconds": workload.idle_gpu_seconds,
            "unmonitoredSeconds": workload.unmonitored_gpu_seconds,
            "unattributedSeconds": workload.unattributed_gpu_seconds,
            "energyJoules": workload.energy_joules,
            "life": [workload.life_units, workload.life_util, workload.life_mem_units, workload.life_mem],
            "windows": workload.windows.to_raw() if self.raw else workload.windows.to_base64(),
            "windowsCapacity": workload.windows.capacity,
            "firstRunStart": workload.first_run_start,
            "retiredRuns": [list(run) for run in workload.retired_runs],
            "retiredLastActive": _finite(workload.retired_last_active),
            "stretches": self._ids(workload.stretches),
            "pods": [self.pod_keys.get(id(pod), uid) for uid, pod in workload.pods.items()],
            "objectTimeline": [[t, event.model_dump(by_alias=True, mode="json")] for t, event in workload.timeline],
        }

    def pod(self, pod: Pod) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "uid": pod.uid,
            "workload": pod.workload.uid,
            "name": pod.name,
            "namespace": pod.namespace,
            "labels": pod.labels,
            "timeline": [[t, self._json(event, by_alias=True)] for t, event in pod.timeline],
            "stretches": self._ids(pod.stretches),
        }
        key = self.pod_keys.get(id(pod), pod.uid)
        if key != pod.uid:
            entry["key"] = key
        if pod.moved_in > -INFINITY:
            entry["movedIn"] = pod.moved_in
        return entry

    def gpu(self, gpu: Gpu) -> dict[str, Any]:
        return {
            "uuid": gpu.uuid,
            "node": gpu.node,
            "history": gpu.columns(self.raw),
            "pruned": gpu.pruned,
            "latest": None if gpu.latest is None else self._json(gpu.latest, by_alias=False),
            "stretches": self._ids(gpu.stretches),
        }

    def _json(self, model: PodEvent | LatestSample, by_alias: bool) -> Any:
        if isinstance(model, DeviceReading):
            return RawJson(_READING.dump_json(model)) if self.raw else _READING.dump_python(model, mode="json")
        if self.raw:  # serialised at once, not as a dict (see RawJson)
            return RawJson(model.model_dump_json(by_alias=by_alias).encode())
        return model.model_dump(by_alias=by_alias, mode="json")


def _same(entry: dict[str, Any]) -> dict[str, Any]:
    return entry


def restore_state(core: Any, state: dict[str, Any], consume: bool = False) -> None:
    """Fill an empty engine `core` from `state`; raises StateError naming what is wrong.

    `consume`: each entry of the state's big lists is dropped from it once restored (the controller's
    restart, whose loaded state is garbage afterwards). The loaded JSON's small objects fill Python's
    memory arenas and the restored engine keeps a few of them: freed only at the end, the JSON would
    leave arenas mostly empty but held; dropped as it goes, its memory is reused by the engine's own.
    """
    if state.get("version") != STATE_VERSION:
        raise StateError(f"engine state version {state.get('version')!r} is not {STATE_VERSION}; "
                         "start afresh")
    try:
        _restore(core, state, consume)
    except (KeyError, TypeError, ValueError, IndexError, binascii.Error) as error:
        raise StateError(f"engine state is malformed: {type(error).__name__}: {error}") from None


def saved_entries(entries: Iterable[Any], consume: bool) -> Iterator[Any]:
    """The entries of a saved list in order; with `consume`, each is let go once read (see `restore_state`;
    the controller's own saved lists are read so too): taken out of a list, or a section of the
    controller's state file read once (anything with a `consume()`, `persistence.SavedLines`)."""
    if consume and callable(getattr(entries, "consume", None)):
        yield from entries.consume()  # type: ignore[attr-defined]
        return
    for index, entry in enumerate(entries):
        if consume and isinstance(entries, list):
            entries[index] = None
        yield entry


#: a saved pod until its workload is restored: (timeline, name, namespace, labels, stretch ids, uid, moved in)
_SavedPod = tuple[list[tuple[float, PodEvent]], str, str, dict[str, str], list[int], str, float]


def _restore(core: Any, state: dict[str, Any], consume: bool) -> None:
    """Each of the state's lists read once, in turn (pods, workloads, stretches, GPUs): a consumed state's
    entries go as they are read, and what is built reuses their memory."""
    clock = state["clock"]
    core.clock = -INFINITY if clock is None else float(clock)
    last = state["lastMaintenance"]
    core._last_maintenance = -INFINITY if last is None else float(last)
    core.late_samples_dropped = int(state["lateSamplesDropped"])
    core.unattributed_samples = int(state["unattributedSamples"])
    core.mig_children = {parent: list(children) for parent, children in state["migChildren"].items()}
    for raw in state["namespaces"]:
        event = NamespaceEvent.model_validate(raw)
        core.namespaces[event.name] = event
    saved_pods: dict[str, _SavedPod] = {}
    for raw in saved_entries(state["pods"], consume):
        timeline = [(float(t), PodEvent.model_validate(event)) for t, event in raw["timeline"]]
        saved_pods[raw.get("key", raw["uid"])] = (
            timeline, raw["name"], raw["namespace"], raw["labels"], raw["stretches"], raw["uid"],
            float(raw.get("movedIn", -INFINITY)),
        )
    links: list[tuple[Workload, list[int], list[str]]] = []  # each workload's stretch ids and pods, linked below
    for raw in saved_entries(state["workloads"], consume):
        workload = _workload(raw, saved_pods)
        core.workload_records[workload.uid] = workload
        links.append((workload, raw["stretches"], raw["pods"]))
    stretches = [_stretch(core, raw) for raw in saved_entries(state["stretches"], consume)]
    for workload, stretch_ids, pod_keys in links:
        workload.stretches = [stretches[index] for index in stretch_ids]
        for pod_key in pod_keys:
            pod = _pod(workload, saved_pods[pod_key], stretches)
            workload.pods[pod.uid] = pod
            core.pods[pod_key] = pod
    for raw in saved_entries(state["gpus"], consume):
        gpu = Gpu(raw["uuid"], raw["node"])
        gpu.load_columns(raw["history"])
        gpu.pruned = bool(raw["pruned"])
        gpu.latest = None if raw["latest"] is None else GpuSample.model_validate(raw["latest"])
        gpu.stretches = [stretches[index] for index in raw["stretches"]]
        core.gpu_records[gpu.uuid] = gpu


def _workload(raw: dict[str, Any], saved_pods: dict[str, _SavedPod]) -> Workload:
    """A saved workload, without its stretches and pods (linked once every stretch is restored)."""
    object_timeline = [(float(t), WorkloadEvent.model_validate(event)) for t, event in raw.get("objectTimeline", [])]
    first: PodEvent | WorkloadEvent | None = saved_pods[raw["pods"][0]][0][0][1] if raw["pods"] else None
    if first is None and object_timeline:
        first = object_timeline[0][1]
    if first is None:
        raise ValueError(f"workload {raw['uid']} has no pods and no object events")
    workload = Workload(raw["uid"], first)
    workload.timeline = object_timeline
    workload.namespace = raw["namespace"]
    workload.name = raw["name"]
    workload.kind = raw["kind"]
    workload.api_version = raw["apiVersion"]
    workload.created = raw["created"]
    workload.first_seen = raw["firstSeen"]
    workload.labels = dict(raw["labels"])
    workload.labels_key = (raw["labelsKey"][0], raw["labelsKey"][1])
    workload.active_gpu_seconds = raw["activeSeconds"]
    workload.idle_gpu_seconds = raw["idleSeconds"]
    workload.unmonitored_gpu_seconds = raw["unmonitoredSeconds"]
    workload.unattributed_gpu_seconds = raw["unattributedSeconds"]
    workload.energy_joules = raw["energyJoules"]
    workload.life_units, workload.life_util, workload.life_mem_units, workload.life_mem = raw["life"]
    workload.windows = WindowSums.from_base64(raw["windows"], fold_after_of(workload.uid), raw["windowsCapacity"])
    workload.first_run_start = raw["firstRunStart"]
    workload.retired_runs = [(run[0], run[1]) for run in raw["retiredRuns"]]
    retired = raw["retiredLastActive"]
    workload.retired_last_active = -INFINITY if retired is None else retired
    return workload


def _stretch(core: Any, raw: dict[str, Any]) -> Stretch:
    stretch = Stretch(core.workload_records[raw["workload"]], raw["pod"], raw["uuid"], raw["node"], raw["units"],
                      raw["container"], raw["start"], INFINITY if raw["end"] is None else raw["end"])
    stretch.last_active = -INFINITY if raw["lastActive"] is None else raw["lastActive"]
    return stretch


def _pod(workload: Workload, saved: _SavedPod, stretches: list[Stretch]) -> Pod:
    timeline, name, namespace, labels, stretch_ids, uid, moved_in = saved
    pod = Pod(uid, workload, timeline[-1][1])
    pod.moved_in = moved_in
    pod.name = name
    pod.namespace = namespace
    pod.labels = dict(labels)
    pod.timeline = timeline
    pod.stretches = [stretches[index] for index in stretch_ids]
    return pod


__all__ = ["STATE_VERSION", "LazyEntries", "StateError", "restore_state", "save_state", "saved_entries"]
