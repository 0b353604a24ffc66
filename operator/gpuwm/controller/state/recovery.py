"""Restart without losing GPU-seconds.

Before any new sample is taken the runtime is put back where it stopped:
1. the engine's saved state (`Engine.restore`), with the agents' `since` positions, the
   device attribution and what each pod's last engine event was, so nothing is fed twice;
   pods that disappeared while the controller was down are ended now;
2. else, the cumulative figures in the existing GPUWorkloadMetrics status become baselines
   that the new engine's figures are added to, and those workloads' pods are accounted
   only from the restart on (nothing is counted twice).
Existing CRs are also adopted (names, so writes go to the same objects), and orphaned ones
past retention are deleted. It works on a `ControllerState` and the runtime's parts it is handed
(client, writer, puller), never on the runtime: the runtime calls it, not the other way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwm.accounting import EngineConfig, parse_time
from gpuwm.controller.kube import KubeApiError, KubeClient, resource_path
from gpuwm.controller.pull import AgentPuller
from gpuwm.controller.state.gctuning import release_free_memory
from gpuwm.controller.state.model import ControllerState
from gpuwm.controller.state.persistence import load_state
from gpuwm.controller.status import (
    API_VERSION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PROJECT_PLURAL,
    WORKLOAD_PLURAL,
    CrOwner,
    StatusWriter,
    remembered,
)
from gpuwm.controller.watch import TrackedPod
from gpuwm.model import Condition, ProjectFigures, WorkloadFigures

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


@dataclass
class Restored:
    """What `restore` rebuilt: the state, where it came from, and the pods that went while the controller was down
    (the runtime ends them through its usual path to the engine)."""

    state: ControllerState
    source: str
    vanished: list[TrackedPod] = field(default_factory=list)


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


async def restore(blank: ControllerState, *, state_path: Path, config: EngineConfig, client: KubeClient,
                  writer: StatusWriter, puller: AgentPuller, namespace: str | None, retention_seconds: float,
                  clock: Callable[[], float]) -> Restored:
    """The state where the last controller stopped (from `blank`, a new runtime's empty one), and its source."""
    existing = await _adopt_existing_crs(blank, client, writer, namespace, clock)
    client.cluster_identity = await cluster_identity(client)
    saved = load_state(state_path)
    if saved is not None and saved.get("cluster") != client.cluster_identity:
        saved_for = saved.get("cluster")
        logger.warning("engine state %s %s; not restoring it (the CRs' status carries the totals over)",
                       state_path, f"was saved for another cluster ({saved_for}, this is "
                       f"{client.cluster_identity})" if saved_for else "does not say which cluster it is for")
        saved = None
    state = blank
    if saved is not None:
        try:
            state = restore_saved(saved, blank, puller, config)
        except (KeyError, TypeError, ValueError, OSError) as error:  # OSError: a section read from the file now
            logger.warning("engine state %s unusable (%s); rebuilding from CR status", state_path, error)
            saved = None
    vanished: list[TrackedPod] = []
    if saved is not None:
        vanished = await _vanished_pods(state, client, namespace)
        source = "state"
    else:
        _baselines_from_crs(state, existing, clock)
        source = "crs" if state.baselines else "empty"
    conditions_from_crs(state, existing)
    await _expire_orphans(state, existing, writer, retention_seconds, clock)
    del existing, saved
    release_free_memory()  # the loaded state and the listed CRs are garbage: their pages back before the first cycle
    return Restored(state, source, vanished)


def restore_saved(saved: dict[str, Any], adopted: ControllerState, puller: AgentPuller,
                  config: EngineConfig) -> ControllerState:
    """The saved state and the agents' positions, everything read first: a state that fails half way (a damaged
    section, read only now) raises with the puller as it was, for the CRs' status to be the fallback."""
    state = ControllerState.restore(saved, config, adopted)
    try:
        puller.restore_positions(saved.get("agents") or {})
    except (TypeError, ValueError):
        puller.state.clear()  # none restored yet: the agents are read from their start
        raise
    return state


async def _vanished_pods(state: ControllerState, client: KubeClient, namespace: str | None) -> list[TrackedPod]:
    """Pods deleted while the controller was down never produce a watch event: those to end now."""
    pods = await client.list_items(resource_path("v1", "pods", namespace))
    alive = {str((pod.get("metadata") or {}).get("uid")) for pod in pods}
    return [pod for uid, pod in state.pods.items() if uid not in alive]


async def _adopt_project_crs(client: KubeClient, writer: StatusWriter, clock: Callable[[], float]) -> None:
    """Project CRs this controller did not write yet: known, so they can be retired (see retire_projects)."""
    path = resource_path(API_VERSION, PROJECT_PLURAL)
    try:
        items = await client.list_items(path, {"labelSelector": f"{MANAGED_BY_LABEL}={MANAGED_BY}"})
    except KubeApiError as error:  # an older chart without `list` on them: they are simply not retired
        logger.warning("cannot list GPUProjectMetrics (%s); those of ended projects will not be deleted", error)
        return
    for item in items:
        metadata, status = item.get("metadata") or {}, item.get("status") or {}
        name = str(metadata.get("name") or "")
        if not name:
            continue
        key = (PROJECT_PLURAL, None, name)
        writer.existing.add(key)
        writer.remember_generation(key, item)
        updated = parse_time(status.get("lastUpdateTime")) or parse_time(
            metadata.get("creationTimestamp"))
        writer.adopted_project_updates[name] = updated if updated is not None else clock()


async def _adopt_existing_crs(state: ControllerState, client: KubeClient, writer: StatusWriter,
                              namespace: str | None, clock: Callable[[], float]) -> list[dict[str, Any]]:
    await _adopt_project_crs(client, writer, clock)
    path = resource_path(API_VERSION, WORKLOAD_PLURAL, namespace)
    items = await client.list_items(path, {"labelSelector": f"{MANAGED_BY_LABEL}={MANAGED_BY}"})
    for item in items:
        metadata, spec = item.get("metadata") or {}, item.get("spec") or {}
        ref = spec.get("workloadRef") or {}
        uid, cr_namespace, name = ref.get("uid"), metadata.get("namespace"), metadata.get("name")
        if not uid or not cr_namespace or not name:
            continue
        key = (WORKLOAD_PLURAL, str(cr_namespace), str(name))
        writer.existing.add(key)
        writer.remember_generation(key, item)
        state.cr_names[str(uid)] = str(name)
        state.cr_owner[(str(cr_namespace), str(name))] = CrOwner(str(uid), str(ref.get("kind")), None)
    return items


def conditions_from_crs(state: ControllerState, items: list[dict[str, Any]]) -> None:
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
        state.conditions[str(uid)] = conditions
        if any(condition.type == "Idle" and condition.status == "True" for condition in conditions):
            state.idle_announced.add(str(uid))


def _baselines_from_crs(state: ControllerState, items: list[dict[str, Any]], clock: Callable[[], float]) -> None:
    for item in items:
        status = item.get("status") or {}
        uid = ((item.get("spec") or {}).get("workloadRef") or {}).get("uid")
        values = {field: float(status[key]) for key, field in BASELINE_FIELDS.items()
                  if isinstance(status.get(key), int | float)}
        if uid and any(values.values()):
            started = parse_time(status.get("startTime"))
            if started is not None:
                values["start_time"] = started
            if isinstance(status.get("waitSeconds"), int | float):
                values["wait_seconds"] = float(status["waitSeconds"])
            counted_until = parse_time(status.get("lastUpdateTime"))
            if counted_until is not None:  # the CR's figures cover the time up to here
                values["counted_until"] = counted_until
            state.baselines[str(uid)] = values
    if state.baselines:
        state.baseline_cutoff = clock()


def with_baseline(figures: WorkloadFigures, baselines: dict[str, dict[str, float]]) -> WorkloadFigures:
    """`figures` plus what its CR said before a restart that lost the engine state (`baselines`)."""
    baseline = baselines.get(figures.uid)
    if not baseline:
        return figures
    update: dict[str, Any] = {name: getattr(figures, name) + value for name, value in baseline.items()
                              if name in ADDITIVE_FIELDS}
    if "start_time" in baseline:  # the allocation began before the restart, not at it
        update["start_time"] = min(baseline["start_time"], figures.start_time or baseline["start_time"])
    if "wait_seconds" in baseline:
        update["wait_seconds"] = baseline["wait_seconds"]
    return figures.model_copy(update=update)


def projects_with_baselines(projects: list[ProjectFigures], workloads: list[WorkloadFigures],
                            baselines: dict[str, dict[str, float]]) -> list[ProjectFigures]:
    """Each project's figures plus its workloads' `baselines` (see `with_baseline`); a project has no run time."""
    if not baselines:
        return projects
    extra: dict[str, dict[str, float]] = {}
    for figures in workloads:
        for name, value in baselines.get(figures.uid, {}).items():
            if name in ADDITIVE_FIELDS and name != "run_seconds":
                sums = extra.setdefault(figures.project, {})
                sums[name] = sums.get(name, 0.0) + value
    return [project.model_copy(update={name: getattr(project, name) + value
                                       for name, value in extra.get(project.name, {}).items()})
            for project in projects]


async def _expire_orphans(state: ControllerState, items: list[dict[str, Any]], writer: StatusWriter,
                          retention_seconds: float, clock: Callable[[], float]) -> None:
    """CRs whose workload the engine no longer knows and that ended longer than `retention` ago."""
    now = clock()
    known = {figures.uid for figures in state.engine.workloads(now)}
    for item in items:
        metadata, status = item.get("metadata") or {}, item.get("status") or {}
        uid = ((item.get("spec") or {}).get("workloadRef") or {}).get("uid")
        ended = parse_time(status.get("endTime"))
        if uid in known or ended is None or now - ended < retention_seconds:
            continue
        await writer.delete(WORKLOAD_PLURAL, metadata.get("namespace"), str(metadata.get("name")))
        state.cr_names.pop(str(uid), None)
        logger.info("retention: deleted orphaned GPUWorkloadMetrics %s/%s", metadata.get("namespace"), metadata.get("name"))
