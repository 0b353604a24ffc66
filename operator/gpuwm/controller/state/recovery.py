"""Restart without losing GPU-seconds.

Before any new sample is taken the runtime is put back where it stopped:
1. the engine's saved state (`Engine.restore`), with the agents' `since` positions, the
   device attribution and what each pod's last engine event was, so nothing is fed twice;
   pods that disappeared while the controller was down are ended now;
2. else, the cumulative figures in the existing GPUWorkloadMetrics status become baselines
   that the new engine's figures are added to, and those workloads' pods are accounted
   only from the restart on (nothing is counted twice).
Existing CRs are also adopted (names, so writes go to the same objects), and orphaned ones
past retention are deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gpuwm.accounting import Engine
from gpuwm.accounting.persist import LazyEntries, saved_entries
from gpuwm.controller.kube import KubeApiError, KubeClient, resource_path
from gpuwm.controller.pull import DeviceHolder, index_holders
from gpuwm.controller.state.gctuning import release_free_memory
from gpuwm.controller.state.persistence import load_state
from gpuwm.controller.status import (
    API_VERSION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PROJECT_PLURAL,
    WORKLOAD_PLURAL,
    memo_from_json,
    memo_to_json,
    remembered,
)
from gpuwm.controller.watch import TrackedPod, parse_kubernetes_time
from gpuwm.model.compact import share_fields_set
from gpuwm.model.crd import Condition
from gpuwm.model.trace import TraceWorkload

if TYPE_CHECKING:
    from gpuwm.controller.runtime import ControllerRuntime

logger = logging.getLogger(__name__)

#: status fields that accumulate; they carry over a restart that lost the engine state
BASELINE_FIELDS = {
    "allocatedGpuSeconds": "allocated_gpu_seconds",
    "activeGpuSeconds": "active_gpu_seconds",
    "idleGpuSeconds": "idle_gpu_seconds",
    "unmonitoredGpuSeconds": "unmonitored_gpu_seconds",
    "energyJoules": "energy_joules",
    "runSeconds": "run_seconds",
}
ADDITIVE_FIELDS = frozenset(BASELINE_FIELDS.values())


def _pod_to_json(pod: TrackedPod) -> dict[str, Any]:
    return {
        "namespace": pod.namespace, "name": pod.name, "uid": pod.uid, "phase": pod.phase, "node": pod.node,
        "labels": pod.labels, "units": pod.units_by_container, "since": pod.phase_since, "created": pod.created,
        "workload": pod.workload.model_dump(by_alias=True),
    }


def _node_holders_to_json(item: tuple[str, list[DeviceHolder]]) -> dict[str, Any]:
    return {"node": item[0], "holders": [h.model_dump(exclude_none=True) for h in item[1]]}


def _saved_holders(saved: Any) -> Iterator[tuple[str, list[Any]]]:
    """(node, its holders) of a saved state: {"node", "holders"} entries (a list or a section), or {node: holders}
    as states saved before them hold; consumed as read, as the engine's lists are."""
    if isinstance(saved, dict):
        for node in list(saved):
            yield node, saved.pop(node)
        return
    for entry in saved_entries(saved, consume=True):
        yield entry["node"], entry["holders"]


def _pod_from_json(data: dict[str, Any]) -> TrackedPod:
    return TrackedPod(
        namespace=data["namespace"], name=data["name"], uid=data["uid"], phase=data["phase"], node=data.get("node"),
        labels=dict(data.get("labels") or {}), units_by_container=dict(data.get("units") or {}),
        workload=share_fields_set(TraceWorkload.model_validate(data["workload"])), phase_since=data.get("since"),
        created=data.get("created"),
    )


def snapshot_state(runtime: ControllerRuntime, now: float, lazy: bool = False, raw: bool = False) -> dict[str, Any]:
    """Everything a restarted controller needs to carry on exactly (JSON-serialisable).

    `lazy`: the engine's big lists are built as they are encoded (`persistence.encode_state_chunks`
    in batches), which must happen before the engine changes again. `raw`: its float columns are
    `RawDoubles`, which `persistence.encode_state_chunks` writes as bytes after the JSON (so must
    the state be encoded before the engine changes again).
    """
    return {
        "saved_at": now,
        "engine": runtime.engine.save(lazy, raw),
        "agents": runtime.puller.positions(),
        # a node's holders an entry (lazy: a section of the state file); states saved before were {node: holders}
        "holders": (LazyEntries(list(runtime.holders_by_node.items()), _node_holders_to_json) if lazy
                    else [_node_holders_to_json(item) for item in runtime.holders_by_node.items()]),
        "pods": (LazyEntries(list(runtime.pods.values()), _pod_to_json) if lazy
                 else [_pod_to_json(pod) for pod in runtime.pods.values()]),
        "sent": runtime.sent,
        "cr_names": runtime.cr_names,
        "conditions": {uid: [memo_to_json(memo) for memo in memos] for uid, memos in runtime.conditions.items()},
        "idle_announced": sorted(runtime.idle_events.announced),
        "latest_sample_time": runtime.latest_sample_time,
        "baselines": runtime.baselines,
        "cluster": runtime.client.cluster_identity,
    }


