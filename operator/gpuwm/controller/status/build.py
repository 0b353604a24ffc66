"""Pure builders: engine figures -> CR status, conditions, and whether a write is worth it.

Handlers stay thin: they hand figures to these functions and send the result. Tests call
them without a cluster.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Hashable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple, TypedDict, Unpack, get_args

from gpuwm.controller.status.idleness import (
    ConditionStatus,
    Seen,
    idle_condition,
    sample_recent,
    seen_now,
)
from gpuwm.model import (
    MAX_LISTED,
    Condition,
    ConditionType,
    GpuStatus,
    PodStatus,
    ProjectFigures,
    ProjectMetricsStatus,
    UtilizationWindows,
    Windows,
    WorkloadFigures,
    WorkloadMetricsStatus,
    WorkloadPhase,
    trusted,
)

_PHASES: frozenset[str] = frozenset(get_args(WorkloadPhase))
_DNS_INVALID = re.compile(r"[^a-z0-9.-]+")
_LABEL_INVALID = re.compile(r"[^A-Za-z0-9._-]+")

#: labels on every CR the controller writes, so it finds its own objects (and only those)
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpuwm"
WORKLOAD_UID_LABEL = "gpuwm.io/workload-uid"
WORKLOAD_KIND_LABEL = "gpuwm.io/workload-kind"
WORKLOAD_NAME_LABEL = "gpuwm.io/workload-name"
PROJECT_LABEL = "gpuwm.io/project"
#: the Kueue queues a workload waits in or was admitted to (`kubectl get gwm -l gpuwm.io/cluster-queue=...`)
LOCAL_QUEUE_LABEL = "gpuwm.io/local-queue"
CLUSTER_QUEUE_LABEL = "gpuwm.io/cluster-queue"

WriteReason = Literal["material", "due", "none"]


def rfc3339(epoch_seconds: float | None) -> str | None:
    """`2026-11-22T00:28:35Z` (whole seconds, UTC), or None."""
    return None if epoch_seconds is None else _rfc3339_second(round(epoch_seconds))


@functools.lru_cache(maxsize=4096)
def _rfc3339_second(second: int) -> str:
    # cached: a cycle's writes share `now`, and start/end times repeat on every write of a workload
    return datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _windows(windows: Windows) -> UtilizationWindows:
    return UtilizationWindows(
        current=_round(windows.current, 2),
        avg1m=_round(windows.avg1m, 2),
        avg5m=_round(windows.avg5m, 2),
        avg1h=_round(windows.avg1h, 2),
        lifetime=_round(windows.lifetime, 2),
    )


class ConditionMemo(NamedTuple):
    """What the next write needs of a condition written before: its status and since when it holds.

    The controller keeps one per condition of every workload between writes (and in its saved
    state): whole Conditions, their messages included, would cost several times the memory.
    """

    type: str
    status: str
    last_transition_time: str | None


def remembered(conditions: Sequence[Condition]) -> tuple[ConditionMemo, ...]:
    """The memos of conditions just written (see ConditionMemo)."""
    return tuple(ConditionMemo(c.type, c.status, c.last_transition_time) for c in conditions)


def memo_from_json(data: Mapping[str, Any]) -> ConditionMemo:
    """A memo from a saved one or a condition as written (`type`, `status`, `lastTransitionTime`); ValueError if not."""
    kind, status, since = data.get("type"), data.get("status"), data.get("lastTransitionTime")
    if kind not in get_args(ConditionType) or status not in ("True", "False", "Unknown"):
        raise ValueError(f"not a condition gpuwm writes: type {kind!r}, status {status!r}")
    if since is not None and not isinstance(since, str):
        raise ValueError(f"condition {kind}: lastTransitionTime {since!r} is not a time")
    return ConditionMemo(str(kind), str(status), since)


def memo_to_json(memo: ConditionMemo) -> dict[str, Any]:
    return {"type": memo.type, "status": memo.status, "lastTransitionTime": memo.last_transition_time}


def _condition(
    kind: Literal["Sampling", "Idle", "Underutilized"],
    status: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
    now: float,
    previous: Mapping[str, Condition | ConditionMemo],
) -> Condition:
    before = previous.get(kind)
    # the transition time moves only when the status does, as in every Kubernetes condition
    since = before.last_transition_time if before is not None and before.status == status else rfc3339(now)
    # every value is of its field's type already (literals, strings): no validation per write
    return trusted(Condition, {"type": kind, "status": status, "reason": reason, "message": message,
                               "last_transition_time": since})


def build_conditions(
    figures: WorkloadFigures,
    now: float,
    *,
    idle_condition_after_seconds: float = 600.0,
    underutilized_percent: float = 20.0,
    previous: Sequence[Condition | ConditionMemo] = (),
    observed_idle_seconds: float | None = None,
    reporting_slack_seconds: float = 0.0,
    seen: Seen | None = None,
) -> list[Condition]:
    """Sampling, Idle and Underutilized for one workload; `previous`: those written before (their transition times).

    `observed_idle_seconds`: see `idle_condition` (from `IdleWatch`); None: no idleness observed.
    `reporting_slack_seconds`: see `reporting`. `seen`: `seen_now`'s answer where the caller has it already.
    """
    before: dict[str, Condition | ConditionMemo] = {condition.type: condition for condition in previous}
    seen = seen or seen_now(figures, now, reporting_slack_seconds)  # what the samples show, for all three conditions
    idle_status, idle_reason = idle_condition(figures, observed_idle_seconds, idle_condition_after_seconds,
                                              now, reporting_slack_seconds, seen)
    idle_message = _idle_message(figures, idle_status, idle_reason, observed_idle_seconds,
                                 idle_condition_after_seconds, now, reporting_slack_seconds)
    return [
        _sampling_condition(figures, seen, now, reporting_slack_seconds, before),
        _condition("Idle", idle_status, idle_reason, idle_message, now, before),
        _underutilized_condition(figures, seen.holds_gpus, underutilized_percent, now, before),
    ]


def _unsampled(figures: WorkloadFigures, now: float, reporting_slack_seconds: float) -> list[str]:
    """The devices of `figures` without a recent sample."""
    return [gpu.uuid for gpu in figures.gpus if not sample_recent(gpu, now, reporting_slack_seconds)]


def _sampling_condition(figures: WorkloadFigures, seen: Seen, now: float, reporting_slack_seconds: float,
                        before: Mapping[str, Condition | ConditionMemo]) -> Condition:
    if not seen.holds_gpus:
        return _condition("Sampling", "Unknown", "NoGpusHeld", "the workload holds no GPUs now", now, before)
    if seen.reporting and figures.unattributed_gpu_seconds > 0:
        # the attribution rule's fallback (DESIGN §3): the figures hold, but a busy GPU's activity was taken from
        # the device because the agent saw none of the processes that explain it (no number here: it would change
        # the condition, and so force a write, every cycle)
        return _condition(
            "Sampling", "True", "DeviceFiguresUsed",
            "every device it holds has a recent sample; part of its utilisation came from the device, not its "
            "processes: the agent saw no process explaining a busy GPU (an agent without hostPID, MIG instances)",
            now, before,
        )
    if seen.reporting:
        return _condition("Sampling", "True", "DevicesSampled", "every device it holds has a recent sample", now, before)
    unmonitored = _unsampled(figures, now, reporting_slack_seconds)
    detail = f"no recent sample from {', '.join(unmonitored[:5])}" if unmonitored else "its devices are not known yet"
    return _condition("Sampling", "False", "SamplesMissing", detail, now, before)


def _idle_message(figures: WorkloadFigures, status: ConditionStatus, reason: str, observed_idle_seconds: float | None,
                  timeout_seconds: float, now: float, reporting_slack_seconds: float) -> str:
    """What the Idle condition of `status` and `reason` says of the idleness observed."""
    observed = f"{observed_idle_seconds or 0.0:.0f}s"
    if status == "True":
        return f"observed idle for {observed} (timeout {timeout_seconds:.0f}s)"
    if reason == "IdleBelowTimeout":
        if observed_idle_seconds is not None and figures.idle_seconds - observed_idle_seconds >= 1:
            return (f"observed idle for {observed} of the {timeout_seconds:.0f}s timeout "
                    f"(idle for {figures.idle_seconds:.0f}s, part of it before samples covered it)")
        return f"observed idle for {observed} of the {timeout_seconds:.0f}s timeout"
    if status == "Unknown":
        unmonitored = _unsampled(figures, now, reporting_slack_seconds)
        which = f" from {', '.join(unmonitored[:5])}" if unmonitored else ""
        if reason == "NotYetSampled":
            return f"no sample{which} yet: idleness is not observed"
        return f"no recent sample{which} (agent not reporting): idleness is not observed, observed idle for {observed} before"
    if reason == "Active":
        return "active in its latest sample"
    return f"phase {figures.phase}"


def _underutilized_condition(figures: WorkloadFigures, holds_gpus: bool, underutilized_percent: float, now: float,
                             before: Mapping[str, Condition | ConditionMemo]) -> Condition:
    average = figures.utilization.avg1h
    if not holds_gpus or average is None:
        return _condition("Underutilized", "Unknown", "NoData", "no monitored GPU time in the last hour", now, before)
    if average < underutilized_percent:
        return _condition("Underutilized", "True", "LowUtilization",
                          f"1h mean utilisation {average:.1f}% is below {underutilized_percent:.0f}%", now, before)
    return _condition("Underutilized", "False", "UtilizationOk", f"1h mean utilisation {average:.1f}%", now, before)


class ConditionInputs(TypedDict, total=False):
    """`build_conditions`' keywords besides the conditions written before (see there for each one's default)."""

    idle_condition_after_seconds: float
    underutilized_percent: float
    observed_idle_seconds: float | None
    reporting_slack_seconds: float


def build_workload_status(
    figures: WorkloadFigures,
    now: float,
    *,
    previous_conditions: Sequence[Condition | ConditionMemo] = (),
    **inputs: Unpack[ConditionInputs],
) -> WorkloadMetricsStatus:
    """The GPUWorkloadMetrics status for `figures` as of `now` (epoch seconds); `inputs`: its conditions'."""
    # what the samples show, for idleSince and the conditions alike
    seen = seen_now(figures, now, inputs.get("reporting_slack_seconds", 0.0))
    idle_since = seen.idle_since_second
    return WorkloadMetricsStatus(
        phase=figures.phase if figures.phase in _PHASES else None,
        requested_gpus=_round(figures.requested_gpus, 4),
        allocated_gpus=round(figures.allocated_gpus, 4),
        gpu_model=figures.gpu_model,
        nodes=sorted(figures.nodes),
        pods=[
            PodStatus(name=pod.name, uid=pod.uid, node=pod.node, phase=pod.phase, allocated_gpus=round(pod.allocated_gpus, 4))
            for pod in sorted(figures.pods, key=lambda pod: pod.name)[:MAX_LISTED]
        ],
        pod_count=len(figures.pods),
        gpu_count=len(figures.gpus),
        gpus=[
            GpuStatus(
                node=gpu.node, uuid=gpu.uuid, index=gpu.index, mig_profile=gpu.mig_profile, pod=gpu.pod or "",
                container=gpu.container, units=round(gpu.units, 4),
                utilization_percent=_round(gpu.utilization_percent, 2), memory_used_bytes=gpu.memory_used_bytes,
                memory_total_bytes=gpu.memory_total_bytes, power_watts=_round(gpu.power_watts, 2), healthy=gpu.healthy,
            )
            for gpu in sorted(figures.gpus, key=lambda gpu: (gpu.node, gpu.uuid))[:MAX_LISTED]
        ],
        utilization=_windows(figures.utilization),
        memory_utilization=_windows(figures.memory_utilization),
        idle_seconds=round(figures.idle_seconds, 3),
        idle_since=None if idle_since is None else _rfc3339_second(idle_since),
        last_active_time=rfc3339(figures.last_active_time),
        **_gpu_time(figures),
        queued_seconds=round(figures.queued_seconds, 3),
        wait_seconds=round(figures.wait_seconds, 3),
        run_seconds=round(figures.run_seconds, 3),
        start_time=rfc3339(figures.start_time),
        end_time=rfc3339(figures.end_time),
        conditions=build_conditions(figures, now, previous=previous_conditions, seen=seen, **inputs),
        last_update_time=rfc3339(now),
    )


