"""What gpuwm reads from each kind of workload object: pure functions, one table.

A workload object (a Job, PyTorchJob, JobSet, RayJob ...) says, before any of its pods exists,
how many GPU units it will ask for (replicas x its pod templates' GPU requests), whether it is
held back (`spec.suspend`, Kubeflow's `spec.runPolicy.suspend`) and whether it has finished.
Each kind's reading is one entry of `READERS`; tests call them on plain dicts, no cluster.

A Kueue Workload is not a workload of its own: it is the queue state (admitted or not, its
LocalQueue and ClusterQueue) of the object its controller ownerReference names (`KueueState`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpuwm.controller.watch.owners import controller_reference
from gpuwm.controller.watch.pods import FAILURE_REASON_MAX_CHARS
from gpuwm.controller.watch.units import requested_units

Finished = Literal["Succeeded", "Failed"] | None
#: (pods, pod spec) per template: a template's GPU request counts once per pod it makes
Templates = list[tuple[float, Mapping[str, Any]]]

_VERSION = re.compile(r"^v[0-9]+(?:(?:alpha|beta)[0-9]+)?$")
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_WORKLOAD_KIND = "Workload"
#: the label Kueue reads a workload's LocalQueue from (where no Kueue Workload names it yet)
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@dataclass(frozen=True)
class WorkloadKind:
    """One configured kind: `group` "" for the core group, `version` None for the served preferred one."""

    group: str
    version: str | None
    kind: str

    @property
    def text(self) -> str:
        return "/".join(part for part in (self.group, self.version, self.kind) if part)

    @property
    def plural(self) -> str:
        """The resource name Kubernetes gives a kind by default (`PyTorchJob` -> `pytorchjobs`): for RBAC."""
        return plural_of(self.kind)


def plural_of(kind: str) -> str:
    """The default plural of a kind's lower-case name, as the CRD generators write it."""
    lower = kind.lower()
    if lower.endswith(("s", "x", "ch", "sh")):
        return lower + "es"
    if lower.endswith("y") and lower[-2:-1] not in ("a", "e", "i", "o", "u"):
        return lower[:-1] + "ies"
    return lower + "s"


def parse_workload_kind(text: str) -> WorkloadKind:
    """`batch/v1/Job`, `kubeflow.org/PyTorchJob` (preferred version) or `v1/Pod` (core group).

    Raises ValueError naming the entry and the forms it may take.
    """
    parts = text.strip().split("/")
    problem = ValueError(f"workload kind {text!r} is not GROUP/VERSION/Kind, GROUP/Kind or VERSION/Kind "
                         "(e.g. batch/v1/Job, kubeflow.org/PyTorchJob)")
    version: str | None
    if len(parts) == 3 and all(parts) and _VERSION.match(parts[1]):
        group, version, kind = parts
    elif len(parts) == 2 and all(parts):
        group, version, kind = ("", parts[0], parts[1]) if _VERSION.match(parts[0]) else (parts[0], None, parts[1])
    else:
        raise problem
    if not kind[:1].isupper():
        raise problem
    return WorkloadKind(group, version, kind)


def parse_workload_kinds(texts: Iterable[str]) -> list[WorkloadKind]:
    """Every configured kind, in order, each once."""
    return list(dict.fromkeys(parse_workload_kind(text) for text in texts))