async def cluster_identity(client: KubeClient) -> str:
    """Which cluster this is: the API server's address and the UID of its kube-system namespace.

    A state file from another cluster (a default path reused by another test run, a copied
    volume) must not be restored: its workloads would get CRs here. The kube-system UID changes
    with every new etcd; the address tells emulators and clusters without it apart.
    """
    uid = ""
    try:
        found = await client.list_items(resource_path("v1", "namespaces"), {"fieldSelector": "metadata.name=kube-system"})
        uid = str((found[0].get("metadata") or {}).get("uid") or "") if found else ""
    except KubeApiError as error:
        logger.debug("cannot list namespace kube-system for the cluster identity: %s", error)
    return f"{client.server} {uid}".strip()


async def restore(runtime: ControllerRuntime) -> str:
    """Put the runtime back where the last controller stopped; returns which source was used."""
    existing = await _adopt_existing_crs(runtime)
    runtime.client.cluster_identity = await cluster_identity(runtime.client)
    state = load_state(runtime.state_path)
    if state is not None and state.get("cluster") != runtime.client.cluster_identity:
        saved_for = state.get("cluster")
        logger.warning("engine state %s %s; not restoring it (the CRs' status carries the totals over)",
                       runtime.state_path, f"was saved for another cluster ({saved_for}, this is "
                       f"{runtime.client.cluster_identity})" if saved_for else "does not say which cluster it is for")
        state = None
    if state is not None:
        try:
            _restore_state(runtime, state)
        except (KeyError, TypeError, ValueError, OSError) as error:  # OSError: a section read from the file now
            logger.warning("engine state %s unusable (%s); rebuilding from CR status", runtime.state_path, error)
            state = None
    if state is not None:
        await _end_vanished_pods(runtime)
        source = "state"
    else:
        _baselines_from_crs(runtime, existing)
        source = "crs" if runtime.baselines else "empty"
    _conditions_from_crs(runtime, existing)
    await _expire_orphans(runtime, existing)
    del existing, state
    release_free_memory()  # the loaded state and the listed CRs are garbage: their pages back before the first cycle
    logger.info("controller state restored from %s (%d workloads, %d pods)", source,
                len(runtime.engine.workloads(runtime.clock())), len(runtime.pods))
    return source


def _restore_state(runtime: ControllerRuntime, state: dict[str, Any]) -> None:
    """Everything read first, then put in place: a state that fails half way (a damaged section, read only
    now) leaves the runtime as it was, for the CRs' status to be the fallback."""
    # consumed: the engine reuses the loaded JSON's memory as it is restored (see persist.restore_state)
    engine = Engine.restore(state["engine"], runtime.engine_config, consume=True)
    # the loaded JSON's entries dropped as they are read, as the engine's: what is built reuses their memory
    # fields-sets shared, as with the engine's restored samples (see persist._restore)
    holders_by_node = {node: [share_fields_set(DeviceHolder.model_validate(h)) for h in holders]
                       for node, holders in _saved_holders(state.get("holders") or {})}
    pods = {pod.uid: pod for pod in map(_pod_from_json, saved_entries(state.get("pods") or [], consume=True))}
    sent = {str(k): str(v) for k, v in (state.get("sent") or {}).items()}
    cr_names = {str(k): str(v) for k, v in (state.get("cr_names") or {}).items()}
    # states saved before the memos hold whole conditions: their type, status and time are read alike
    conditions = {
        uid: tuple(memo_from_json(c) for c in conditions) for uid, conditions in (state.get("conditions") or {}).items()
    }
    announced = set(state.get("idle_announced") or [])
    baselines = {uid: dict(values) for uid, values in (state.get("baselines") or {}).items()}
    try:
        runtime.puller.restore_positions(state.get("agents") or {})
    except (TypeError, ValueError):
        runtime.puller.state.clear()  # none restored yet: the agents are read from their start
        raise
    runtime.engine = engine
    runtime.holders_by_node = holders_by_node
    runtime.holders_by_pod = index_holders(holders_by_node)
    runtime.pods = pods
    runtime.sent = sent
    runtime.cr_names.update(cr_names)
    runtime.conditions = conditions
    runtime.idle_events.announced = announced
    runtime.latest_sample_time = state.get("latest_sample_time")
    runtime.baselines = baselines


async def _end_vanished_pods(runtime: ControllerRuntime) -> None:
    """Pods deleted while the controller was down never produce a watch event: end them now."""
    namespace = runtime.settings.namespace
    pods = await runtime.client.list_items(resource_path("v1", "pods", namespace))
    alive = {str((pod.get("metadata") or {}).get("uid")) for pod in pods}
    for uid, pod in list(runtime.pods.items()):
        if uid not in alive:
            pod.phase = "Deleted"
            runtime._send(pod)
            runtime.pods.pop(uid, None)
            runtime.sent.pop(uid, None)


