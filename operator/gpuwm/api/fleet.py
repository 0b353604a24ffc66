"""Fleet views: every node and GPU now (`/api/v1/nodes`, `/api/v1/gpus`) and one GPU's history.

Read from the store alone, so `gpuwm api` on its own serves them as the controller does: the devices a
running workload holds come with its latest figures (health, monitoring, activity as the engine saw them);
the devices nobody holds come from the store's per-device series over the last few status intervals (a
device without a utilisation point there is unmonitored). Stand-in devices (`unnamed/…`, a pod's GPUs no
agent has named yet) are not GPUs of the fleet: their units show on the node as `unnamedUnits`.

The devices' series are read in one query where the store answers them all at once, else node by node
(`FleetReader`): a fleet of more devices than the store's series limit (MAX_SERIES_PER_QUERY) answers as
a small one, each store read holding at most one node's devices, and a page of a list reads only its nodes.
The routes are in gpuwm.api.routes.fleet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gpuwm.api.params import decode_continue, encode_continue
from gpuwm.api.schemas import CONTINUE
from gpuwm.model import GpuFigures, GpuHolding, GpuIdentity, WorkloadFigures
from gpuwm.store import QueryError, RangeQuery, Series, Store

#: a device's latest figures are looked for in this many status intervals before the store's latest time
RECENT_INTERVALS = 4
#: the cells of that grid that hold the latest interval's point (see `_sampled_lately`)
LATEST_CELLS = 2
#: the prefix of stand-in devices (gpuwm.controller.watch.pods.UNNAMED_DEVICE_PREFIX; the API sits below the
#: controller's layer, so the value is repeated here and a unit test keeps the two equal)
UNNAMED_DEVICE_PREFIX = "unnamed/"
GpuState = Literal["active", "idle-held", "allocated-empty", "free", "unhealthy", "unmonitored"]
GPU_STATES: tuple[str, ...] = get_args(GpuState)
#: a state that says more about a shared device wins when its holders differ
_STATE_RANK = {state: rank for rank, state in enumerate(("unhealthy", "unmonitored", "active", "idle-held",
                                                         "allocated-empty", "free"))}
_LATEST_METRICS = (
    "gpu_utilization_percent",
    "gpu_memory_used_bytes",
    "gpu_memory_total_bytes",
    "gpu_power_watts",
    "gpu_allocated",
)
#: the most devices or nodes one page of GET /api/v1/gpus or /api/v1/nodes lists (`limit`)
MAX_PAGE_ITEMS = 5000


class _Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)


class GpuHolder(GpuHolding):
    model_config = _Camel.model_config


class GpuView(GpuIdentity):
    """One device now: a whole GPU, a MIG instance, or a MIG-partitioned GPU (`migParent`)."""

    model_config = _Camel.model_config
    mig_parent: bool = Field(default=False, description="A GPU split into MIG instances: its instances are the capacity.")
    allocated_units: float = 0.0
    state: GpuState
    holders: list[GpuHolder] = Field(default_factory=list)
    utilization_percent: float | None = Field(default=None, description="The device's SM % in its latest sample.")
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    healthy: bool | None = Field(default=None, description="Known for held devices; None where not known.")
    error: str | None = None
    last_sample_time: float | None = Field(default=None, description="Epoch seconds of its latest sample.")


class NodeView(_Camel):
    name: str
    gpus: int = Field(description="Devices that are capacity: whole GPUs and MIG instances, not MIG parents.")
    total_units: float
    allocated_units: float
    unnamed_units: float = Field(default=0.0, description="Units held by pods whose devices no agent has named yet.")
    states: dict[str, int] = Field(description="Devices per state.")
    models: list[str]
    utilization_percent: float | None = Field(default=None, description="Mean SM % of its monitored devices.")
    last_sample_time: float | None = None


class GpuList(_Camel):
    at: float | None = Field(description="The store's latest time: what `now` is for these states.")
    gpus: list[GpuView]
    continue_: str | None = CONTINUE


class NodeList(_Camel):
    at: float | None
    nodes: list[NodeView]
    continue_: str | None = CONTINUE


def holder_state(gpu: GpuFigures) -> GpuState:
    """DESIGN §3's per-GPU state of a held device: a process holding memory while SM is below threshold is
    idle-held; no memory used is allocated-empty (the sample carries no process count, memory tells)."""
    if not gpu.healthy:
        return "unhealthy"
    if not gpu.monitored:
        return "unmonitored"
    if gpu.active:
        return "active"
    return "idle-held" if (gpu.memory_used_bytes or 0.0) > 0.0 else "allocated-empty"


def _latest(points: list[tuple[float, float | None]]) -> tuple[float | None, float | None]:
    for t, value in reversed(points):
        if value is not None:
            return t, value
    return None, None


def _sampled_lately(utilization: Series | None) -> bool:
    """A device nobody holds is monitored where its utilisation has a point in the latest status interval: the
    last cell of the recent grid, or the one before where the latest interval's time is not on the store's
    step (its point then sits in the cell before)."""
    if utilization is None:
        return False
    return any(value is not None for _, value in utilization.points[-LATEST_CELLS:])


def _latest_of(by_metric: dict[str, Series], metric: str) -> float | None:
    return _latest(by_metric[metric].points)[1] if metric in by_metric else None


def build_fleet(
    workloads: Iterable[WorkloadFigures], recent: Sequence[Series], node: str | None = None
) -> tuple[list[GpuView], dict[str, float]]:
    """Every device now (of `node` only, where given), and the stand-in units per node. Pure: the tests call
    it with figures they made."""
    held: dict[str, list[GpuFigures]] = {}
    unnamed: dict[str, float] = {}
    for workload in workloads:
        if workload.end_time is not None or workload.allocated_gpus <= 0:
            continue
        for gpu in workload.gpus:
            if node is not None and gpu.node != node:
                continue
            if gpu.uuid.startswith(UNNAMED_DEVICE_PREFIX):
                unnamed[gpu.node] = unnamed.get(gpu.node, 0.0) + gpu.units
            else:
                held.setdefault(gpu.uuid, []).append(gpu)
    # the devices' own series (pod label empty: the device as nobody holds it, or the part nobody holds)
    free_series: dict[str, dict[str, Series]] = {}
    for series in recent:
        uuid = series.labels.get("uuid", "")
        if uuid and not uuid.startswith(UNNAMED_DEVICE_PREFIX) and not series.labels.get("pod"):
            free_series.setdefault(uuid, {})[series.metric] = series
    views: dict[str, GpuView] = {}
    for uuid, holders in held.items():
        first = holders[0]
        states = sorted((holder_state(gpu) for gpu in holders), key=_STATE_RANK.__getitem__)
        views[uuid] = GpuView(
            **{name: getattr(first, name) for name in GpuIdentity.model_fields},
            allocated_units=sum(gpu.units for gpu in holders), state=states[0],
            holders=[GpuHolder.model_validate(gpu, from_attributes=True) for gpu in holders],
            utilization_percent=first.sm_percent, memory_used_bytes=first.memory_used_bytes,
            memory_total_bytes=first.memory_total_bytes, power_watts=first.power_watts,
            healthy=all(gpu.healthy for gpu in holders), error=next((g.error for g in holders if g.error), None),
            last_sample_time=max((g.last_sample_time for g in holders if g.last_sample_time is not None), default=None),
        )
    for uuid, by_metric in free_series.items():
        if uuid in views:
            continue
        labels = next(iter(by_metric.values())).labels
        sm = by_metric.get("gpu_utilization_percent")
        sampled_at, utilization = _latest(sm.points) if sm is not None else (None, None)
        index = labels.get("gpu")
        views[uuid] = GpuView(
            node=labels.get("node", ""), uuid=uuid, index=int(index) if index and index.isdigit() else None,
            model=labels.get("model") or None, state="free" if _sampled_lately(sm) else "unmonitored",
            utilization_percent=utilization, memory_used_bytes=_latest_of(by_metric, "gpu_memory_used_bytes"),
            memory_total_bytes=_latest_of(by_metric, "gpu_memory_total_bytes"),
            power_watts=_latest_of(by_metric, "gpu_power_watts"),
            last_sample_time=sampled_at,
        )
    _link_mig(views)
    return sorted(views.values(), key=gpu_order), unnamed


def gpu_order(view: GpuView) -> tuple[str, int, bool, str]:
    """The lists' order: by node and index, a MIG parent before its instances."""
    return view.node, view.index if view.index is not None else -1, view.mig_parent is False, view.uuid