class _GpuTime(TypedDict):
    allocated_gpu_seconds: float
    active_gpu_seconds: float
    idle_gpu_seconds: float
    unmonitored_gpu_seconds: float
    wasted_gpu_hours: float
    energy_joules: float


def _gpu_time(figures: WorkloadFigures | ProjectFigures) -> _GpuTime:
    """The GPU-seconds and energy both kinds of CR carry, to the millisecond, and the idle ones as wasted hours."""
    return _GpuTime(
        allocated_gpu_seconds=round(figures.allocated_gpu_seconds, 3),
        active_gpu_seconds=round(figures.active_gpu_seconds, 3),
        idle_gpu_seconds=round(figures.idle_gpu_seconds, 3),
        unmonitored_gpu_seconds=round(figures.unmonitored_gpu_seconds, 3),
        wasted_gpu_hours=round(figures.idle_gpu_seconds / 3600.0, 4),
        energy_joules=round(figures.energy_joules, 3),
    )


def build_project_status(figures: ProjectFigures, now: float) -> ProjectMetricsStatus:
    """The GPUProjectMetrics status for `figures` as of `now`."""
    return ProjectMetricsStatus(
        workloads=figures.workloads,
        running_workloads=figures.running_workloads,
        namespaces=sorted(figures.namespaces),
        allocated_gpus=round(figures.allocated_gpus, 4),
        quota=figures.quota,
        requested_gpus=round(figures.requested_gpus, 4),
        queued_workloads=figures.queued_workloads,
        longest_queued_seconds=round(figures.longest_queued_seconds, 3),
        idle_gpus=round(figures.idle_gpus, 4),
        utilization=_windows(figures.utilization),
        memory_utilization=_windows(figures.memory_utilization),
        **_gpu_time(figures),
        last_update_time=rfc3339(now),
    )


