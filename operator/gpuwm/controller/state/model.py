"""`ControllerState`: everything the status cycle changes and a restart must get back, in one object.

The runtime (`gpuwm.controller.runtime`) works on it, `recovery` rebuilds it, and it saves and
restores itself whole: one place says what the state file holds, instead of functions that reach
into the runtime field by field. kopf's handlers find it through the runtime kept in kopf's `memo`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gpuwm.accounting import Engine, EngineConfig, LazyEntries, saved_entries
from gpuwm.controller.pull import DeviceHolder, index_holders
from gpuwm.controller.status import ConditionMemo, CrOwner, memo_from_json, memo_to_json
from gpuwm.controller.watch import TrackedPod
from gpuwm.model import TraceWorkload, share_fields_set


@dataclass(eq=False)
class ControllerState:
    """What the controller knows between kopf events and status cycles (see each field).

    Saved by `save` (with the agents' positions and the cluster's identity, which live with the
    puller and the client) and read back by `restore`; `moved_at`, `cr_owner`, `baseline_cutoff`
    and `observed_idle` are rebuilt after a start instead of saved.
    """

    engine: Engine
    #: pod uid -> the GPU pod as last watched
    pods: dict[str, TrackedPod] = field(default_factory=dict)
    #: pod uid -> what the engine was last told (state_key as JSON)
    sent: dict[str, str] = field(default_factory=dict)
    #: pod uid -> when its workload last changed (its owner changed)
    moved_at: dict[str, float] = field(default_factory=dict)
    #: node -> the device holders its agent named
    holders_by_node: dict[str, list[DeviceHolder]] = field(default_factory=dict)
    #: pod uid (or namespace/name) -> its device holders, indexed from `holders_by_node`
    holders_by_pod: dict[str, list[DeviceHolder]] = field(default_factory=dict)
    #: workload uid -> GPUWorkloadMetrics name ("" for none)
    cr_names: dict[str, str] = field(default_factory=dict)
    #: (namespace, CR name) -> the workload it belongs to
    cr_owner: dict[tuple[str, str], CrOwner] = field(default_factory=dict)
    #: workload uid -> its conditions as last written
    conditions: dict[str, tuple[ConditionMemo, ...]] = field(default_factory=dict)
    #: workloads whose current idle spell had its GpuIdle Event
    idle_announced: set[str] = field(default_factory=set)
    latest_sample_time: float | None = None
    #: workload uid -> figures from its CR's status, when no engine state survived a restart
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)
    baseline_cutoff: float | None = None
    #: workload uid -> seconds of its current idle stretch observed, as of the latest cycle (see IdleWatch)
    observed_idle: dict[str, float] = field(default_factory=dict)
    #: the idle-policy room's memory (`PolicyRoom.save`: its evaluator, rates, workloads' trails), as JSON
    policies: dict[str, Any] = field(default_factory=dict)

    def save(self, now: float, *, agents: dict[str, Any], cluster: str | None, lazy: bool = False,
             raw: bool = False) -> dict[str, Any]:
        """Everything a restarted controller needs to carry on exactly (JSON-serialisable).

        `agents`: the puller's positions; `cluster`: which cluster this is (see `recovery.cluster_identity`).
        `lazy`, `raw`: as `Engine.save` takes them; `persistence.encode_state_chunks` must encode the state
        before the engine changes again.
        """
        return {
            "saved_at": now,
            "engine": self.engine.save(lazy, raw),
            "agents": agents,
            # a node's holders an entry (lazy: a section of the state file)
            "holders": (LazyEntries(list(self.holders_by_node.items()), _node_holders_to_json) if lazy
                        else [_node_holders_to_json(item) for item in self.holders_by_node.items()]),
            "pods": (LazyEntries(list(self.pods.values()), _pod_to_json) if lazy
                     else [_pod_to_json(pod) for pod in self.pods.values()]),
            "sent": self.sent,
            "cr_names": self.cr_names,
            "conditions": {uid: [memo_to_json(memo) for memo in memos] for uid, memos in self.conditions.items()},
            "idle_announced": sorted(self.idle_announced),
            "latest_sample_time": self.latest_sample_time,
            "baselines": self.baselines,
            "policies": self.policies,
            "cluster": cluster,
        }

    @classmethod
    def restore(cls, saved: dict[str, Any], config: EngineConfig, adopted: ControllerState | None = None
                ) -> ControllerState:
        """The state `save` wrote, read whole before anything uses it (a damaged section raises here).

        `adopted`: what was learnt from the existing CRs before (their names and owners); the saved
        names win over it. The saved dict's entries are consumed as they are read: what is built reuses
        their memory, and restored fields-sets are shared (see `persist.restore_state`).
        """
        engine = Engine.restore(saved["engine"], config, consume=True)
        holders_by_node = {node: [share_fields_set(DeviceHolder.model_validate(h)) for h in holders]
                           for node, holders in _saved_holders(saved.get("holders") or [])}
        pods = {pod.uid: pod for pod in map(_pod_from_json, saved_entries(saved.get("pods") or [], consume=True))}
        cr_names = dict(adopted.cr_names) if adopted is not None else {}
        cr_names.update({str(k): str(v) for k, v in (saved.get("cr_names") or {}).items()})
        return cls(
            engine=engine,
            pods=pods,
            sent={str(k): str(v) for k, v in (saved.get("sent") or {}).items()},
            holders_by_node=holders_by_node,
            holders_by_pod=index_holders(holders_by_node),
            cr_names=cr_names,
            cr_owner=dict(adopted.cr_owner) if adopted is not None else {},
            conditions={uid: tuple(memo_from_json(c) for c in conditions)
                        for uid, conditions in (saved.get("conditions") or {}).items()},
            idle_announced=set(saved.get("idle_announced") or []),
            latest_sample_time=saved.get("latest_sample_time"),
            baselines={uid: dict(values) for uid, values in (saved.get("baselines") or {}).items()},
            policies=dict(saved.get("policies") or {}),
        )

    def forget_pod(self, uid: str) -> None:
        """A pod that is gone: nothing is kept for it."""
        self.pods.pop(uid, None)
        self.sent.pop(uid, None)
        self.moved_at.pop(uid, None)
        self.holders_by_pod.pop(uid, None)


def _pod_to_json(pod: TrackedPod) -> dict[str, Any]:
    return {
        "namespace": pod.namespace, "name": pod.name, "uid": pod.uid, "phase": pod.phase, "node": pod.node,
        "labels": pod.labels, "units": pod.units_by_container, "since": pod.phase_since, "created": pod.created,
        "workload": pod.workload.model_dump(by_alias=True),
    }


def _pod_from_json(data: dict[str, Any]) -> TrackedPod:
    return TrackedPod(
        namespace=data["namespace"], name=data["name"], uid=data["uid"], phase=data["phase"], node=data.get("node"),
        labels=dict(data.get("labels") or {}), units_by_container=dict(data.get("units") or {}),
        workload=share_fields_set(TraceWorkload.model_validate(data["workload"])), phase_since=data.get("since"),
        created=data.get("created"),
    )


def _node_holders_to_json(item: tuple[str, list[DeviceHolder]]) -> dict[str, Any]:
    node, holders = item
    return {"node": node, "holders": [holder.model_dump(exclude_none=True) for holder in holders]}


def _saved_holders(saved: Any) -> Iterator[tuple[str, list[Any]]]:
    """(node, its holders) of a saved state's {"node", "holders"} entries (a list or a section), consumed as read."""
    for entry in saved_entries(saved, consume=True):
        yield entry["node"], entry["holders"]