# ---------------------------------------------------------------------------------------------- small readers


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _count(value: Any, default: float = 1.0) -> float:
    """A replica count: absent (or not a number) is the API's default; never below 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return max(0.0, float(value))


def _pod_spec(template: Any) -> Mapping[str, Any]:
    """`template.spec` of a PodTemplateSpec."""
    return _mapping(_mapping(template).get("spec"))


def _conditions(obj: Mapping[str, Any]) -> dict[str, str]:
    """type -> status of `status.conditions`."""
    return {str(condition["type"]): str(condition.get("status"))
            for condition in _mapping(obj.get("status")).get("conditions") or []
            if isinstance(condition, Mapping) and condition.get("type")}


def failure_message(obj: Mapping[str, Any]) -> str | None:
    """Why the object says it failed: its True `Failed` condition's reason and message (Job, JobSet,
    Kubeflow jobs), else a failed RayJob's `status.message`; None where it has not failed or says nothing.

    A Job's condition names what no pod can (BackoffLimitExceeded, DeadlineExceeded, a failure policy's
    rule), so the API prefers it to a failed pod's reason."""
    status = _mapping(obj.get("status"))
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Failed" and condition.get("status") == "True":
            words = [str(condition[key]).strip() for key in ("reason", "message") if condition.get(key)]
            return ": ".join(words)[:FAILURE_REASON_MAX_CHARS] if words else None
    if str(status.get("jobStatus") or "") in ("FAILED", "STOPPED") and status.get("message"):
        return str(status["message"]).strip()[:FAILURE_REASON_MAX_CHARS]
    return None


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(obj.get("spec"))


def _suspend(obj: Mapping[str, Any]) -> bool:
    return _spec(obj).get("suspend") is True


def _never(_obj: Mapping[str, Any]) -> Any:
    return None


def _not_suspended(_obj: Mapping[str, Any]) -> bool:
    return False


# ---------------------------------------------------------------------------------------------- each kind


def _job_pods(job_spec: Mapping[str, Any]) -> float:
    """Pods a Job runs at once: `parallelism` (default 1), at most `completions` where set."""
    pods = _count(job_spec.get("parallelism"))
    completions = job_spec.get("completions")
    if isinstance(completions, int) and not isinstance(completions, bool):
        pods = min(pods, max(0.0, float(completions)))
    return pods


def job_templates(obj: Mapping[str, Any]) -> Templates:
    spec = _spec(obj)
    return [(_job_pods(spec), _pod_spec(spec.get("template")))]


def cronjob_templates(obj: Mapping[str, Any]) -> Templates:
    """The Job its `spec.jobTemplate` makes."""
    return job_templates(_mapping(_spec(obj).get("jobTemplate")))


def jobset_templates(obj: Mapping[str, Any]) -> Templates:
    """Σ replicatedJobs[]: replicas (default 1) x the Job's parallelism x its pod template."""
    templates: Templates = []
    for replicated in _spec(obj).get("replicatedJobs") or []:
        job_spec = _mapping(_mapping(_mapping(replicated).get("template")).get("spec"))
        templates.append((_count(_mapping(replicated).get("replicas")) * _job_pods(job_spec),
                          _pod_spec(job_spec.get("template"))))
    return templates


def kubeflow_templates(obj: Mapping[str, Any]) -> Templates:
    """Σ over `spec.<framework>ReplicaSpecs` (pytorchReplicaSpecs, tfReplicaSpecs, mpiReplicaSpecs,
    xgbReplicaSpecs, paddleReplicaSpecs): each replica type's replicas (default 1) x its template."""
    templates: Templates = []
    for key, replica_specs in _spec(obj).items():
        if not key.endswith("ReplicaSpecs") or not isinstance(replica_specs, Mapping):
            continue
        for replica in replica_specs.values():
            replica = _mapping(replica)
            templates.append((_count(replica.get("replicas")), _pod_spec(replica.get("template"))))
    return templates


def kubeflow_suspended(obj: Mapping[str, Any]) -> bool:
    return _mapping(_spec(obj).get("runPolicy")).get("suspend") is True


def trainjob_templates(obj: Mapping[str, Any]) -> Templates:
    """`spec.trainer.numNodes` (default 1) nodes, each with `spec.trainer.resourcesPerNode`."""
    trainer = _mapping(_spec(obj).get("trainer"))
    resources = _mapping(trainer.get("resourcesPerNode"))
    return [(_count(trainer.get("numNodes")), {"containers": [{"name": "node", "resources": resources}]})]