def _link_mig(views: dict[str, GpuView]) -> None:
    """A MIG instance's parent is the GPU of the same node and index (free instances carry no parent label)."""
    whole: dict[tuple[str, int | None], GpuView] = {(v.node, v.index): v for v in views.values() if not v.uuid.startswith("MIG-") and v.index is not None}
    for view in views.values():
        if view.parent_uuid is None and view.uuid.startswith("MIG-"):
            parent = whole.get((view.node, view.index))
            if parent is not None:
                view.parent_uuid = parent.uuid
    parents = {v.parent_uuid for v in views.values() if v.parent_uuid}
    for view in views.values():
        if view.uuid in parents:
            view.mig_parent = True
            view.device_units = 0.0  # its instances are the capacity
        elif view.parent_uuid is not None and view.device_units >= 1.0 and view.mig_profile is None:
            view.device_units = 0.0  # a free instance whose size the store does not know: no capacity claimed
        if view.mig_parent and view.state == "free":
            children = [v for v in views.values() if v.parent_uuid == view.uuid]
            view.state = min((c.state for c in children), key=_STATE_RANK.__getitem__, default="free")


def build_nodes(gpus: Sequence[GpuView], unnamed: dict[str, float]) -> list[NodeView]:
    names = sorted({gpu.node for gpu in gpus} | set(unnamed))
    nodes = []
    for name in names:
        mine = [gpu for gpu in gpus if gpu.node == name]
        capacity = [gpu for gpu in mine if not gpu.mig_parent]
        monitored = [gpu.utilization_percent for gpu in capacity if gpu.utilization_percent is not None]
        nodes.append(NodeView(
            name=name, gpus=len(capacity), total_units=round(sum(gpu.device_units for gpu in capacity), 6),
            allocated_units=round(sum(gpu.allocated_units for gpu in capacity), 6),
            unnamed_units=round(unnamed.get(name, 0.0), 6), states=Counter(gpu.state for gpu in capacity),
            models=sorted({gpu.model for gpu in mine if gpu.model}),
            utilization_percent=sum(monitored) / len(monitored) if monitored else None,
            last_sample_time=max((g.last_sample_time for g in mine if g.last_sample_time is not None), default=None),
        ))
    return nodes