def workload_signature(
    figures: WorkloadFigures,
    now: float,
    *,
    idle_condition_after_seconds: float = 600.0,
    underutilized_percent: float = 20.0,
    observed_idle_seconds: float | None = None,
    reporting_slack_seconds: float = 0.0,
    idle: tuple[ConditionStatus, str] | None = None,
    seen: Seen | None = None,
) -> tuple[Any, ...]:
    """What a reader acts on: phase, GPUs held, pods and devices, active or idle since when, each condition's
    status and reason. A change is news: the writer sends it before any refresh of counters.

    `idle`, `seen`: the Idle condition's (status, reason) and `seen_now`'s answer where the caller has them
    already (the status cycle computes both once per workload); else computed here."""
    seen = seen or seen_now(figures, now, reporting_slack_seconds)
    running = seen.holds_gpus
    average = figures.utilization.avg1h
    underutilized = "Unknown" if not running or average is None else str(average < underutilized_percent)
    return (
        figures.phase, round(figures.allocated_gpus, 4), figures.gpu_model, tuple(sorted(figures.nodes)),
        None if figures.requested_gpus is None else round(figures.requested_gpus, 4),
        figures.local_queue, figures.cluster_queue,
        tuple(sorted((pod.name, pod.phase, round(pod.allocated_gpus, 4)) for pod in figures.pods)),
        tuple(sorted((gpu.uuid, gpu.pod, gpu.healthy) for gpu in figures.gpus)),
        figures.start_time is not None, figures.end_time is not None,
        running and seen.reporting,
        seen.idle_since_second,
        idle if idle is not None else idle_condition(figures, observed_idle_seconds, idle_condition_after_seconds, now,
                                                     reporting_slack_seconds, seen),
        underutilized,
    )