def _ray_cluster_templates(cluster_spec: Mapping[str, Any]) -> Templates:
    """The head (one pod) plus Σ workerGroupSpecs[]: replicas (default minReplicas, else 1) x numOfHosts x template."""
    templates: Templates = [(1.0, _pod_spec(_mapping(cluster_spec.get("headGroupSpec")).get("template")))]
    for group in cluster_spec.get("workerGroupSpecs") or []:
        group = _mapping(group)
        replicas = _count(group.get("replicas"), _count(group.get("minReplicas")))
        templates.append((replicas * _count(group.get("numOfHosts")), _pod_spec(group.get("template"))))
    return templates


def raycluster_templates(obj: Mapping[str, Any]) -> Templates:
    return _ray_cluster_templates(_spec(obj))


def rayjob_templates(obj: Mapping[str, Any]) -> Templates:
    return _ray_cluster_templates(_mapping(_spec(obj).get("rayClusterSpec")))


def rayjob_finished(obj: Mapping[str, Any]) -> Finished:
    """`status.jobStatus`: SUCCEEDED, or FAILED / STOPPED."""
    state = str(_mapping(obj.get("status")).get("jobStatus") or "")
    return "Succeeded" if state == "SUCCEEDED" else "Failed" if state in ("FAILED", "STOPPED") else None


def replicated_templates(obj: Mapping[str, Any]) -> Templates:
    """Deployment and StatefulSet: `spec.replicas` (default 1) x `spec.template`."""
    spec = _spec(obj)
    return [(_count(spec.get("replicas")), _pod_spec(spec.get("template")))]


def lws_templates(obj: Mapping[str, Any]) -> Templates:
    """`spec.replicas` groups of `leaderWorkerTemplate.size` pods: the leader's template (else the worker's) for
    one pod of each group, the worker's for the other size - 1."""
    spec = _spec(obj)
    groups = _count(spec.get("replicas"))
    template = _mapping(spec.get("leaderWorkerTemplate"))
    size = _count(template.get("size"))
    worker = _pod_spec(template.get("workerTemplate"))
    leader = _pod_spec(template.get("leaderTemplate")) if template.get("leaderTemplate") else worker
    return [(groups * min(size, 1.0), leader), (groups * max(size - 1.0, 0.0), worker)]


def inferenceservice_templates(obj: Mapping[str, Any]) -> Templates:
    """`spec.predictor.minReplicas` (default 1) x the predictor's containers: its `containers` and its model or
    framework section (`model`, `pytorch`, `triton` ...: any mapping with `resources`)."""
    predictor = _mapping(_spec(obj).get("predictor"))
    containers = [c for c in predictor.get("containers") or [] if isinstance(c, Mapping)]
    containers += [{"name": key, **value} for key, value in predictor.items()
                   if key != "containers" and isinstance(value, Mapping) and isinstance(value.get("resources"), Mapping)]
    return [(_count(predictor.get("minReplicas")), {"containers": containers})]


@dataclass(frozen=True)
class KindReader:
    """How one kind says what it asks for, whether it is held back, and whether it has finished."""

    templates: Callable[[Mapping[str, Any]], Templates]
    suspended: Callable[[Mapping[str, Any]], bool] = _not_suspended
    finished: Callable[[Mapping[str, Any]], Finished] = _never


def _conditions_reader(succeeded: Sequence[str], failed: Sequence[str]) -> Callable[[Mapping[str, Any]], Finished]:
    """Finished when one of the `failed` conditions is True (that first), else one of the `succeeded`."""

    def finished(obj: Mapping[str, Any]) -> Finished:
        conditions = _conditions(obj)
        if any(conditions.get(name) == "True" for name in failed):
            return "Failed"
        if any(conditions.get(name) == "True" for name in succeeded):
            return "Succeeded"
        return None

    return finished


_KUBEFLOW = KindReader(kubeflow_templates, kubeflow_suspended, _conditions_reader(("Succeeded",), ("Failed",)))