class FleetReader:
    """The fleet now, node by node (blocking: run off the loop).

    The running workloads are read once; the devices' recent series in one cluster query where the store
    answers it, else one query per node as a node is asked for, so that no read holds more than one node's
    devices beyond the store's series limit and a page reads only the nodes it lists.
    """

    def __init__(self, store: Store, status_interval_seconds: float) -> None:
        self._store = store
        self.at = store.latest_time()
        self._step = max(status_interval_seconds, 1.0)
        #: the running workloads holding a device on each node
        self._holders: dict[str, list[WorkloadFigures]] = {}
        #: the recent series by node, where one query answered them all; None: read per node
        self._recent: dict[str, list[Series]] | None = None
        if self.at is None:
            self.nodes: list[str] = []
            return
        for workload in store.workloads():
            if workload.end_time is None and workload.allocated_gpus > 0:
                for name in {gpu.node for gpu in workload.gpus}:
                    self._holders.setdefault(name, []).append(workload)
        names = set(self._holders)
        try:
            recent = store.query_range(self._query("cluster", ""))
        except QueryError:  # more series than one query may answer: each node's own
            names.update(store.nodes())
        else:
            self._recent = {}
            for series in recent:
                self._recent.setdefault(series.labels.get("node", ""), []).append(series)
            names.update(self._recent)
        #: every node that may have a device or stand-in units now, in the lists' order
        self.nodes = sorted(names)

    def _query(self, scope: Literal["cluster", "node"], key: str) -> RangeQuery:
        assert self.at is not None
        return RangeQuery(scope, key, _LATEST_METRICS, self.at - RECENT_INTERVALS * self._step, self.at, self._step,
                          "gpu")

    def node(self, name: str) -> tuple[list[GpuView], float | None]:
        """One node's devices now and its stand-in units (None: no pod holds units of unnamed devices there)."""
        if self._recent is not None:
            recent = self._recent.get(name, [])
        else:
            recent = self._store.query_range(self._query("node", name))
        gpus, unnamed = build_fleet(self._holders.get(name, ()), recent, node=name)
        return [gpu for gpu in gpus if gpu.node == name], unnamed.get(name)

    def devices(self, after: tuple[str, int, bool, str] | None = None) -> Iterator[GpuView]:
        """Every device now in the lists' order (after the one whose `gpu_order` is `after`), a node at a time."""
        for name in self.nodes:
            if after is not None and name < after[0]:
                continue
            gpus, _unnamed = self.node(name)
            yield from (gpu for gpu in gpus if after is None or gpu_order(gpu) > after)

    def holder_node(self, uuid: str) -> str | None:
        """The node of a device a running workload holds (found without reading any series)."""
        for name, workloads in self._holders.items():
            if any(gpu.uuid == uuid for workload in workloads for gpu in workload.gpus if gpu.node == name):
                return name
        return None