def workload_counters(figures: WorkloadFigures) -> tuple[float, ...]:
    """The figures that move with time; all equal means a refresh would say nothing new."""
    return (round(figures.allocated_gpu_seconds, 3), round(figures.unmonitored_gpu_seconds, 3),
            round(figures.idle_gpu_seconds, 3), round(figures.idle_seconds, 3), round(figures.energy_joules, 3),
            round(figures.queued_seconds, 3), round(figures.wait_seconds, 3), *_rounded_windows(figures.utilization))


def project_signature(figures: ProjectFigures) -> tuple[Any, ...]:
    return (figures.workloads, figures.running_workloads, tuple(sorted(figures.namespaces)),
            round(figures.allocated_gpus, 4), round(figures.idle_gpus, 4), figures.quota,
            round(figures.requested_gpus, 4), figures.queued_workloads)


def project_counters(figures: ProjectFigures) -> tuple[float, ...]:
    return (round(figures.allocated_gpu_seconds, 3), round(figures.idle_gpu_seconds, 3),
            round(figures.unmonitored_gpu_seconds, 3), round(figures.energy_joules, 3),
            round(figures.longest_queued_seconds, 3), *_rounded_windows(figures.utilization))


def _rounded_windows(windows: Windows) -> tuple[float, ...]:
    """Each window (in field order) to 0.01 %, -1 for none."""
    return tuple(-1.0 if value is None else round(value, 2)
                 for value in (windows.current, windows.avg1m, windows.avg5m, windows.avg1h, windows.lifetime))