#: kind -> its reader; a configured kind missing here is read as a plain `spec.template` with `spec.replicas`
READERS: dict[str, KindReader] = {
    "Job": KindReader(job_templates, _suspend, _conditions_reader(("Complete",), ("Failed",))),
    "CronJob": KindReader(cronjob_templates, _suspend),
    "JobSet": KindReader(jobset_templates, _suspend, _conditions_reader(("Completed", "Succeeded"), ("Failed",))),
    "PyTorchJob": _KUBEFLOW,
    "TFJob": _KUBEFLOW,
    "MPIJob": _KUBEFLOW,
    "XGBoostJob": _KUBEFLOW,
    "PaddleJob": _KUBEFLOW,
    "TrainJob": KindReader(trainjob_templates, _suspend, _conditions_reader(("Complete", "Succeeded"), ("Failed",))),
    "RayJob": KindReader(rayjob_templates, _suspend, rayjob_finished),
    "RayCluster": KindReader(raycluster_templates, _suspend),
    "Deployment": KindReader(replicated_templates),
    "StatefulSet": KindReader(replicated_templates),
    "LeaderWorkerSet": KindReader(lws_templates),
    "InferenceService": KindReader(inferenceservice_templates),
}
_GENERIC = KindReader(replicated_templates, _suspend)


def reader_of(kind: str) -> KindReader:
    return READERS.get(kind, _GENERIC)


def requested_gpus(obj: Mapping[str, Any], kind: str, resource_patterns: Iterable[str], shared_replicas: int = 4) -> float:
    """GPU units the object's pod templates ask for in all: Σ pods x per-pod units (MIG and shared names included).

    A shared name (`nvidia.com/gpu.shared`) counts 1/`shared_replicas`: which node a pod lands on, and so
    its real sharing, is not known before it is scheduled. Raises ValueError for a quantity that is not a number.
    """
    patterns = list(resource_patterns)
    return sum((pods * sum(requested_units(pod_spec, patterns, 1, shared_replicas).values())
                for pods, pod_spec in reader_of(kind).templates(obj) if pods > 0 and pod_spec), 0.0)


def asks_for_gpus(obj: Mapping[str, Any], kind: str, resource_patterns: Iterable[str]) -> bool:
    """Whether any pod template of the object requests a GPU resource (whatever its replica count now: a
    Deployment scaled to zero is still a GPU workload)."""
    patterns = list(resource_patterns)
    for _pods, pod_spec in reader_of(kind).templates(obj):
        try:
            if pod_spec and requested_units(pod_spec, patterns, 1, 4):
                return True
        except ValueError:
            return True  # malformed, but a GPU workload: reading its request names the fault
    return False


def is_top_level(obj: Mapping[str, Any]) -> bool:
    """No owner the pods' walk would go on to (a CronJob's Job, a RayJob's RayCluster are not workloads)."""
    return controller_reference(_mapping(obj.get("metadata"))) is None


# ---------------------------------------------------------------------------------------------- Kueue


@dataclass(frozen=True)
class KueueState:
    """A Kueue Workload read as the queue state of the object it belongs to."""

    owner_uid: str
    admitted: bool
    local_queue: str | None
    cluster_queue: str | None


def kueue_state(obj: Mapping[str, Any]) -> KueueState | None:
    """Admitted (condition Admitted, else `status.admission` set), `spec.queueName` and
    `status.admission.clusterQueue`, for the owner its controller ownerReference names; None without an owner."""
    owner = controller_reference(_mapping(obj.get("metadata")))
    if owner is None:
        return None
    status = _mapping(obj.get("status"))
    admission = _mapping(status.get("admission"))
    conditions = _conditions(obj)
    admitted = conditions["Admitted"] == "True" if "Admitted" in conditions else bool(admission)
    if conditions.get("Evicted") == "True" and not admission:
        admitted = False
    queue = _spec(obj).get("queueName")
    cluster_queue = admission.get("clusterQueue")
    return KueueState(str(owner["uid"]), admitted, str(queue) if queue else None,
                      str(cluster_queue) if cluster_queue else None)