async def _adopt_project_crs(runtime: ControllerRuntime) -> None:
    """Project CRs this controller did not write yet: known, so they can be retired (see retire_projects)."""
    path = resource_path(API_VERSION, PROJECT_PLURAL)
    try:
        items = await runtime.client.list_items(path, {"labelSelector": f"{MANAGED_BY_LABEL}={MANAGED_BY}"})
    except KubeApiError as error:  # an older chart without `list` on them: they are simply not retired
        logger.warning("cannot list GPUProjectMetrics (%s); those of ended projects will not be deleted", error)
        return
    for item in items:
        metadata, status = item.get("metadata") or {}, item.get("status") or {}
        name = str(metadata.get("name") or "")
        if not name:
            continue
        key = (PROJECT_PLURAL, None, name)
        runtime.writer.existing.add(key)
        if isinstance(metadata.get("generation"), int):
            runtime.writer.generations[key] = metadata["generation"]
        updated = parse_kubernetes_time(status.get("lastUpdateTime")) or parse_kubernetes_time(
            metadata.get("creationTimestamp"))
        runtime.writer.adopted_project_updates[name] = updated if updated is not None else runtime.clock()


async def _adopt_existing_crs(runtime: ControllerRuntime) -> list[dict[str, Any]]:
    await _adopt_project_crs(runtime)
    path = resource_path(API_VERSION, WORKLOAD_PLURAL, runtime.settings.namespace)
    items = await runtime.client.list_items(path, {"labelSelector": f"{MANAGED_BY_LABEL}={MANAGED_BY}"})
    for item in items:
        metadata, spec = item.get("metadata") or {}, item.get("spec") or {}
        ref = spec.get("workloadRef") or {}
        uid, namespace, name = ref.get("uid"), metadata.get("namespace"), metadata.get("name")
        if not uid or not namespace or not name:
            continue
        runtime.writer.existing.add((WORKLOAD_PLURAL, str(namespace), str(name)))
        if isinstance(metadata.get("generation"), int):
            runtime.writer.generations[(WORKLOAD_PLURAL, str(namespace), str(name))] = metadata["generation"]
        runtime.cr_names[str(uid)] = str(name)
        runtime.cr_owner[(str(namespace), str(name))] = (str(uid), str(ref.get("kind")), None)
    return items


def _conditions_from_crs(runtime: ControllerRuntime, items: list[dict[str, Any]]) -> None:
    """The conditions last written win over the saved state's (saved up to a minute earlier).

    They keep their transition times across the restart, and a workload whose CR says Idle
    already had its GpuIdle Event for this idle spell: it is not posted a second time.
    """
    for item in items:
        uid = ((item.get("spec") or {}).get("workloadRef") or {}).get("uid")
        written = (item.get("status") or {}).get("conditions")
        if not uid or not isinstance(written, list):
            continue
        try:
            conditions = remembered([Condition.model_validate(condition) for condition in written])
        except ValueError:
            continue  # not ours to judge: the next write replaces them
        runtime.conditions[str(uid)] = conditions
        if any(condition.type == "Idle" and condition.status == "True" for condition in conditions):
            runtime.idle_events.announced.add(str(uid))


def _baselines_from_crs(runtime: ControllerRuntime, items: list[dict[str, Any]]) -> None:
    for item in items:
        status = item.get("status") or {}
        uid = ((item.get("spec") or {}).get("workloadRef") or {}).get("uid")
        values = {field: float(status[key]) for key, field in BASELINE_FIELDS.items()
                  if isinstance(status.get(key), int | float)}
        if uid and any(values.values()):
            started = parse_kubernetes_time(status.get("startTime"))
            if started is not None:
                values["start_time"] = started
            if isinstance(status.get("waitSeconds"), int | float):
                values["wait_seconds"] = float(status["waitSeconds"])
            counted_until = parse_kubernetes_time(status.get("lastUpdateTime"))
            if counted_until is not None:  # the CR's figures cover the time up to here
                values["counted_until"] = counted_until
            runtime.baselines[str(uid)] = values
    if runtime.baselines:
        runtime.baseline_cutoff = runtime.clock()


async def _expire_orphans(runtime: ControllerRuntime, items: list[dict[str, Any]]) -> None:
    """CRs whose workload the engine no longer knows and that ended longer than `retention` ago."""
    now = runtime.clock()
    known = {figures.uid for figures in runtime.engine.workloads(now)}
    for item in items:
        metadata, status = item.get("metadata") or {}, item.get("status") or {}
        uid = ((item.get("spec") or {}).get("workloadRef") or {}).get("uid")
        ended = parse_kubernetes_time(status.get("endTime"))
        if uid in known or ended is None or now - ended < runtime.settings.retention:
            continue
        await runtime.writer.delete(WORKLOAD_PLURAL, metadata.get("namespace"), str(metadata.get("name")))
        runtime.cr_names.pop(str(uid), None)
        logger.info("retention: deleted orphaned GPUWorkloadMetrics %s/%s", metadata.get("namespace"), metadata.get("name"))