def write_reason(
    previous: tuple[Hashable, Hashable, float] | None,
    signature: Hashable,
    counters: Hashable,
    *,
    now: float,
    interval_seconds: float,
) -> WriteReason:
    """Why to write, given what was last written (signature, counters, time): news, a due refresh, or not at all.

    Signatures and counters are only compared for equality: the tuples `workload_signature` and the
    others build, or their hashes (what the controller keeps; see `StatusOffers.offer_workloads`).
    """
    if previous is None:
        return "material"
    signature_written, counters_written, written_at = previous
    if signature_written != signature:
        return "material"
    if counters_written == counters or now - written_at < interval_seconds:
        return "none"
    return "due"


def dns_name(text: str, max_length: int = 253) -> str:
    """A DNS-1123 subdomain for `text`; a short hash keeps different inputs apart when characters were changed."""
    cleaned = _DNS_INVALID.sub("-", text.lower()).strip("-.") or "x"
    if cleaned == text and len(cleaned) <= max_length:
        return cleaned
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{cleaned[: max_length - 9].rstrip('-.')}-{digest}"


def label_value(text: str) -> str:
    """A valid label value (<= 63 characters of [A-Za-z0-9._-], alphanumeric at both ends)."""
    cleaned = _LABEL_INVALID.sub("-", text).strip("-._")
    if cleaned == text and len(cleaned) <= 63:
        return cleaned
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{cleaned[:54].strip('-._')}-{digest}".strip("-._")


def workload_cr_name(name: str, kind: str, clash: bool) -> str:
    """Same name as the workload; `<name>-<kind>` when another kind already took the name."""
    return dns_name(f"{name}-{kind.lower()}") if clash else dns_name(name)


class CrOwner(NamedTuple):
    """The workload a GPUWorkloadMetrics name belongs to."""

    uid: str
    kind: str
    created_time: float | None


def claim_cr_name(figures: WorkloadFigures, cr_names: dict[str, str],
                  cr_owner: dict[tuple[str, str], CrOwner]) -> str | None:
    """The GPUWorkloadMetrics name of a workload; None when a newer workload of the same kind took it.

    Same namespace and name as the workload; `<name>-<kind>` when a workload of another kind
    has the name. A workload recreated with the same kind and name takes the name over.
    `cr_names` (workload uid -> name, "" for none) and `cr_owner` ((namespace, name) -> its
    workload) remember each claim.
    """
    if figures.uid in cr_names:
        return cr_names[figures.uid] or None
    name = workload_cr_name(figures.name, figures.kind, False)
    holder = cr_owner.get((figures.namespace, name))
    if holder is not None and holder.uid != figures.uid:
        if holder.kind != figures.kind:
            name = workload_cr_name(figures.name, figures.kind, True)
        elif (holder.created_time or 0.0) > (figures.created_time or 0.0):
            cr_names[figures.uid] = ""  # an older incarnation: its CR is the newer one's now
            return None
        else:
            cr_names[holder.uid] = ""
    cr_names[figures.uid] = name
    cr_owner[(figures.namespace, name)] = CrOwner(figures.uid, figures.kind, figures.created_time)
    return name


def workload_labels(figures: WorkloadFigures) -> dict[str, str]:
    """Labels linking a GPUWorkloadMetrics to its workload, project and Kueue queues (selectable with kubectl -l)."""
    labels = {
        MANAGED_BY_LABEL: MANAGED_BY,
        WORKLOAD_UID_LABEL: label_value(figures.uid),
        WORKLOAD_KIND_LABEL: label_value(figures.kind),
        WORKLOAD_NAME_LABEL: label_value(figures.name),
        PROJECT_LABEL: label_value(figures.project),
    }
    if figures.local_queue:
        labels[LOCAL_QUEUE_LABEL] = label_value(figures.local_queue)
    if figures.cluster_queue:
        labels[CLUSTER_QUEUE_LABEL] = label_value(figures.cluster_queue)
    return labels