def _gpu_cursor(key: Any) -> tuple[str, int, bool, str]:
    node, index, whole, uuid = key
    if not isinstance(index, int) or not isinstance(whole, bool):
        raise TypeError(key)
    return str(node), index, whole, str(uuid)


def _node_cursor(key: Any) -> str:
    (name,) = key
    if not isinstance(name, str):
        raise TypeError(key)
    return name


def page_of_gpus(
    store: Store, status_interval_seconds: float, node: str | None, state: str | None, limit: int | None,
    cursor: str | None,
) -> GpuList:
    """The devices now (of `node`, in `state`, where given): `limit` of them after `cursor` and the next page's
    token, reading only the nodes the page lists (blocking: run off the loop)."""
    after = decode_continue(cursor, _gpu_cursor) if cursor is not None else None
    reader = FleetReader(store, status_interval_seconds)
    if node is not None:
        reader.nodes = [name for name in reader.nodes if name == node]
    page: list[GpuView] = []
    for gpu in reader.devices(after):
        if state is not None and gpu.state != state:
            continue
        if limit is not None and len(page) == limit:
            return GpuList(at=reader.at, gpus=page, continue_=encode_continue(gpu_order(page[-1])))
        page.append(gpu)
    return GpuList(at=reader.at, gpus=page)


def page_of_nodes(store: Store, status_interval_seconds: float, limit: int | None, cursor: str | None) -> NodeList:
    """The GPU nodes now: `limit` of them after `cursor` and the next page's token (blocking: run off the loop)."""
    after = decode_continue(cursor, _node_cursor) if cursor is not None else None
    reader = FleetReader(store, status_interval_seconds)
    nodes: list[NodeView] = []
    for name in reader.nodes:
        if after is not None and name <= after:
            continue
        gpus, unnamed = reader.node(name)
        if not gpus and unnamed is None:  # a node the store keeps series of, none of them recent: not listed
            continue
        if limit is not None and len(nodes) == limit:
            return NodeList(at=reader.at, nodes=nodes, continue_=encode_continue([nodes[-1].name]))
        nodes += build_nodes(gpus, {name: unnamed} if unnamed is not None else {})
    return NodeList(at=reader.at, nodes=nodes)


def find_gpu(store: Store, status_interval_seconds: float, uuid: str) -> GpuView | None:
    """One device now: from its holder's node where a running workload holds it, else node by node until
    found (blocking: run off the loop)."""
    reader = FleetReader(store, status_interval_seconds)
    held_on = reader.holder_node(uuid)
    for name in [held_on] if held_on is not None else reader.nodes:
        found = next((gpu for gpu in reader.node(name)[0] if gpu.uuid == uuid), None)
        if found is not None:
            return found
    return None
